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

from typing import Any, Generic, Tuple, TypeVar

from podium._core import mesh as _mesh
from podium._src import errors, pickling
from podium._src.future import Future
from podium._src.port_ref import _CHANNEL, _DROP, _REPLY, Port  # noqa: F401  (re-exported)
from podium._src.runtime import ensure_runtime

R = TypeVar("R")


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


def _decode_one(core: Any, port_id: str) -> Any:
    ((ok, payload),) = core.replies()
    if not ok:
        raise errors.from_core(*payload)  # a closed receiver: CoreError (a RuntimeError)
    return decode_value(payload, port_id)


class Channel(Generic[R]):
    """Opens ports: ``port, receiver = Channel.open()``."""

    @staticmethod
    def open(once: bool = False) -> Tuple[Port[R], PortReceiver[R]]:
        """A new port of this process and its receiver; ``once=True`` closes the port after
        its first message."""
        ensure_runtime()
        core = _mesh.PortReceiver(bool(once))
        return Port(core.port_id), PortReceiver(core)
