"""Exceptions of podium.actor, and the one table that turns C++ errors into them.

``TABLE`` maps every code of every C++ error enum (exported by ``podium._core.base``, read
from the C++ enums themselves) to the Python exception class it raises. Both paths use it: a
binding that fails synchronously raises ``from_core(...)`` (installed into ``_core`` below),
and a reply that carries an error is turned into ``from_core(...)`` by the caller
(actor_mesh.py, ports.py). tests/python/test_errors.py checks that every enumerator has a
row. Adding a C++ error enum is one ``bind_errc`` line in python/bindings/base.cc and one
block of rows here.

Texts start with Monarch's words, so that code matching Monarch's messages matches podium's;
podium's details (actor, rank, host, pid, cause) follow (docs/errors.md has the table):

  MW-1 A SupervisionError from an actor call reads "Endpoint call <mesh>.<endpoint>() failed, "
    then the located message, which opens with "The actor <mesh>{<point>} and all its
    descendants have failed" (the actor failed, its proc ended), "actor mesh is stopped due
    to proc mesh shutdown" (its ProcMesh was stopped) or "Actor <id> exited because of the
    following reason: stopped" (its ActorMesh was stopped), then the actor's place and cause.
  MW-2 Other texts and classes as Monarch's: an actor whose __init__ raised fails its calls
    and ``initialized`` with ActorInitError, both an ActorError (as Monarch raises) and a
    SupervisionError, its text carrying the exception; a spawn on a stopped ProcMesh raises SupervisionError
    (a RuntimeError) "`ProcMesh` has already been stopped: ..."; an Actor class whose
    endpoints are both `def` and `async def` raises ValueError "<Class> mixes both async and
    sync endpoints: ..."; str(MeshFailure) is "MeshFailure(mesh_name=..., crashed_ranks=[r],
    event=The actor <mesh>{<point>} and all its descendants have failed: <report>)".
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Type

from podium._core import base as _base
from podium._core.base import (
    ActorErrc,
    BaseErrc,
    ChannelErrc,
    CoreError,
    DataErrc,
    HostErrc,
    MeshErrc,
    NdsliceErrc,
    Subsystem,
    WireErrc,
)


def describe(e: BaseException) -> str:
    """``"TypeName: text"`` of ``e``; never raises, even when its ``__str__`` does (then the
    text is ``<its str() raised>``), and the result can cross into C++ (lone surrogates are
    escaped). EP-2."""
    try:
        text = f"{type(e).__name__}: {e}"
    except BaseException:  # its __str__ raised: say so rather than lose the error
        text = f"{type(e).__name__}: <its str() raised>"
    return utf8(text)


def utf8(text: str) -> str:
    """``text``, with what UTF-8 cannot encode (lone surrogates) backslash-escaped."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


