"""Exceptions of podium.actor, and the one table that turns C++ reply errors into them."""

from __future__ import annotations

from typing import Optional

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


class SupervisionError(Exception):
    """The actor (or the process hosting it) failed, stopped or exited; the message names the
    actor, its rank and the cause."""

    def __init__(self, message: str, endpoint: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.endpoint = endpoint

    def __str__(self) -> str:
        if self.endpoint:
            return f"endpoint {self.endpoint}: {self.message}"
        return self.message


def from_core(subsystem: int, code: int, message: str, endpoint: Optional[str] = None) -> Exception:
    """The exception for an error that the C++ core returned instead of a reply."""
    if subsystem == _SUBSYSTEM_ACTOR and code == _ACTOR_TIMEOUT:
        return TimeoutError(message)
    if (subsystem == _SUBSYSTEM_ACTOR and code in _ACTOR_GONE) or subsystem == _SUBSYSTEM_CHANNEL:
        return SupervisionError(message, endpoint)
    return ActorError(RuntimeError(message), f"podium could not complete the call: {message}")
