"""podium C++ layer base"""



class CoreError(RuntimeError):
    """
    An error of podium's C++ core: `subsystem` and `code` identify it, `message` says who failed and why.
    """

COPY_THRESHOLD: int = 32768

class PartBuffer:
    """A read-only buffer over one message part (no copy)."""

    def __len__(self) -> int: ...

def as_part(arg: object, /) -> object:
    """
    The message part podium would send for the buffer `obj` (copied when small, shared when large).
    """

def release_deferred() -> None:
    """
    Releases the Python buffers of message parts that the core no longer needs.
    """

def deferred_count() -> int: ...
