"""Streams, borrows and ``coalescing()``.

A ``Stream`` names an order of execution on every worker: commands issued while it is active
run on it (a ``torch.cuda.Stream`` of that name on GPU workers; CPU work keeps one order,
which satisfies every stream's). A tensor belongs to the stream that made it; another stream
uses it only through a borrow, as Monarch's:

  TE-10 Commands issued on one stream run on every worker in issue order (TE-1 gives that and
    more: one order for all streams of a controller).
  TE-11 ``stream.borrow(t, mutable=False)`` returns ``(t2, borrow)``: ``t2`` is ``t``'s value
    on ``stream``. While the borrow lives, ``t`` cannot be mutated (immutable borrow) or used
    at all (mutable borrow) on its own stream: such a use raises TypeError; ``t2`` can be
    used only on ``stream``. ``borrow.drop()`` frees ``t2`` (later uses raise) and gives
    ``t`` back its rights. On GPU workers the borrowing stream first waits for the work the
    owner's stream queued, and at the drop the owner's stream waits for the borrower's.
  TE-12 Inside ``coalescing()`` no command is sent, whatever the batch size; leaving it sends
    the whole batch.
"""

from __future__ import annotations

import contextlib
import traceback
from typing import Any, Iterator, Tuple

from podium.tensor import _client, _tensor
from podium.tensor._client import all_clients
from podium.tensor._tensor import Tensor, drop, new_handle, state


class Stream:
    """A named order of execution on the workers (see the module docstring)."""

    def __init__(self, name: str, _default: bool = False) -> None:
        self.name = name
        self.default = _default

    def __repr__(self) -> str:
        return f"<Stream({self.name!r}) at {hex(id(self))}>"

    def __str__(self) -> str:
        return f"stream {self.name!r}"

    def activate(self) -> "_StreamActivation":
        """Makes this the active stream from now (``with`` or ``deactivate()`` ends it)."""
        return _StreamActivation(self)

    def borrow(self, t: Tensor, mutable: bool = False) -> Tuple[Tensor, "Borrow"]:
        """``(t on this stream, borrow)`` (TE-11)."""
        if not isinstance(t, Tensor):
            raise TypeError(f"borrow() takes a podium.Tensor, not {type(t).__name__}")
        if t._dropped:
            raise TypeError(f"{t!r} was dropped")
        if not t._access & _tensor._READ:
            raise TypeError(f"{t!r} is mutably borrowed already")
        if mutable and not t._access & _tensor._WRITE:
            raise TypeError(f"{t!r} is borrowed already: it cannot be borrowed mutably")
        view = t._view
        r = new_handle(view, t._key, self)
        view.client.append(view, ("alias", r._rid, t._ref, t._stream.name, self.name))
        if mutable:
            r._access = _tensor._RW
            t._access = 0
        else:
            r._access = _tensor._READ
            t._access = _tensor._READ
        return r, Borrow(t, r, mutable)


class Borrow:
    """A live borrow (TE-11); ``drop()`` ends it."""

    def __init__(self, original: Tensor, borrowed: Tensor, mutable: bool) -> None:
        self.original = original
        self.borrowed = borrowed
        self.mutable = mutable
        self.traceback_string = "".join(traceback.format_stack(limit=8)[:-2])
        self._dropped = False

    def __enter__(self) -> "Borrow":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.drop()

    def drop(self) -> None:
        if self._dropped:
            return
        self._dropped = True
        drop(self.borrowed)
        self.borrowed._access = 0
        self.original._access = _tensor._RW
        view = self.original._view
        view.client.append(view, ("wait", self.original._stream.name,
                                  self.borrowed._stream.name))


class _StreamActivation:
    def __init__(self, stream: Stream) -> None:
        self._old = state.stream
        self._done = False
        state.stream = stream

    def __enter__(self) -> "_StreamActivation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.deactivate()

    def deactivate(self) -> None:
        if not self._done:
            self._done = True
            state.stream = self._old


def get_active_stream() -> Stream:
    return state.stream


state.stream = Stream("main", _default=True)


@contextlib.contextmanager
def coalescing() -> Iterator[None]:
    """Holds every command until the block ends, then sends the batch at once (TE-12)."""
    _client.hold[0] += 1
    try:
        yield
    finally:
        _client.hold[0] -= 1
        if not _client.hold[0]:
            for c in all_clients():
                c.flush()
