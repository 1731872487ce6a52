"""podium C++ layer base"""

import enum


class CoreError(RuntimeError):
    """
    An error of podium's C++ core: `subsystem` and `code` identify it, `message` says who failed and why.
    """

COPY_THRESHOLD: int = 32768

class Subsystem(enum.IntEnum):
    BASE = 0

    NDSLICE = 1

    WIRE = 2

    CHANNEL = 3

    ACTOR = 4

    MESH = 5

    HOST = 6

    SUPERVISION = 7

    DATA = 8

class BaseErrc(enum.Enum):
    OK = 0

    INVALID_ARGUMENT = 1

    IO = 2

    TIMEOUT = 3

    CANCELLED = 4

    INTERNAL = 5

    UNSUPPORTED = 6

class NdsliceErrc(enum.Enum):
    DUPLICATE_LABEL = 100

    UNKNOWN_LABEL = 101

    OUT_OF_RANGE = 102

    BAD_STEP = 103

    BAD_SHAPE = 104

    BAD_LAYOUT = 105

    NOT_FLATTENABLE = 106

    MALFORMED = 107

class WireErrc(enum.Enum):
    BAD_MAGIC = 100

    BAD_VERSION = 101

    BAD_KIND = 102

    BAD_FLAGS = 103

    TOO_MANY_PARTS = 104

    FRAME_TOO_LARGE = 105

    MALFORMED_HEADER = 106

    HEADER_TOO_LARGE = 107

    CONTROL_FRAME_PARTS = 108

class ChannelErrc(enum.Enum):
    BAD_ADDRESS = 100

    LISTEN_FAILED = 101

    CONNECT_FAILED = 102

    DELIVERY_TIMEOUT = 103

    CANCELLED = 104

    FRAME_TOO_LARGE = 105

    MALFORMED_FRAME = 106

    PROTOCOL = 107

    AUTH_FAILED = 108

    TLS_FAILED = 109

class ActorErrc(enum.Enum):
    BAD_ID = 100

    NO_SUCH_ACTOR = 101

    NO_SUCH_PORT = 102

    NO_SUCH_ENDPOINT = 103

    BAD_ARGUMENTS = 104

    HANDLER_FAILED = 105

    UNKNOWN_ACTOR_TYPE = 106

    DUPLICATE_ACTOR = 107

    ACTOR_STOPPED = 108

    ACTOR_FAILED = 109

    PROC_STOPPED = 110

    TIMEOUT = 111

    UNDELIVERABLE = 112

    PROC_EXITED = 113

class HostErrc(enum.Enum):
    INVALID_SPEC = 100

    SPAWN_FAILED = 101

    EXEC_FAILED = 102

    NO_SUCH_CHILD = 103

    NO_PROCESS_GROUP = 104

    SIGNAL_FAILED = 105

    STOPPED = 106

    NOT_READY = 107

    SURVIVED = 108

class MeshErrc(enum.Enum):
    HOST_LOST = 100

    HOST_REFUSED = 101

    PROTOCOL = 102

    SHUT_DOWN = 103

    SPAWN_FAILED = 104

class DataErrc(enum.Enum):
    UNAVAILABLE = 100

    INVALID_ARGUMENT = 101

    TIMEOUT = 102

    DROPPED = 103

    REFUSED = 104

    TRANSFER_FAILED = 105

    STOPPED = 106

ERRC: dict = ...

def set_error_translator(fn: object) -> None:
    """
    Installs fn(subsystem, code, message) -> exception: the exception every binding raises for a C++ Error (podium._src.errors.from_core installs itself on import).
    """

class PartBuffer:
    """
    A buffer over one message part (no copy); writable when it alone holds received memory.
    """

    def __len__(self) -> int: ...

def as_part(arg: object, /) -> object:
    """
    The message part podium would send for the buffer `obj` (copied when small, shared when large).
    """

def edit_distance_below(a: str, b: str, limit: int) -> int | None:
    """
    The Levenshtein distance of a and b, in code points, if it is below limit; else None (ED-1). The log aggregator's similarity test (podium._src.log_aggregate).
    """

def release_deferred() -> None:
    """
    Releases the Python buffers of message parts that the core no longer needs.
    """

def deferred_count() -> int: ...
