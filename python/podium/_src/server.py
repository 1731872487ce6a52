"""The Python side of Python actors: a spawner thread per process and one thread per actor.

The C++ actor type "python" (python/bindings/actor.cc) queues each spawn for the spawner
thread, which starts the actor's thread. That thread runs ``__init__``, reports it to the
waiting C++ factory, then handles the actor's messages one at a time in arrival order, popping
them from the actor's C++ Inbox with the GIL released. Async actors get an event loop of their
own on that thread, and each message runs to completion on it before the next starts.

An async actor's thread runs one event loop for the actor's life. It watches the Inbox's
eventfd (written by C++ on every push) with add_reader, so the loop keeps running while no
message is there: calls of @concurrent_endpoint methods run as tasks that overlap with later
messages; every other call is awaited to completion before the next message starts.

Failure reports of meshes an actor owns do not wait for its calls (supervision.py, SV-6): the
Inbox hands them out first; a sync actor runs ``__supervise__`` before its next call, an async
actor as a task of its loop, started from the eventfd's callback even while a call is awaited
(each plain call runs as a task, so that a failure the actor does not handle cancels it).

A stop (queued behind the messages sent before it) cancels the actor's concurrent tasks, stops
the actor meshes the actor spawned (a wait that C++ bounds: ME-8), runs ``__cleanup__`` and
acknowledges. No thread here polls: the spawner and the actors' threads block in C++ waits
that a spawn, a message or stop() ends, and the bootstrap wait ends when the bootstrap ran or
stop() began.

Nothing here routes, times or sends on its own: replies go back through Inbox.reply (or a
Port) into the C++ runtime.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Optional, Set, Tuple

from podium._core import actor as _actor
from podium._core import mesh as _mesh
from podium._core import ndslice as _nd
from podium._src import future, output, pickling, ratelimit, supervision
from podium._src.errors import describe, SupervisionError, utf8
from podium._src.context import ActorInstance, Context, reset_context, set_context
from podium._src.endpoint import check_actor_class, endpoints_of
from podium._src.port_ref import Port
from podium._src.shape import Point


def _release_rdma(actor_id: str) -> None:
    """RD-3: an actor that stops or fails releases the RDMA buffers it owns (only where
    podium.rdma was used: the data plane is not started for this)."""
    rdma = sys.modules.get("podium._src.rdma")
    if rdma is not None:
        try:
            rdma.release_owner(actor_id)
        except Exception as e:  # the stop goes on; the leak is reported
            ratelimit.warn("rdma release", f"{actor_id}: releasing its RDMA buffers failed: "
                                           f"{describe(e)}")

# At process exit: how long an async actor's cancelled tasks get to finish before its event
# loop closes (the one wait Python still times here; docs/python.md).
_CANCEL_WAIT_S = 1.0
# How often an actor's serve loop is started again after an exception escaped it (EP-3): a
# failed actor refuses calls without running its code, so only a fault of podium's own could
# make it fail again and again.
_MAX_RESTARTS = 8

_lock = threading.Lock()
_started = False
_stopping = False
_spawner: Optional[threading.Thread] = None
_servers: Set["_ActorServer"] = set()

# This process is a proc that the runtime spawned (set by podium._src.proc).
_in_proc = False
# The controller's get_or_spawn_controller registry (an ActorMesh), once known here.
_registry: Any = None
# (post_mortem(exc), call_finished()) of podium.debugger.remote, once a proc installed them.
debug_hooks: Optional[Tuple[Callable[[BaseException], None], Callable[[], None]]] = None

# The proc's bootstrap function (spawn_procs(bootstrap=...)): actors whose spawn says "wait"
# construct only after it ran; _boot_error is its traceback if it raised.
_boot_done = threading.Event()  # the bootstrap ran (_boot_ran), or this process is stopping
_boot_ran = False
_boot_error: Optional[str] = None


def mark_proc() -> None:
    global _in_proc
    _in_proc = True
    # In a proc, an actor thread waiting for its next call reads it from the socket itself
    # (Inbox.pop in bindings/actor.cc): no hand-off from a runner per call. Not in a
    # controller, whose main thread drives the loop while it waits for replies.
    _actor.set_driving(True)


def in_proc() -> bool:
    return _in_proc


def registry() -> Any:
    return _registry


def set_registry(mesh: Any) -> None:
    global _registry
    with _lock:
        if _registry is None:
            _registry = mesh


def _bootstrap_finished(error: Optional[str]) -> None:
    global _boot_error, _boot_ran
    _boot_error, _boot_ran = error, True
    _boot_done.set()


def _wait_bootstrap() -> None:
    _boot_done.wait()  # set by the bootstrap actor, or by stop()
    if not _boot_ran:
        raise RuntimeError("this proc is shutting down before its bootstrap ran")
    if _boot_error is not None:
        raise RuntimeError(f"the bootstrap function of this proc raised:\n{_boot_error}")


# Adaptive polling in a Python process (see Executor::set_poll). Runners here seldom run the
# loop (a waiting caller or an idle actor thread drives it), and a runner that polls takes
# the core those threads need: on two cores `call_one` went from 110 to 300 µs (p99 4 ms).
# Drivers poll for up to 100 µs, which covers the Python side of a round trip (50 µs did
# not: 92 against 74 µs); the window adapts, so procs called less often stop polling.
# PODIUM_POLL_US, when set, applies to both as in C++.
RUNNER_POLL_US = 0.0
DRIVER_POLL_US = 100.0


def _set_poll_policy() -> None:
    if "PODIUM_POLL_US" not in os.environ:
        _mesh.set_poll(RUNNER_POLL_US, DRIVER_POLL_US)


def start() -> None:
    """Serves Python actors in this process (idempotent)."""
    global _started, _spawner
    with _lock:
        if _started:
            return
        _started = True
        _set_poll_policy()
        _actor.serve_python_actors()
        supervision.start()
        future._gate = supervision._Gate  # SV-7
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
    _boot_done.set()  # wakes actors waiting for a bootstrap that will not run now
    _actor.close_spawns()  # wakes the spawner: next_spawn returns None
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
    while True:
        req = _actor.next_spawn()  # None once stop() closed the spawn queue
        if req is None:
            return
        server = _ActorServer(req)
        try:
            t = threading.Thread(
                target=server.run, name=f"podium-actor-{req.inbox.name}[{req.inbox.index}]",
                daemon=True,
            )
            server.thread = t
            with _lock:
                if _stopping:  # stop() has closed the inboxes it knew: this one too
                    req.inbox.close()
                _servers.add(server)
            t.start()
        except BaseException as e:  # cannot start a thread: the spawn fails, the proc lives
            with _lock:
                _servers.discard(server)
            req.failed(f"cannot start a thread for {req.inbox.actor_id}: {describe(e)}")


def _format(e: BaseException) -> str:
    """The remote traceback of ``e``; never raises (EP-1)."""
    try:
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    except BaseException:
        text = f"{describe(e)}\n(its traceback could not be formatted)\n"
    return utf8(text.replace(
        "Traceback (most recent call last):",
        "Traceback of where the remote call failed (most recent call last):",
    ))


def _portable(e: BaseException) -> BaseException:
    """``e`` if it survives pickling and unpickling, else a RuntimeError that keeps its type
    and text (EP-2): an exception whose ``__reduce__``, ``__setstate__`` or constructor
    raises (a class whose ``__init__`` takes other arguments than its ``args``) still reaches
    the caller as one it can read."""
    try:
        pickling.loads(pickling.dumps(e))
        return e
    except BaseException:  # whatever it raises, the caller gets the text
        return RuntimeError(describe(e))


class _ActorServer(supervision.OwnerSupervision):
    def __init__(self, req: Any) -> None:
        self.req = req
        self.inbox = req.inbox
        self.thread: Optional[threading.Thread] = None
        self.instance: Any = None
        self.cls: Any = None
        self.endpoints: Dict[str, Any] = {}
        self.info: Optional[ActorInstance] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        # An async actor's calls running as tasks (@concurrent_endpoint), and its serve loop.
        self.tasks: Dict["asyncio.Task[None]", _Call] = {}
        self.main: Optional["asyncio.Task[None]"] = None
        self.current: Optional[_Call] = None  # the call in progress (not a concurrent one)
        self.current_task: Optional["asyncio.Task[None]"] = None  # its task (async actors)

    # --- construction ---------------------------------------------------------------------

    def run(self) -> None:
        self._init_supervision()
        try:
            if self._construct():
                self._run_serve()
        finally:
            self._end_supervision()
            if self.loop is not None:
                self.loop.close()
            self.inbox.finished()
            with _lock:
                _servers.discard(self)

    def _run_serve(self) -> None:
        """Serves until the stop or the process's end. The thread is never lost to an
        exception (EP-3): one that escapes the serve loop (an asyncio task the actor created
        raised SystemExit, which asyncio lets out of the loop; a bug here) fails the actor,
        and the loop goes on, refusing calls and acknowledging the stop."""
        loop = self.loop
        for _ in range(_MAX_RESTARTS):
            try:
                if loop is None:
                    self._serve()
                else:
                    if self.main is None or self.main.done():
                        self.main = loop.create_task(self._serve_async())
                    loop.run_until_complete(self.main)
                return
            except BaseException as e:
                self._crashed(e)
        ratelimit.warn("actor thread lost", f"actor {self.inbox.actor_id}: its serve loop "
                       f"failed {_MAX_RESTARTS} times; its thread ends")

    def _crashed(self, e: BaseException) -> None:
        why = "outside any call (a BaseException fails the actor)"
        text = f"raised {describe(e)} {why}\n{_format(e)}"
        if not self.inbox.failed:  # the runtime logs the failure, with this text, once
            self.inbox.fail(text)
        # Its calls in progress end with it: their callers learn why, and none waits on. The
        # one the serve loop awaits runs to its end, but its answer is dropped (answered).
        current = self.current
        if current is not None and current.port and not current.answered:
            current.answered = True
            self.inbox.reply_failure(current.port, current.rank)
        for task, call in list(self.tasks.items()):
            if call.port and not call.answered:
                call.answered = True
                self.inbox.reply_failure(call.port, call.rank)
            task.cancel()
        _release_rdma(self.inbox.actor_id)

    def _construct(self) -> bool:
        """Runs __init__; False when the thread has nothing more to do (it failed, or it was
        the proc's bootstrap)."""
        req, inbox = self.req, self.inbox
        self.req = None
        boot = None
        try:
            parts = req.parts
            meta = pickle.loads(parts[0])
            for p in meta["sys_path"]:  # so that classes pickled by reference import here too
                if p not in sys.path:
                    sys.path.append(p)
            if meta.get("registry") is not None:
                set_registry(meta["registry"])
            boot = meta.get("bootstrap")
            if boot == "wait":
                _wait_bootstrap()
            cls, args, kwargs = pickling.loads(parts[1:])
            self.cls = cls
            self.endpoints = endpoints_of(cls)
            rank = meta["base_ranks"].index(inbox.index)
            point = Point._wrap(_nd.Extent(meta["labels"], meta["sizes"]).point_of_rank(rank))
            self.info = ActorInstance(
                inbox.actor_id, inbox.name, point, f"{cls.__module__}.{cls.__qualname__}",
                proc_mesh=meta.get("proc_mesh"), creator=meta.get("creator"),
            )
            if check_actor_class(cls):
                self.loop = asyncio.new_event_loop()
                asyncio.set_event_loop(self.loop)
            token = set_context(Context(self.info, point))
            try:
                self.instance = cls(*args, **kwargs)
            finally:
                reset_context(token)
        except BaseException as e:
            text = _format(e)
            if boot == "run":
                _bootstrap_finished(text)
            req.failed(f"__init__ raised {describe(e)}\n{text}")
            return False
        if boot == "run":
            _bootstrap_finished(None)
        req.constructed()
        return boot != "run"

    # --- messages -------------------------------------------------------------------------

    def _serve(self) -> None:
        inbox = self.inbox
        while True:
            item = inbox.next()  # None once the inbox is closed (stop() closes them all)
            if item is None:
                return
            kind = item.kind
            if kind == "call":
                try:
                    self._handle(item)
                except BaseException as e:  # _handle answers; see EP-3
                    self._crashed(e)
            elif kind == "stop":
                try:
                    self._stop_children()
                    self._cleanup_sync()
                finally:  # acknowledged whatever happened, or it is escalated to a kill
                    _release_rdma(self.inbox.actor_id)
                    output.forward_flush()  # what it printed streams before the stop is done
                    item.stopped()
                return
            elif kind == "supervise":
                self._supervise(item.failure)

    async def _serve_async(self) -> None:
        inbox, loop = self.inbox, asyncio.get_running_loop()
        fd = inbox.event_fd()
        if fd < 0:
            raise OSError("cannot create the eventfd of an async actor's inbox")
        ready = asyncio.Event()

        def wake() -> None:
            inbox.drain_event()
            ready.set()
            self._take_supervision()  # SV-6: even while an endpoint is awaited

        loop.add_reader(fd, wake)
        tasks = self.tasks
        try:
            while True:
                item = inbox.next(0)
                if item is None:
                    if inbox.closed or _stopping:
                        return
                    ready.clear()
                    item = inbox.next(0)  # a push between the two pops wrote the eventfd
                    if item is None:
                        await ready.wait()
                        continue
                if item.kind == "stop":
                    try:
                        await self._stop_supervision()
                        await self._stop_async(tasks)
                    finally:  # acknowledged whatever happened, or it is escalated to a kill
                        output.forward_flush()  # its lines stream before the stop is done
                        item.stopped()
                    return
                if item.kind == "supervise":
                    self._take_supervision(item.failure)
                    continue
                call = self._prepare(item)
                if call is None:
                    continue
                if call.concurrent:
                    task = loop.create_task(self._invoke_async(call))
                    tasks[task] = call
                    task.add_done_callback(lambda t: tasks.pop(t, None))
                else:
                    # A task of its own, so that a failure this actor does not handle can
                    # cancel it at once (SV-6).
                    self.current = call
                    task = self.current_task = loop.create_task(self._invoke_async(call))
                    try:
                        await task
                    except asyncio.CancelledError:
                        if not task.cancelled():  # this loop itself is cancelled
                            raise
                    finally:
                        self.current, self.current_task = None, None
                if tasks:
                    # A body that never suspends would keep running tasks (and one just
                    # created) from their next step: give the loop one turn per message.
                    await asyncio.sleep(0)
        finally:
            loop.remove_reader(fd)
            if self._sup_task is not None and not self._sup_task.done():
                tasks[self._sup_task] = None  # type: ignore[assignment]
            if tasks:  # the process is leaving: end the tasks before the loop closes
                for t in tasks:
                    t.cancel()
                await asyncio.wait(list(tasks), timeout=_CANCEL_WAIT_S)

    async def _stop_async(self, tasks: Dict["asyncio.Task[None]", "_Call"]) -> None:
        running = dict(tasks)
        for t in running:
            t.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        for call in running.values():
            if not call.answered and call.port:  # cancelled before it started
                call.answered = True
                self.inbox.reply_stopped(call.port, call.rank,
                                         f"stopped before {call.name} ran")
        self._stop_children()
        try:
            await self._cleanup_async()
        finally:
            _release_rdma(self.inbox.actor_id)

    def _prepare(self, item: Any) -> Optional["_Call"]:
        """The call of `item`, or None when it has been answered already (failed actor, bad
        message)."""
        inbox = self.inbox
        name, rank, port, labels, sizes, parts = item.fields()
        if inbox.failed:
            if port:
                inbox.reply_failure(port, rank)
            return None
        try:
            meta = pickle.loads(parts[0]) if len(parts[0]) else None
            if meta is not None and "rank" in meta:
                point = tuple(meta["rank"])  # (rank, labels, sizes): Context makes the Point
            else:
                point = (rank, labels, sizes)
        except BaseException as e:  # a malformed message fails its call, not the actor
            self._bad_message(port, rank, name, e)
            return None
        return _Call(self, item, name, port, rank, point, meta, parts)

    def _bad_message(self, port: str, rank: int, name: str, e: BaseException) -> None:
        """A message whose call metadata cannot be decoded (EP-6): its caller gets ActorError
        naming the endpoint and why; the actor serves on, as for an endpoint's Exception."""
        ratelimit.warn("undecodable message",
                       f"podium: actor {self.inbox.actor_id}: a message for endpoint {name} "
                       f"could not be decoded ({describe(e)}); its call fails, the actor "
                       f"serves on")
        if not port:
            return
        err = ValueError(f"the message for endpoint {name} could not be decoded: {describe(e)}")
        message = (f"Actor call {self.info.name}.{name} failed: its message could not be "
                   f"decoded ({describe(e)})")
        self.inbox.reply(port, rank, pickling.dumps((False, err, message, _format(e))))

    def _handle(self, item: Any) -> None:
        call = self._prepare(item)
        if call is None:
            return
        self.current = call  # a supervision run in its .get() may fail it (SV-7)
        token = set_context(Context(self.info, call.point))
        try:
            fn, args, kwargs = call.resolve()
            result = fn(*args, **kwargs)
        except BaseException as e:  # raised() sorts them: EP-1
            if debug_hooks is not None:
                debug_hooks[0](e)  # DB-5: post-mortem, in the call's context
            reset_context(token)
            self.current = None
            call.raised(e)
            return
        reset_context(token)
        self.current = None
        call.returned(result)

    async def _invoke_async(self, call: "_Call") -> None:
        token = set_context(Context(self.info, call.point))
        try:
            fn, args, kwargs = call.resolve()
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except asyncio.CancelledError:
            reset_context(token)
            if call.port and not call.answered:  # the actor is stopping
                call.answered = True
                self.inbox.reply_stopped(call.port, call.rank,
                                         f"stopped while {call.name} was running")
            return
        except BaseException as e:  # raised() sorts them: EP-1
            if debug_hooks is not None:
                debug_hooks[0](e)  # DB-5: post-mortem, in the call's context
            reset_context(token)
            call.raised(e)
            return
        reset_context(token)
        call.returned(result)

    # --- supervision (the rest is supervision.OwnerSupervision) ---------------------------

    def _enter(self) -> Any:
        return set_context(Context(self.info, self.info.rank))

    def _leave(self, token: Any) -> None:
        reset_context(token)

    def _format(self, e: BaseException) -> str:
        return _format(e)

    def _fail_in_flight(self) -> None:
        """This actor has just failed (a failure it did not handle, SV-6): its calls in
        progress end with it at once. Their callers get SupervisionError; async bodies are
        cancelled (a sync body runs on, its answer dropped)."""
        if self.current is not None:
            self.current.fail_now()
        if self.current_task is not None and not self.current_task.done():
            self.current_task.cancel()
        for task, call in list(self.tasks.items()):
            call.fail_now()
            task.cancel()

    # --- stop -----------------------------------------------------------------------------

    def _stop_children(self) -> None:
        """Stops the actor meshes this actor spawned (before its own __cleanup__). The wait is
        C++'s: each ActorMesh.stop() completes within its grace period, after which the procs
        of actors that did not stop are killed and a warning names them (ME-8)."""
        children = list(self.info._children) if self.info is not None else []
        if not children:
            return
        futures = []
        for child in children:
            try:
                futures.append((child, child.stop()))
            except Exception as e:
                self._child_not_stopped(child, e)
        for child, f in futures:
            try:
                f.get()
            except Exception as e:
                self._child_not_stopped(child, e)

    def _child_not_stopped(self, child: Any, e: Exception) -> None:
        """Says why a mesh this actor spawned could not be stopped. A SupervisionError means
        it had failed or stopped already (its owner was told through supervision): nothing is
        left to stop, so nothing is said."""
        if isinstance(e, SupervisionError):
            return
        sys.stderr.write(f"podium: actor {self.info.actor_id if self.info else '?'}: the "
                         f"actor mesh '{getattr(child, 'name', child)}' it spawned could not "
                         f"be stopped: {describe(e)}; its own __cleanup__ runs now\n")
        sys.stderr.flush()

    def _cleanup_fn(self) -> Optional[Tuple[Callable[..., Any], tuple]]:
        fn = getattr(self.instance, "__cleanup__", None)
        if fn is None or self.inbox.failed:
            return None
        try:
            params = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
        except Exception:  # no signature to read (TypeError, ValueError, or its own)
            params = []
        return fn, ((None,) if params else ())  # __cleanup__(self, exc): None for a stop

    def _cleanup_sync(self) -> None:
        found = self._cleanup_fn()
        if found is None:
            return
        fn, args = found
        token = set_context(Context(self.info, self.info.rank))
        try:
            fn(*args)
        except BaseException as e:  # the stop goes on: EP-3
            ratelimit.warn("__cleanup__ raised",
                           f"{self.inbox.actor_id}: __cleanup__ raised:\n{_format(e)}")
        finally:
            reset_context(token)

    async def _cleanup_async(self) -> None:
        found = self._cleanup_fn()
        if found is None:
            return
        fn, args = found
        token = set_context(Context(self.info, self.info.rank))
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                await result
        except BaseException as e:  # the stop goes on: EP-3
            ratelimit.warn("__cleanup__ raised",
                           f"{self.inbox.actor_id}: __cleanup__ raised:\n{_format(e)}")
        finally:
            reset_context(token)

    def _failed(self, port: str, rank: int, name: str, e: BaseException,
                when: str = "") -> None:
        """Fails this actor for what endpoint ``name`` raised (``when``: at which step, if
        not in its body) and answers the call with that failure (EP-1)."""
        text = _format(e)
        if when.startswith("in an explicit"):
            why = when
        elif not port:
            why = "in a call nobody awaits (broadcast)"
        elif when:
            why = f"{when} (a BaseException)"
        else:
            why = "(a BaseException)"
        if not self.inbox.failed:  # the runtime logs the failure, with this text, once
            self.inbox.fail(f"endpoint {name} raised {describe(e)} {why}\n{text}")
        if port:
            self.inbox.reply_failure(port, rank)


class _Call:
    """One call being handled: how to run it and how to answer it."""

    __slots__ = ("server", "item", "name", "port", "rank", "point", "meta", "parts",
                 "explicit_port", "concurrent", "method", "answered", "reply_port")

    def __init__(self, server: _ActorServer, item: Any, name: str, port: str, rank: int,
                 point: Any, meta: Optional[Dict[str, Any]], parts: Any) -> None:
        self.server = server
        self.item = item
        self.name = name
        self.port = port
        self.rank = rank
        self.point = point
        self.meta = meta
        self.parts = parts
        self.answered = False  # returned() or raised() ran (or the stop answered it)
        # reply_port: the Port an explicit response-port method answers by, set by resolve()
        cls = server.cls
        ep = server.endpoints.get(name)
        if ep is not None:
            self.method = ep._method
            self.explicit_port = ep._explicit_response_port
            self.concurrent = ep._concurrent
        elif meta is not None and "raw" in meta and callable(getattr(cls, name, None)):
            self.method = getattr(cls, name)  # as_endpoint(mesh.method)
            self.explicit_port = bool(meta["raw"])
            self.concurrent = False
        else:
            self.method = None
            self.explicit_port = False
            self.concurrent = False

    def resolve(self) -> Tuple[Callable[..., Any], tuple, dict]:
        """(bound method, args, kwargs); raises AttributeError for an unknown endpoint."""
        if self.method is None:
            raise AttributeError(f"{self.server.cls.__qualname__} has no endpoint '{self.name}'")
        args, kwargs = pickling.loads(self.parts[1:])
        self.parts = None
        if self.explicit_port:
            self.reply_port = Port._reply(self.port, self.rank)
            args = (self.reply_port, *args)
        return self.method.__get__(self.server.instance), args, kwargs

    def returned(self, result: Any) -> None:
        """Answers with ``result``. Pickling it may run user code (``__reduce__``): an
        Exception there fails the call, a BaseException fails the actor (EP-1)."""
        output.forward_flush()  # what the call printed streams ahead of its answer
        if debug_hooks is not None:
            debug_hooks[1]()  # DB-4: a debug session still open ends with its call
        if self.answered:  # the actor failed while it ran (EP-3): its caller knows already
            return
        self.answered = True
        if not self.port or self.explicit_port:  # one-way, or the method answers itself
            return
        try:
            payload = pickling.dumps((True, result))
        except Exception as e:
            err = TypeError(f"the result of {self.name} ({type(result).__name__}) cannot be "
                            f"pickled: {describe(e)}")
            err.__cause__ = e
            payload = self._error_payload(err)
        except BaseException as e:
            self.server._failed(self.port, self.rank, self.name, e,
                                "while its result was pickled")
            return
        try:  # one that cannot go in one message fails the call, not the caller's wait
            pickling.check_fits(f"the result of {self.server.info.name}.{self.name}", payload)
        except ValueError as e:
            payload = self._error_payload(e)
        self.server.inbox.reply(self.port, self.rank, payload)

    def fail_now(self) -> None:
        """The actor failed while this call ran: its caller gets the failure now (unless it
        has its answer), and what the body does later is not sent."""
        if self.answered:
            return
        self.answered = True
        port = getattr(self, "reply_port", None)
        if self.port and not (port is not None and port._answered):
            self.server.inbox.reply_failure(self.port, self.rank)

    def raised(self, e: BaseException) -> None:
        """Answers with what the endpoint raised (EP-1): an Exception fails the call only
        (the caller gets ActorError, the actor lives), unless nobody awaits the call or the
        endpoint answers through an explicit response port (EP-7); a BaseException
        (SystemExit, KeyboardInterrupt, ...) fails the actor, and the caller gets
        SupervisionError. Never raises."""
        output.forward_flush()  # what the call printed streams ahead of its answer
        if debug_hooks is not None:
            debug_hooks[1]()  # DB-4: a debug session still open ends with its call
        if self.answered:  # the actor failed while it ran (EP-3): its caller knows already
            return
        self.answered = True
        server = self.server
        if self.port and self.explicit_port:
            # EP-7: the answer belongs to the method (its port), so what escapes it has no
            # caller to go to: it fails the actor, as Monarch does. A caller still waiting
            # gets SupervisionError with that cause (never a hang); one that was answered
            # before the raise keeps its answer.
            port = getattr(self, "reply_port", None)
            answered = port is not None and port._answered
            kind = "" if isinstance(e, Exception) else " (a BaseException)"
            server._failed("" if answered else self.port, self.rank, self.name, e,
                           "in an explicit response-port endpoint"
                           + (" after it answered" if answered else "") + kind)
            return
        if not self.port or not isinstance(e, Exception):
            server._failed(self.port, self.rank, self.name, e)
            return
        server.inbox.reply(self.port, self.rank, self._error_payload(e))

    def _error_payload(self, e: BaseException) -> Any:
        """The reply that makes the caller raise ActorError for ``e``; never raises."""
        message = f"Actor call {self.server.info.name}.{self.name} failed"
        tb = _format(e)
        try:
            return pickling.dumps((False, _portable(e), message, tb))
        except BaseException:  # _portable checked it; a pickler that changes its mind
            return pickling.dumps((False, RuntimeError(describe(e)), message, tb))
