"""The Python side of Python actors: a spawner thread per process and one thread per actor.

The C++ actor type "python" (python/bindings/actor.cc) queues each spawn for the spawner
thread, which starts the actor's thread. That thread runs ``__init__``, reports it to the
waiting C++ factory, then handles the actor's messages one at a time in arrival order, popping
them from the actor's C++ Inbox with the GIL released. Async actors get an event loop of their
own on that thread, and each message runs to completion on it before the next starts.

Nothing here routes, times or sends on its own: replies go back through Inbox.reply into the
C++ runtime.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
import threading
import time
import traceback
from typing import Any, Optional, Set

from podium._core import actor as _actor
from podium._core import ndslice as _nd
from podium._src import pickling
from podium._src.context import ActorInstance, Context, set_context
from podium._src.endpoint import check_actor_class, endpoints_of
from podium._src.shape import Point

_POLL_S = 1.0  # how often idle threads look at the shutdown flag

_lock = threading.Lock()
_started = False
_stopping = False
_spawner: Optional[threading.Thread] = None
_servers: Set["_ActorServer"] = set()


def start() -> None:
    """Serves Python actors in this process (idempotent)."""
    global _started, _spawner
    with _lock:
        if _started:
            return
        _started = True
        _actor.serve_python_actors()
        _spawner = threading.Thread(target=_spawner_main, name="podium-spawner", daemon=True)
        _spawner.start()


def stop(timeout: float = 2.0) -> None:
    """Refuses new actors, closes every actor's inbox and waits (up to ``timeout`` seconds)
    for the actor threads to leave, so that none is inside the C++ core when the interpreter
    finalizes."""
    global _stopping
    with _lock:
        if not _started or _stopping:
            return
        _stopping = True
        servers = list(_servers)
    _actor.close_spawns()
    for s in servers:
        s.inbox.close()
    threads = [s.thread for s in servers if s.thread is not None]
    if _spawner is not None:
        threads.append(_spawner)
    deadline = time.monotonic() + timeout
    for t in threads:
        if t is not threading.current_thread():
            t.join(max(0.0, deadline - time.monotonic()))


def _spawner_main() -> None:
    while not _stopping:
        req = _actor.next_spawn(_POLL_S)
        if req is None:
            continue
        server = _ActorServer(req)
        try:
            t = threading.Thread(
                target=server.run, name=f"podium-actor-{req.inbox.name}[{req.inbox.index}]",
                daemon=True,
            )
            server.thread = t
            with _lock:
                _servers.add(server)
            t.start()
        except BaseException as e:  # cannot start a thread: the spawn fails, the proc lives
            with _lock:
                _servers.discard(server)
            req.failed(f"cannot start a thread for {req.inbox.actor_id}: {e}")


def _format(e: BaseException) -> str:
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return text.replace(
        "Traceback (most recent call last):",
        "Traceback of where the remote call failed (most recent call last):",
    )


def _portable(e: BaseException) -> BaseException:
    """``e`` if it pickles, else a RuntimeError that keeps its type and text."""
    try:
        pickling.dumps(e)
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


class _ActorServer:
    def __init__(self, req: Any) -> None:
        self.req = req
        self.inbox = req.inbox
        self.thread: Optional[threading.Thread] = None
        self.instance: Any = None
        self.cls: Any = None
        self.info: Optional[ActorInstance] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    # --- construction ---------------------------------------------------------------------

    def run(self) -> None:
        try:
            if self._construct():
                self._serve()
        finally:
            if self.loop is not None:
                self.loop.close()
            set_context(None)
            self.inbox.finished()
            with _lock:
                _servers.discard(self)

    def _construct(self) -> bool:
        req, inbox = self.req, self.inbox
        self.req = None
        try:
            parts = req.parts
            sys_path, labels, sizes, base_ranks = pickle.loads(parts[0])
            for p in sys_path:  # so that classes pickled by reference import here too
                if p not in sys.path:
                    sys.path.append(p)
            cls, args, kwargs = pickling.loads(parts[1:])
            self.cls = cls
            rank = base_ranks.index(inbox.index)
            point = Point._wrap(_nd.Extent(labels, sizes).point_of_rank(rank))
            self.info = ActorInstance(
                inbox.actor_id, inbox.name, point, f"{cls.__module__}.{cls.__qualname__}"
            )
            if check_actor_class(cls):
                self.loop = asyncio.new_event_loop()
                asyncio.set_event_loop(self.loop)
            set_context(Context(self.info, point))
            self.instance = cls(*args, **kwargs)
        except BaseException as e:
            req.failed(f"{inbox.actor_id}: __init__ raised:\n{_format(e)}")
            return False
        finally:
            set_context(None)
        req.constructed()
        return True

    # --- messages -------------------------------------------------------------------------

    def _serve(self) -> None:
        inbox = self.inbox
        while True:
            item = inbox.next(_POLL_S)
            if item is None:
                if inbox.closed or _stopping:
                    return
                continue
            if item.kind == "stop":
                self._cleanup()
                item.stopped()
                return
            self._handle(item)

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.loop is not None and asyncio.iscoroutinefunction(fn):
            return self.loop.run_until_complete(fn(*args, **kwargs))
        return fn(*args, **kwargs)

    def _cleanup(self) -> None:
        fn = getattr(self.instance, "__cleanup__", None)
        if fn is None or self.inbox.failed:
            return
        set_context(Context(self.info, self.info.rank))
        try:
            self._run(fn)
        except BaseException:
            print(f"podium: {self.inbox.actor_id}: __cleanup__ raised:", file=sys.stderr)
            traceback.print_exc()
        finally:
            set_context(None)

    def _handle(self, item: Any) -> None:
        inbox = self.inbox
        port = item.reply_port
        rank = item.rank
        if inbox.failed:
            if port:
                inbox.reply_failure(port, rank)
            return
        name = item.endpoint
        parts = item.parts
        try:
            meta = parts[0]
            if len(meta):
                r, labels, sizes = pickle.loads(meta)
            else:
                r, labels, sizes = rank, item.labels, item.sizes
            point = Point._wrap(_nd.Extent(labels, sizes).point_of_rank(r))
        except BaseException as e:
            self._failed(port, rank, name, e)
            return
        set_context(Context(self.info, point))
        try:
            ep = endpoints_of(self.cls).get(name)
            if ep is None:
                raise AttributeError(f"{self.cls.__qualname__} has no endpoint '{name}'")
            args, kwargs = pickling.loads(parts[1:])
            result = self._run(ep._method, self.instance, *args, **kwargs)
        except Exception as e:
            if not port:  # nobody awaits this call: the exception fails the actor
                self._failed(port, rank, name, e)
                return
            message = f"Actor call {self.info.name}.{name} failed"
            payload = pickling.dumps((False, _portable(e), message, _format(e)))
            inbox.reply(port, rank, payload)
            return
        except BaseException as e:
            self._failed(port, rank, name, e)
            return
        finally:
            set_context(None)
        if not port:
            return
        try:
            payload = pickling.dumps((True, result))
        except Exception as e:
            err = TypeError(f"the result of {name} ({type(result).__name__}) cannot be pickled: {e}")
            payload = pickling.dumps((False, err, f"Actor call {self.info.name}.{name} failed",
                                      _format(err)))
        inbox.reply(port, rank, payload)

    def _failed(self, port: str, rank: int, name: str, e: BaseException) -> None:
        text = _format(e)
        why = "in a call nobody awaits (broadcast)" if not port else "(a BaseException)"
        print(f"podium: actor {self.inbox.actor_id} failed: endpoint {name} raised {why}:\n"
              f"{text}", file=sys.stderr, flush=True)
        self.inbox.fail(f"endpoint {name} raised {type(e).__name__}: {e}")
        if port:
            self.inbox.reply_failure(port, rank)