class ActorError(Exception):
    """An endpoint raised: ``.exception`` is the original exception, the message carries the
    remote traceback. The actor that raised lives on."""

    def __init__(
        self,
        exception: BaseException,
        message: str = "A remote actor call has failed.",
        remote_traceback: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.exception = exception
        self.message = message
        self.remote_traceback = remote_traceback or f"{type(exception).__name__}: {exception}\n"

    def __str__(self) -> str:
        return f"{self.message}\n {self.remote_traceback}"

    def __reduce__(self):
        return (ActorError, (self.exception, self.message, self.remote_traceback))


class ReplyDecodeError(ActorError):
    """A reply reached the caller but could not be unpickled there (EP-4): its class is not
    importable here, its ``__setstate__`` or reconstructor raised, ... The endpoint ran and
    the actor lives on. The message names the actor mesh, endpoint, rank and coordinates (a
    message to a Port: the port); so do the attributes ``mesh_name``, ``endpoint``, ``rank``
    (None for a port); ``exception`` (and ``__cause__``) is what unpickling raised."""

    def __init__(self, exception: BaseException, where: str, mesh_name: Optional[str] = None,
                 endpoint: Optional[str] = None, rank: Optional[int] = None) -> None:
        text = describe(exception)
        if endpoint is not None:
            message = (f"Actor call {mesh_name}.{endpoint} ({where}): its reply could not be "
                       f"unpickled here: {text}")
        else:
            message = f"{where} could not be unpickled here: {text}"
        super().__init__(exception, message, f"{text}\n")
        self.where = where
        self.mesh_name = mesh_name
        self.endpoint = endpoint
        self.rank = rank
        self.__cause__ = exception

    def __reduce__(self):
        return (ReplyDecodeError,
                (self.exception, self.where, self.mesh_name, self.endpoint, self.rank))


class SupervisionError(RuntimeError):
    """The actor (or the process hosting it) failed, stopped or exited. A RuntimeError, as
    Monarch's. The message names the mesh and actor, the rank and coordinates, the host, the
    pid and the cause; so do the attributes (None where unknown): ``endpoint``,
    ``mesh_name``, ``actor_class``, ``actor_display_name`` (``"mesh{'gpus': 1/2}"``), ``rank``
    (as Monarch's), and podium's ``actor_id``, ``point``, ``host``, ``pid``, ``cause``.

    ``str()`` starts with Monarch's words (MW-1): ``Endpoint call <mesh>.<endpoint>() failed,
    `` for a call, then the located message (see ``located``)."""

    def __init__(self, message: str, endpoint: Optional[str] = None, **where: Any) -> None:
        super().__init__(message)
        self.message = message
        self.endpoint = endpoint
        self.cause: str = where.get("cause", message)
        self.mesh_name: Optional[str] = where.get("mesh_name")
        self.actor_class: Optional[str] = where.get("actor_class")
        self.actor_id: Optional[str] = where.get("actor_id")
        self.rank: Optional[int] = where.get("rank")
        self.point: Optional[str] = where.get("point")
        self.host: Optional[str] = where.get("host")
        self.pid: Optional[int] = where.get("pid")
        self.actor_display_name: Optional[str] = (
            f"{self.mesh_name}{self.point}" if self.mesh_name and self.point is not None else None)

    def __str__(self) -> str:
        if self.endpoint:
            where = f"{self.mesh_name}.{self.endpoint}" if self.mesh_name else self.endpoint
            return f"Endpoint call {where}() failed, {self.message}"
        return self.message

    def __reduce__(self):
        where = {k: getattr(self, k) for k in ("cause", "mesh_name", "actor_class", "actor_id",
                                                "rank", "point", "host", "pid")}
        return (_rebuild_supervision_error, (self.message, self.endpoint, where))


def _rebuild_supervision_error(message: str, endpoint: Optional[str],
                               where: Dict[str, Any]) -> SupervisionError:
    return SupervisionError(message, endpoint, **where)


# What the runtime's cause says of an actor whose __init__ raised (cpp/podium/actor/mailbox.cc).
_CONSTRUCTOR_FAILED = "failed in its constructor"


class ActorInitError(ActorError, SupervisionError):
    """An actor's ``__init__`` raised: its calls (and ``initialized``) raise this. It is an
    ActorError, as Monarch raises it for an exception from ``__init__``, and a
    SupervisionError, since the actor is failed for good (MW-2). ``exception`` is a
    RuntimeError with the original exception's type and text; the message carries its
    remote traceback."""

    def __init__(self, message: str, endpoint: Optional[str] = None, **where: Any) -> None:
        SupervisionError.__init__(self, message, endpoint, **where)
        cause = where.get("cause", message)
        self.exception = RuntimeError(cause.split("\n", 1)[0])
        self.remote_traceback = cause

    def __str__(self) -> str:
        return SupervisionError.__str__(self)

    def __reduce__(self):
        _, (message, endpoint, where) = SupervisionError.__reduce__(self)
        return (_rebuild_actor_init_error, (message, endpoint, where))


def _rebuild_actor_init_error(message: str, endpoint: Optional[str],
                              where: Dict[str, Any]) -> "ActorInitError":
    return ActorInitError(message, endpoint, **where)


def init_failure(e: BaseException) -> BaseException:
    """``e``, or an ActorInitError with its text when it says the actor's ``__init__`` raised
    (MW-2)."""
    if (isinstance(e, SupervisionError) and not isinstance(e, ActorInitError)
            and _CONSTRUCTOR_FAILED in e.message):
        where = {k: getattr(e, k) for k in ("cause", "mesh_name", "actor_class", "actor_id",
                                            "rank", "point", "host", "pid")}
        out = ActorInitError(e.message, e.endpoint, **where)
        out.errc = getattr(e, "errc", None)
        return out
    return e


# Monarch's opening words of a located SupervisionError (MW-1), by what happened.
PROC_MESH_STOPPED = "actor mesh is stopped due to proc mesh shutdown"
PROC_MESH_IS_STOPPED = "`ProcMesh` has already been stopped"


def _opening(errc_: Any, display: str, actor_id: str, proc_mesh_stopped: bool) -> str:
    """MW-1: the proc mesh was stopped -> "actor mesh is stopped due to proc mesh shutdown";
    the actor mesh was stopped -> "Actor <id> exited because of the following reason:
    stopped"; any other end (the actor failed, its proc exited or was killed, its host was
    lost) -> "The actor <mesh>{<point>} and all its descendants have failed"."""
    if proc_mesh_stopped:
        return PROC_MESH_STOPPED
    if errc_ is ActorErrc.ACTOR_STOPPED:
        return f"Actor {actor_id} exited because of the following reason: stopped"
    return f"The actor {display} and all its descendants have failed"


def located(e: Exception, mesh_name: str, actor_class: str,
            info: Tuple[str, int, str, int, str], proc_mesh_stopped: bool = False
            ) -> Exception:
    """`e` with the failed actor's place, when it is a SupervisionError: the message becomes
    "The actor counter{'gpus': 1/2} and all its descendants have failed: actor counter[1] of
    mesh 'counter' (rank 1 {'gpus': 1/2}, host h, pid 42): <cause>" (Monarch's opening words
    first, MW-1: see ``_opening``). The rank and coordinates are the actor's in its ProcMesh
    (as in MeshFailure), which are its rank in the ActorMesh when it was spawned on the whole
    ProcMesh. ``proc_mesh_stopped``: the caller stopped the ProcMesh the actor ran on."""
    if not isinstance(e, SupervisionError):
        return e
    actor_id, pid, host, rank, point = info
    key = actor_id.rsplit("#", 1)[-1]
    cause = e.message
    for prefix in (f"{actor_id}: ", f"{actor_id} "):
        if cause.startswith(prefix):
            cause = cause[len(prefix):]
            break
    opening = _opening(getattr(e, "errc", None), f"{mesh_name}{point}", actor_id,
                       proc_mesh_stopped)
    message = (f"{opening}: actor {key} of mesh '{mesh_name}' (rank {rank} {point}, host "
               f"{host}, pid {pid}): {cause}")
    if _CONSTRUCTOR_FAILED in cause:  # its __init__ raised: ActorError too, as Monarch's
        return ActorInitError(message, e.endpoint, cause=cause, mesh_name=mesh_name,
                              actor_class=actor_class, actor_id=actor_id, rank=rank,
                              point=point, host=host, pid=pid)
    return SupervisionError(message, e.endpoint, cause=cause, mesh_name=mesh_name,
                            actor_class=actor_class, actor_id=actor_id, rank=rank, point=point,
                            host=host, pid=pid)


# --- the one table -------------------------------------------------------------------------
#
# What each class means here:
#   SupervisionError: the actor, its proc, its host or its mesh is gone (failed, stopped,
#                     exited, shut down) or cannot be reached; the caller learns why from it.
#   TimeoutError:     a bounded wait ran out.
#   ValueError, TypeError, IndexError: the caller passed something invalid.
#   CoreError:        podium's core could not do what was asked (a RuntimeError with
#                     ``subsystem``, ``code`` and ``message``). An actor call whose reply is a
#                     CoreError raises ActorError wrapping it (``from_reply``): the call reached
#                     podium but produced no result, as Monarch reports it.
_GONE = SupervisionError
TABLE: Dict[Any, Type[BaseException]] = {
    BaseErrc.OK: CoreError,  # never sent as an error; a peer that does is broken
    BaseErrc.INVALID_ARGUMENT: ValueError,
    BaseErrc.IO: CoreError,
    BaseErrc.TIMEOUT: TimeoutError,
    BaseErrc.CANCELLED: _GONE,  # "the host mesh was shut down", "podium runtime is shut down"
    BaseErrc.INTERNAL: CoreError,
    BaseErrc.UNSUPPORTED: CoreError,
    NdsliceErrc.DUPLICATE_LABEL: ValueError,
    NdsliceErrc.UNKNOWN_LABEL: TypeError,  # as Monarch: slicing by a name the mesh lacks
    NdsliceErrc.OUT_OF_RANGE: IndexError,
    NdsliceErrc.BAD_STEP: ValueError,
    NdsliceErrc.BAD_SHAPE: ValueError,
    NdsliceErrc.BAD_LAYOUT: ValueError,
    NdsliceErrc.NOT_FLATTENABLE: ValueError,
    NdsliceErrc.MALFORMED: ValueError,
    # A frame that does not decode: the connection that carried it is closed.
    WireErrc.BAD_MAGIC: CoreError,
    WireErrc.BAD_VERSION: CoreError,
    WireErrc.BAD_KIND: CoreError,
    WireErrc.BAD_FLAGS: CoreError,
    WireErrc.TOO_MANY_PARTS: CoreError,
    WireErrc.FRAME_TOO_LARGE: CoreError,
    WireErrc.MALFORMED_HEADER: CoreError,
    WireErrc.HEADER_TOO_LARGE: CoreError,
    WireErrc.CONTROL_FRAME_PARTS: CoreError,
    ChannelErrc.BAD_ADDRESS: ValueError,
    ChannelErrc.LISTEN_FAILED: CoreError,
    # The peer cannot be reached, or stopped reaching us: supervision tells why.
    ChannelErrc.CONNECT_FAILED: _GONE,
    ChannelErrc.DELIVERY_TIMEOUT: _GONE,
    ChannelErrc.CANCELLED: _GONE,
    ChannelErrc.FRAME_TOO_LARGE: _GONE,
    ChannelErrc.MALFORMED_FRAME: _GONE,
    ChannelErrc.PROTOCOL: _GONE,
    ChannelErrc.AUTH_FAILED: _GONE,
    ChannelErrc.TLS_FAILED: _GONE,
    ActorErrc.BAD_ID: ValueError,
    ActorErrc.NO_SUCH_ACTOR: _GONE,
    ActorErrc.NO_SUCH_PORT: CoreError,  # a port whose receiver closed
    ActorErrc.NO_SUCH_ENDPOINT: CoreError,
    ActorErrc.BAD_ARGUMENTS: CoreError,
    ActorErrc.HANDLER_FAILED: CoreError,
    ActorErrc.UNKNOWN_ACTOR_TYPE: CoreError,
    ActorErrc.DUPLICATE_ACTOR: CoreError,
    ActorErrc.ACTOR_STOPPED: _GONE,
    ActorErrc.ACTOR_FAILED: _GONE,
    ActorErrc.PROC_STOPPED: _GONE,
    ActorErrc.TIMEOUT: TimeoutError,
    ActorErrc.UNDELIVERABLE: _GONE,
    ActorErrc.PROC_EXITED: _GONE,
    HostErrc.INVALID_SPEC: ValueError,
    HostErrc.SPAWN_FAILED: CoreError,
    HostErrc.EXEC_FAILED: CoreError,
    HostErrc.NO_SUCH_CHILD: CoreError,
    HostErrc.NO_PROCESS_GROUP: CoreError,
    HostErrc.SIGNAL_FAILED: CoreError,
    HostErrc.STOPPED: CoreError,  # the zygote's controller or the watcher has gone
    HostErrc.NOT_READY: CoreError,  # a launched worker; podium.job raises JobError instead
    HostErrc.SURVIVED: CoreError,
    # A host that cannot be used any more (no answer, no heartbeats, shut down) and a runtime
    # that was shut down: what ran there is gone, as for a proc that exited.
    MeshErrc.HOST_LOST: _GONE,
    MeshErrc.SHUT_DOWN: _GONE,
    # A worker that refused, a message that does not decode, procs that could not start:
    # podium could not do what was asked, and the message says who and why.
    MeshErrc.HOST_REFUSED: CoreError,
    MeshErrc.PROTOCOL: CoreError,
    MeshErrc.SPAWN_FAILED: CoreError,
    # The data plane (podium.rdma, docs/data.md). podium.rdma words its own errors with the
    # buffer's owner, rank and host; these rows are for errors raised by the bindings.
    DataErrc.UNAVAILABLE: CoreError,
    DataErrc.INVALID_ARGUMENT: ValueError,
    DataErrc.TIMEOUT: TimeoutError,
    DataErrc.DROPPED: CoreError,
    DataErrc.REFUSED: PermissionError,
    DataErrc.TRANSFER_FAILED: _GONE,
    DataErrc.STOPPED: CoreError,
}
# (subsystem, code) -> class: the lookup both paths make.
_SUBSYSTEM_OF: Dict[Any, Subsystem] = {enum: sub for sub, enum in _base.ERRC.items()}
_BY_CODE: Dict[Tuple[int, int], Type[BaseException]] = {
    (int(_SUBSYSTEM_OF[type(k)]), k.value): v for k, v in TABLE.items()
}


def errc(subsystem: int, code: int) -> Any:
    """The C++ enumerator of (subsystem, code), e.g. ``ActorErrc.TIMEOUT``, or None when this
    build does not know it (a newer peer)."""
    enum = _base.ERRC.get(subsystem)
    try:
        return enum(code) if enum is not None else None
    except ValueError:
        return None


def from_core(subsystem: int, code: int, message: str, endpoint: Optional[str] = None
              ) -> BaseException:
    """The exception for a C++ error: raised by a binding, or carried by a reply instead of
    a value. A code this build does not know raises CoreError."""
    cls = _BY_CODE.get((subsystem, code), CoreError)
    if cls is SupervisionError:
        e = SupervisionError(message, endpoint)
        e.errc = errc(subsystem, code)  # what ended the actor: located() words it (MW-1)
        return e
    if cls is CoreError:
        e = CoreError(message)
        e.subsystem, e.code, e.message = subsystem, code, message
        return e
    return cls(message)


def from_reply(subsystem: int, code: int, message: str, endpoint: Optional[str] = None
               ) -> BaseException:
    """The exception an actor call raises for a reply that carries a C++ error: from_core's,
    with a CoreError wrapped in ActorError (the call reached podium but produced nothing)."""
    e = from_core(subsystem, code, message, endpoint)
    if isinstance(e, CoreError):
        return ActorError(e, f"podium could not complete the call: {message}")
    return e


_base.set_error_translator(from_core)
