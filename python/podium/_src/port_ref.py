"""Port: where to send values, as the picklable address of a port of the C++ runtime.

It lives apart from ports.py (Channel, PortReceiver) so that server.py, which hands a Port to
an ``@endpoint(explicit_response_port=True)``, does not depend on the modules that start the
runtime; runtime.py hands its ``ensure_runtime`` in (``bind_runtime``) instead. A message is
the pickled ``(True, value)`` or ``(False, exception)`` (see ports.py).
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Optional, TypeVar

from podium._core import mesh as _mesh
from podium._src import errors, pickling

R = TypeVar("R")

_CHANNEL = 0  # messages are kPort
_REPLY = 1  # messages are kReply for `rank` (the caller's call collects them)
_DROP = 2  # nobody listens (an explicit response port of a broadcast)


# runtime.ensure_runtime, handed in by runtime.py when it is imported.
_ensure_runtime: Optional[Callable[[], None]] = None


def bind_runtime(fn: Callable[[], None]) -> None:
    global _ensure_runtime
    _ensure_runtime = fn


def _payload(what: str, value: Any) -> Any:
    try:
        parts = pickling.dumps((True, value))
    except Exception as e:
        raise TypeError(f"{what}: the value ({type(value).__name__}) cannot be pickled: "
                        f"{errors.describe(e)}") from e
    pickling.check_fits(f"{what}: the value", parts)
    return parts


def _exception_payload(exc: BaseException) -> Any:
    try:
        return pickling.dumps((False, exc))
    except BaseException:  # whatever its __reduce__ raises, the receiver gets its text (EP-2)
        return pickling.dumps((False, RuntimeError(errors.describe(exc))))


class Port(Generic[R]):
    """Where to send values: ``send(v)`` is fire and forget, delivered in send order per
    sender; ``exception(e)`` makes the receiver raise ``e``. Picklable: pass it to actors as
    an argument and send from there."""

    __slots__ = ("_kind", "_port_id", "_rank", "_answered")

    def __init__(self, port_id: str, rank: Optional[int] = None, _kind: int = _CHANNEL) -> None:
        self._port_id = port_id
        self._rank = rank
        self._kind = _kind
        self._answered = False  # a reply port: something was sent (server.py, EP-1)

    @classmethod
    def _reply(cls, port_id: str, rank: int) -> "Port[R]":
        if not port_id:
            return cls("", rank, _DROP)
        return cls(port_id, rank, _REPLY)

    @property
    def rank(self) -> Optional[int]:
        return self._rank

    def _send_parts(self, parts: Any) -> None:
        if self._kind == _DROP:
            return
        if _ensure_runtime is not None:  # runtime.py is imported wherever podium runs
            _ensure_runtime()
        if self._kind == _REPLY:
            self._answered = True
            _mesh.send_reply(self._port_id, self._rank or 0, parts)
        else:
            _mesh.send_port(self._port_id, parts)

    def send(self, obj: R) -> None:
        """Sends ``obj`` to the receiver (fire and forget, in order per sender)."""
        self._send_parts(_payload("Port.send", obj))

    def exception(self, obj: BaseException) -> None:
        """Makes the receiver's ``recv()`` (or the caller's future) raise ``obj``."""
        if not isinstance(obj, BaseException):
            raise TypeError(f"Port.exception takes an exception, not {type(obj).__name__}")
        self._send_parts(_exception_payload(obj))

    def __reduce__(self):
        return (Port, (self._port_id, self._rank, self._kind))

    def __repr__(self) -> str:
        kind = {_CHANNEL: "", _REPLY: f" reply rank {self._rank}", _DROP: " (dropping)"}
        return f"<Port {self._port_id}{kind[self._kind]}>"
