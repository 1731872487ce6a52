"""Channel, Port and PortReceiver: one-way, ordered messages to a port of the C++ runtime.

``Channel.open()`` opens a port in this process's root proc (podium._core.mesh.PortReceiver:
its handler queues messages on the delivering C++ thread, never in Python) and returns a
``Port`` (where to send; picklable) and the ``PortReceiver`` (``recv()`` -> Future, in arrival
order). A Port is also what an ``@endpoint(explicit_response_port=True)`` receives: then its
messages are the replies of the caller's call, sent with the replying actor's rank.

A message is the pickled ``(True, value)`` or ``(False, exception)``; the receiver returns the
value or raises the exception. Endpoint answers (``send(..., port=p)``) use the reply format of
actor_mesh.py, which the receiver decodes the same way.
"""

from __future__ import annotations

from typing import Any, Generic, Optional, Tuple, TypeVar

from podium._core import mesh as _mesh
from podium._src import errors, pickling
from podium._src.future import Future

R = TypeVar("R")

_CHANNEL = 0  # messages are kPort
_REPLY = 1  # messages are kReply for `rank` (the caller's call collects them)
_DROP = 2  # nobody listens (an explicit response port of a broadcast)


def decode_value(parts: Any, port_id: str = "") -> Any:
    """The value of one message's parts, or raises the exception it carries. A message that
    cannot be unpickled raises ReplyDecodeError naming the port (EP-4): a port's messages do
    not say which actor sent them (the endpoint's own errors do, in their message)."""
    try:
        msg = pickling.loads(parts)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # SystemExit from a __setstate__ included
        raise errors.ReplyDecodeError(e, f"a message to port {port_id}") from e
    if msg[0]:
        return msg[1]
    if len(msg) == 2:  # port.exception(e): the receiver raises e itself
        raise msg[1]
    _, exc, message, tb = msg  # an endpoint raised (see actor_mesh.py)
    raise errors.ActorError(exc, message, tb)


def _payload(what: str, value: Any) -> Any:
    try:
        return pickling.dumps((True, value))
    except Exception as e:
        raise TypeError(f"{what}: the value ({type(value).__name__}) cannot be pickled: "
                        f"{errors.describe(e)}") from e


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
        from podium._src.proc_mesh import ensure_runtime

        ensure_runtime()
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


class PortReceiver(Generic[R]):
    """The receiving end of a Channel: ``recv()`` is a Future of the next message, in arrival
    order. Closing the receiver (``close()``, or dropping it) closes the port."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self._port_id = core.port_id

    def recv(self) -> "Future[R]":
        return Future(self._core.recv(), _decode_one, self._port_id)

    def close(self) -> None:
        self._core.close()

    def __repr__(self) -> str:
        return f"<PortReceiver {self._core.port_id}>"


_NO_SUCH_PORT = (4, 102)  # (Subsystem::kActor, ActorErrc::kNoSuchPort): the receiver closed


def _decode_one(core: Any, port_id: str) -> Any:
    ((ok, payload),) = core.replies()
    if not ok:
        subsystem, code, message = payload
        if (subsystem, code) == _NO_SUCH_PORT:
            raise RuntimeError(message)
        raise errors.from_core(subsystem, code, message)
    return decode_value(payload, port_id)


class Channel(Generic[R]):
    """Opens ports: ``port, receiver = Channel.open()``."""

    @staticmethod
    def open(once: bool = False) -> Tuple[Port[R], PortReceiver[R]]:
        """A new port of this process and its receiver; ``once=True`` closes the port after
        its first message."""
        from podium._src.proc_mesh import ensure_runtime

        ensure_runtime()
        core = _mesh.PortReceiver(bool(once))
        return Port(core.port_id), PortReceiver(core)
