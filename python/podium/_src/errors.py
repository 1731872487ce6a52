"""Exceptions of podium.actor, and the one table that turns C++ reply errors into them."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

# podium::Subsystem and podium::actor::ActorErrc values (cpp/podium/base/error.h, actor/ids.h).
_SUBSYSTEM_CHANNEL = 3
_SUBSYSTEM_ACTOR = 4
_ACTOR_TIMEOUT = 111
# The actor or its proc is gone: the caller learns it from supervision, not from the endpoint.
_ACTOR_GONE = {
    101,  # kNoSuchActor
    108,  # kActorStopped
    109,  # kActorFailed
    110,  # kProcStopped
    112,  # kUndeliverable
    113,  # kProcExited
}


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


class SupervisionError(Exception):
    """The actor (or the process hosting it) failed, stopped or exited. The message names the
    mesh and actor, the rank and coordinates, the host, the pid and the cause; so do the
    attributes (None where unknown): ``endpoint``, ``mesh_name``, ``actor_class``,
    ``actor_display_name`` (``"mesh{'gpus': 1/2}"``), ``rank`` (as Monarch's), and podium's
    ``actor_id``, ``point``, ``host``, ``pid``, ``cause``."""

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
            return f"endpoint {self.endpoint}: {self.message}"
        return self.message

    def __reduce__(self):
        where = {k: getattr(self, k) for k in ("cause", "mesh_name", "actor_class", "actor_id",
                                                "rank", "point", "host", "pid")}
        return (_rebuild_supervision_error, (self.message, self.endpoint, where))


def _rebuild_supervision_error(message: str, endpoint: Optional[str],
                               where: Dict[str, Any]) -> SupervisionError:
    return SupervisionError(message, endpoint, **where)


def located(e: Exception, mesh_name: str, actor_class: str,
            info: Tuple[str, int, str, int, str]) -> Exception:
    """`e` with the failed actor's place, when it is a SupervisionError: the message becomes
    "actor counter[1] of mesh 'counter' (rank 1 {'gpus': 1/2}, host h, pid 42): <cause>". The
    rank and coordinates are the actor's in its ProcMesh (as in MeshFailure), which are its
    rank in the ActorMesh when it was spawned on the whole ProcMesh."""
    if not isinstance(e, SupervisionError):
        return e
    actor_id, pid, host, rank, point = info
    key = actor_id.rsplit("#", 1)[-1]
    cause = e.message
    for prefix in (f"{actor_id}: ", f"{actor_id} "):
        if cause.startswith(prefix):
            cause = cause[len(prefix):]
            break
    message = (f"actor {key} of mesh '{mesh_name}' (rank {rank} {point}, host {host}, "
               f"pid {pid}): {cause}")
    return SupervisionError(message, e.endpoint, cause=cause, mesh_name=mesh_name,
                            actor_class=actor_class, actor_id=actor_id, rank=rank, point=point,
                            host=host, pid=pid)


def from_core(subsystem: int, code: int, message: str, endpoint: Optional[str] = None) -> Exception:
    """The exception for an error that the C++ core returned instead of a reply."""
    if subsystem == _SUBSYSTEM_ACTOR and code == _ACTOR_TIMEOUT:
        return TimeoutError(message)
    if (subsystem == _SUBSYSTEM_ACTOR and code in _ACTOR_GONE) or subsystem == _SUBSYSTEM_CHANNEL:
        return SupervisionError(message, endpoint)
    return ActorError(RuntimeError(message), f"podium could not complete the call: {message}")
