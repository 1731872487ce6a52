"""Future: the result of a call, waited on with get() or awaited in asyncio.

A Future wraps a C++ future (podium._core.mesh.CoreFuture) and a function that turns its
replies into a value or an exception. get() waits with the GIL released; a timeout raises
TimeoutError and leaves the result in place for a later get() or await. The first completed
get() decodes the replies once; every later get() returns the same value (or raises the same
exception).

``await fut`` never blocks the event loop: the C++ completion writes an eventfd that the loop
watches (one podium._core.mesh.Notifier per loop), and the loop wakes the awaiting task on
its own thread. No C++ thread ever calls into Python.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import math
import threading
import weakref
from typing import Any, Callable, Dict, Generator, Generic, Optional, TypeVar

from podium._core import mesh as _mesh

R = TypeVar("R")

_PENDING = object()

# Set by podium._src.server in a process that serves actors (supervision._Gate): what runs before a failed
# call's error is raised in an actor that owns the failed mesh (its __supervise__ runs first,
# SV-7). None elsewhere.
_gate: Any = None


def _check_timeout(timeout: Optional[float]) -> None:
    """As Monarch's: a timeout is None, or a finite number of seconds, not negative; checked
    before anything waits (ValueError), whether or not the future is done."""
    if timeout is not None and (not math.isfinite(timeout) or timeout < 0):
        raise ValueError(
            f"invalid timeout {timeout}: expected a non-negative, finite number of seconds")


class Future(Generic[R]):
    __slots__ = ("_core", "_decode", "_arg", "_lock", "_ok", "_value")

    def __init__(self, core: Any, decode: Callable[..., R], arg: Any = _PENDING) -> None:
        """``decode(core)``, or ``decode(core, arg)`` when ``arg`` is given (a module-level
        decoder and its argument allocate less per call than a closure)."""
        self._core = core
        self._decode = decode
        self._arg = arg
        self._lock = threading.Lock()
        self._ok: Optional[bool] = None
        self._value: Any = _PENDING

    def _settle(self) -> None:
        with self._lock:
            if self._ok is not None:
                return
            try:
                if self._arg is _PENDING:
                    self._value = self._decode(self._core)
                else:
                    self._value = self._decode(self._core, self._arg)
                self._ok = True
            except Exception as e:  # the endpoint's or the runtime's error, kept for every get
                self._value = e
                self._ok = False

    def _outcome(self) -> R:
        if self._ok is None:
            self._settle()
        if self._ok:
            return self._value
        raise self._value

    def get(self, timeout: Optional[float] = None) -> R:
        """Waits for the result (at most ``timeout`` seconds) and returns it, or raises the
        call's exception. A timeout raises TimeoutError and does not consume the result; a
        negative or non-finite one raises ValueError, as Monarch's."""
        _check_timeout(timeout)
        if self._ok is None and not self._core.wait(timeout):
            raise TimeoutError(f"the future did not complete within {timeout} s")
        if _gate is not None:
            if self._ok is None:
                self._settle()
            if self._ok is False:
                _gate.before_raise(self._value)
        return self._outcome()

    def result(self, timeout: Optional[float] = None) -> R:
        """Same as get()."""
        return self.get(timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """Waits like get() and returns the call's exception, or None if it succeeded."""
        _check_timeout(timeout)
        try:
            self.get(timeout)
        except TimeoutError:
            if self._ok is None:
                raise
            return self._value
        except Exception as e:
            return e
        return None

    def done(self) -> bool:
        return self._ok is not None or self._core.ready()

    def __await__(self) -> Generator[Any, None, R]:
        if self._ok is None and not self._core.ready():
            yield from _waker(asyncio.get_running_loop()).wait(self._core).__await__()
        if _gate is not None:
            if self._ok is None:
                self._settle()
            if self._ok is False:
                wait = _gate.before_raise_async(self._value)
                if wait is not None:
                    yield from wait.__await__()
        return self._outcome()

    def as_asyncio(self) -> "asyncio.Future[R]":
        """An asyncio future of the running loop that completes with this one."""
        return asyncio.ensure_future(_await(self))

    def __repr__(self) -> str:
        state = "pending" if self._ok is None else ("done" if self._ok else "failed")
        return f"<podium Future {state}>"


async def _await(f: "Future[R]") -> R:
    return await f


class _LoopWaker:
    """Wakes tasks of one event loop when C++ futures complete (see the module doc)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._notifier = _mesh.Notifier()
        self._waiters: Dict[int, asyncio.Future] = {}
        self._next = 0
        loop.add_reader(self._notifier.fileno(), self._drain)

    def wait(self, core: Any) -> "asyncio.Future[None]":
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        token = self._next
        self._next += 1
        self._waiters[token] = waiter
        core.notify(self._notifier, token)
        return waiter

    def _drain(self) -> None:
        for token in self._notifier.drain():
            waiter = self._waiters.pop(token, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


_wakers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker]" = (
    weakref.WeakKeyDictionary()
)
_wakers_lock = threading.Lock()


def _waker(loop: asyncio.AbstractEventLoop) -> _LoopWaker:
    with _wakers_lock:
        w = _wakers.get(loop)
        if w is None:
            w = _wakers[loop] = _LoopWaker(loop)
        return w


class CoroFuture(Future[R]):
    """A Future whose result is that of a coroutine (as Monarch's ``Future(coro=...)``):
    ``await`` runs it on the awaiting loop; ``get()`` runs it on an event loop of a thread of
    its own. It runs once, whichever comes first; later waits share the outcome."""

    __slots__ = ("_coro", "_started", "_done", "_ctx")

    def __init__(self, coro: Any) -> None:
        super().__init__(None, _no_decode)
        self._coro = coro
        self._started = False
        self._done = concurrent.futures.Future()
        # The caller's context variables (podium's actor context among them): get() runs the
        # body in them, on its thread.
        self._ctx = contextvars.copy_context()

    def _claim(self) -> bool:
        with self._lock:
            if self._started:
                return False
            self._started = True
            return True

    def _finish(self, ok: bool, value: Any) -> None:
        with self._lock:
            self._ok, self._value = ok, value
        self._done.set_result(None)

    async def _run(self) -> None:
        try:
            value = await self._coro
        except Exception as e:
            self._finish(False, e)
        except BaseException as e:
            self._finish(False, e)
            raise
        else:
            self._finish(True, value)

    def get(self, timeout: Optional[float] = None) -> R:
        _check_timeout(timeout)
        if self._claim():
            threading.Thread(target=self._ctx.run, args=(asyncio.run, self._run()),
                             daemon=True, name="podium-future").start()
        try:
            self._done.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the future did not complete within {timeout} s") from None
        return self._outcome()

    def done(self) -> bool:
        return self._done.done()

    def _outcome(self) -> R:
        if self._ok:
            return self._value
        raise self._value

    def __await__(self) -> Generator[Any, None, R]:
        if self._claim():
            yield from self._run().__await__()
        elif not self._done.done():
            yield from asyncio.wrap_future(self._done).__await__()
        return self._outcome()


def resolved(value: Any = None) -> "CoroFuture[Any]":
    """A Future that is already complete with ``value``."""
    f: CoroFuture[Any] = CoroFuture.__new__(CoroFuture)
    Future.__init__(f, None, _no_decode)
    f._coro, f._started, f._ctx = None, True, None
    f._done = concurrent.futures.Future()
    f._finish(True, value)
    return f


def done(value: Any = None) -> "Future[Any]":
    """A plain Future already complete with ``value``: no C++ future behind it (what a transfer
    its caller copied at once returns, DA-43)."""
    f: Future[Any] = Future.__new__(Future)
    f._core, f._decode, f._arg = None, _no_decode, _PENDING
    f._lock = threading.Lock()
    f._ok, f._value = True, value
    return f


def _no_decode(core: Any) -> Any:
    raise RuntimeError("a CoroFuture has no C++ future to decode")
