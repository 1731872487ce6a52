"""Supervision on the Python side: MeshFailure, running ``__supervise__`` on the owner of a
failed mesh, and ``unhandled_fault_hook`` for failures that reach the root of a process.

Detection and routing are C++ (cpp/podium/supervision/supervisor.h): the proc of a failed actor, or
the controller that saw a proc die, tells the process that owns the mesh; its Supervisor
raises the failure once (SV-2) to the owner (SV-3). An owner actor gets it in its Inbox as an
item of kind "supervise", which OwnerSupervision below (a base of server.py's actor server)
runs ``__supervise__`` for; the root gets it through ``podium._core.mesh.next_fault``, which
the thread started here pops to run ``podium.actor.unhandled_fault_hook``.

Invariants stated here (docs/supervision.md sums them up):
  SV-6 An owner's failure reports do not wait for its calls, as in Monarch: the Inbox hands
       them out ahead of the queued calls; an async owner runs ``__supervise__`` as a task
       of its event loop (one failure at a time), which runs at any await of an endpoint in
       progress; a sync owner runs it after the call in progress and before the queued
       ones. A failure the owner does not handle (falsy return, or it raises) fails the
       owner at once: its calls in progress are answered with SupervisionError (async bodies
       are cancelled), later ones are refused.
  SV-7 A child's failure reaches the owner's own code only after ``__supervise__`` ran for
       it: a call on a mesh the actor owns that fails because that actor failed or its proc
       exited raises in the owner (``await`` or ``.get()`` on the owner's thread) once that
       failure was supervised there, or the owner failed. A sync owner blocked in ``.get()``
       runs the supervision itself, on its thread. A proc exit that raised no fault (its
       ProcMesh was stopped, SV-2) is not waited for; an actor's report is, up to
       _GATE_WAIT_S.
  SV-8 A failure of a mesh that a restart policy or a service keeps (``keep_mesh``) goes to
       its keeper first, on the thread that would supervise it: "quiet" (a service
       replica) handles it without telling the owner; "tell" (a restart policy) handles it
       and still runs the owner's ``__supervise__`` for it, whose answer then does not
       fail the owner (the root's unhandled_fault_hook is not run); None (restarts
       exhausted) leaves it to the owner as any other failure.

See docs/supervision.md for the model and the texts users see.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import inspect
import os
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Dict, List, Optional

from podium._core import mesh as _mesh
from podium._src.errors import SupervisionError

# The fault thread's wait: the binding's longest (about 11 days), so that only a failure or
# interrupt_faults() (at exit) ends it; the thread loops only then.
_UNTIL_WOKEN_S = 1e6
_EXIT_DRAIN_S = 0.05  # at exit: how long to wait for a failure still on its way

_lock = threading.Lock()
_busy = threading.Lock()  # held by the fault thread while it waits for or runs a failure
_thread: Optional[threading.Thread] = None
_stopping = False
_exiting = False
_exit_thread: Optional[int] = None  # the thread ending the process (_exit_process)
# podium.actor, handed in by it on import (bind_hook_module): the user may replace its
# unhandled_fault_hook, so the hook is looked up there each time.
_hook_module: Any = None
# Actor meshes spawned from this process, by name (MeshFailure.mesh).
_meshes: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


class MeshFailure:
    """A failure of one actor of a mesh, as its owner sees it (``__supervise__``) and as
    ``unhandled_fault_hook`` receives it. Attributes: ``mesh_name``, ``actor_id`` (full
    ActorId text), ``rank`` and ``point`` (in the region the mesh was spawned on), ``host``,
    ``pid``, ``cause`` (the exception with its remote traceback, the exit status, or the
    report of a failed child), ``kind`` ("actor": the actor failed, its proc lives; "proc":
    the proc ended), ``signal`` (e.g. "SIGKILL", or None) and ``exit_code`` (or None)."""

    __slots__ = ("kind", "mesh_name", "actor_id", "rank", "point", "host", "pid", "signal",
                 "exit_code", "cause", "_report")

    def __init__(self, d: Dict[str, Any]) -> None:
        self.kind: str = d["kind"]
        self.mesh_name: str = d["mesh_name"]
        self.actor_id: str = d["actor_id"]
        self.rank: int = d["rank"]
        self.point: str = d["point"]
        self.host: str = d["host"]
        self.pid: int = d["pid"]
        self.signal: Optional[str] = d["signal"]
        self.exit_code: Optional[int] = d["exit_code"]
        self.cause: str = d["cause"]
        self._report: str = d["report"]

    @property
    def mesh(self) -> Any:
        """The ActorMesh that failed, when this process spawned it and still holds it."""
        return _meshes.get(self.mesh_name)

    def report(self) -> str:
        """The text a user reads: mesh, actor, rank and coordinates, host, pid, cause."""
        return self._report

    def __str__(self) -> str:
        # As Monarch's: names MeshFailure, the mesh and the crashed ranks, then the event
        # (MW-2); report() stays the text alone.
        return (f"MeshFailure(mesh_name={self.mesh_name}, crashed_ranks=[{self.rank}], "
                f"event=The actor {self.mesh_name}{self.point} and all its descendants have "
                f"failed: {self._report})")

    def __repr__(self) -> str:
        return f"<MeshFailure {self._report.splitlines()[0]}>"

    def __reduce__(self):
        return (_rebuild, ({k: getattr(self, k) for k in self.__slots__ if k != "_report"}
                           | {"report": self._report},))


def _rebuild(d: Dict[str, Any]) -> MeshFailure:
    return MeshFailure(d)


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """The default ``podium.actor.unhandled_fault_hook``: prints the report and exits the
    process with status 1 (atexit handlers run). A replacement that returns normally drops the
    fault; one that raises SystemExit(n) exits with n, any other exception with 1."""
    sys.stderr.write(f"podium: unhandled failure, exiting with status 1:\n{failure.report()}\n")
    sys.stderr.flush()
    sys.exit(1)


def bind_hook_module(module: Any) -> None:
    """Called by podium.actor on import with itself: where ``unhandled_fault_hook`` lives."""
    global _hook_module
    _hook_module = module


def register_mesh(mesh: Any) -> None:
    _meshes[mesh.name] = mesh


# SV-8: the keepers of meshes by mesh name (restart.py), each a function of a MeshFailure
# returning "quiet", "tell" or None. Guarded by _lock.
_keepers: Dict[str, Callable[[MeshFailure], Optional[str]]] = {}


def keep_mesh(mesh_name: str, keeper: Optional[Callable[[MeshFailure], Optional[str]]]) -> None:
    """Makes ``keeper`` see the failures of mesh ``mesh_name`` first (SV-8); None: no more."""
    with _lock:
        if keeper is None:
            _keepers.pop(mesh_name, None)
        else:
            _keepers[mesh_name] = keeper


def _kept(failure: MeshFailure) -> Optional[str]:
    """What the keeper of the failed mesh did with the failure (SV-8); None: not kept."""
    with _lock:
        keeper = _keepers.get(failure.mesh_name)
    return keeper(failure) if keeper is not None else None


def start() -> None:
    """Failures of meshes owned by this process's root go to the hook thread (idempotent)."""
    global _thread
    with _lock:
        if _thread is not None:
            return
        _mesh.serve_faults()
        _thread = threading.Thread(target=_fault_main, name="podium-faults", daemon=True)
        _thread.start()


def _fault_main() -> None:
    while True:
        with _busy:
            if _stopping:
                return
            d = _mesh.next_fault(_UNTIL_WOKEN_S)
            if d is not None:
                _run_hook(MeshFailure(d))


# The failures this process's root was told of, newest last, whether a keeper or the
# hook handled them: what the dashboard shows as recent failures (DS-2, podium.dashboard).
recent_failures: "collections.deque[tuple]" = collections.deque(maxlen=100)


def _run_hook(failure: MeshFailure) -> None:
    recent_failures.append((time.time(), failure))
    if _kept(failure) is not None:  # a restart policy or a service handles it (SV-8)
        return
    hook = getattr(_hook_module, "unhandled_fault_hook", unhandled_fault_hook)
    try:
        hook(failure)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        _exit_process(code)
    except BaseException:
        sys.stderr.write("podium: unhandled_fault_hook raised; exiting with status 1:\n")
        traceback.print_exc()
        _exit_process(1)


def _exit_process(code: int) -> None:
    """Ends this process with `code` after its atexit handlers (podium's own stop the procs)."""
    global _exiting, _exit_thread
    with _lock:
        first = not _exiting
        if first:
            _exiting, _exit_thread = True, threading.get_ident()
    if not first:
        _wait_for_exit_elsewhere()
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait_for_exit_elsewhere() -> None:
    """Another thread is ending the process (_exit_process): its atexit handlers stop the
    procs, then it calls os._exit with the hook's status. This thread (typically the main
    thread, finishing the program or unwinding a SupervisionError at the same moment) must
    neither finish first with its own status, which would lose the failure, nor run the
    interpreter's finalization under that thread's shutdown. So it waits for that thread's
    os._exit, which is the one exit path: there is no second timer here. The exiting thread's
    own waits are bounded where they are timed, in C++ (stopping procs: ME-8, the
    runtime's shutdown: ME-10)."""
    if _exit_thread == threading.get_ident():
        return  # this thread is the one ending the process
    threading.Event().wait()  # os._exit on the exiting thread ends this wait with the process


def at_exit() -> None:
    """Called by podium's atexit handler first: stops the hook thread and runs the hook for
    failures raised before the program ended (they may arrive just after the caller saw its
    SupervisionError), so a fault is never lost to a race with the exit. If another thread
    is already ending the process for a failure, this waits for it to do so."""
    global _stopping
    with _lock:
        exiting = _exiting
        if not exiting and _thread is None:
            return
        if not exiting:
            _stopping = True
    if exiting:
        _wait_for_exit_elsewhere()
        return
    _mesh.interrupt_faults()
    with _busy:  # a failure the thread holds is run (or ends the process) first
        pass
    while True:
        d = _mesh.next_fault(_EXIT_DRAIN_S)
        if d is None:
            return
        _run_hook(MeshFailure(d))


# --- an owner actor's side: __supervise__ out of band of its calls (SV-6, SV-7) -------------
#
# server.py's _ActorServer inherits OwnerSupervision. The Inbox hands supervision items out
# ahead of the calls (SV-6): a sync actor runs __supervise__ after the call in progress and
# before the queued ones; an async actor runs it as a task of its event loop, one failure at a
# time, which interleaves with an endpoint at any await (as Monarch does). A failure the owner
# does not handle fails it at once: its calls in progress are answered with SupervisionError
# and cancelled (async), and later ones are refused.
#
# SV-7: a child's failure does not reach the owner's own code before its __supervise__ ran: a
# call on a mesh the actor owns that fails because that actor failed or its proc exited raises
# in the owner only after __supervise__ has handled that actor's failure (an async endpoint
# awaits it; a sync endpoint in .get() runs the waiting supervision itself, on its thread).

# SV-7's wait for an actor's failure report, which its proc sends but which may never come
# (the owner stopped that actor meanwhile, SV-2): after this long the error is raised
# without it. (A proc's exit is known at once: the Supervisor says whether it raised it.)
_GATE_WAIT_S = 10.0

# The owner actor served on each actor thread (thread ident -> OwnerSupervision).
_owners: Dict[int, "OwnerSupervision"] = {}


def _is_child_failure(e: BaseException) -> bool:
    return isinstance(e, SupervisionError) and getattr(e, "_child_failure", False)


class _Gate:
    """What future.py runs before a failed call's error is raised (SV-7)."""

    @staticmethod
    def before_raise(e: BaseException) -> None:
        if not _is_child_failure(e):
            return
        owner = _owners.get(threading.get_ident())
        if owner is not None and owner.loop is None:  # a sync actor's thread
            owner._gate_sync(e)

    @staticmethod
    def before_raise_async(e: BaseException) -> Any:
        if not _is_child_failure(e):
            return None
        owner = _owners.get(threading.get_ident())
        if owner is None or owner.loop is None or not owner._gated(e):
            return None
        return owner._gate_async(e)


class OwnerSupervision:
    """The supervision half of an actor server (see the section comment above)."""

    inbox: Any
    info: Any
    instance: Any
    loop: Any

    def _init_supervision(self) -> None:
        self._sup_queue: "collections.deque[Dict[str, Any]]" = collections.deque()
        self._sup_task: Any = None
        self._supervised: set = set()  # actor ids whose failure was supervised here
        self._sup_waiters: Dict[str, List[Any]] = {}  # actor id -> asyncio futures (SV-7)
        _owners[threading.get_ident()] = self

    def _end_supervision(self) -> None:
        _owners.pop(threading.get_ident(), None)

    # --- sync actors ----------------------------------------------------------------------

    def _supervise(self, d: Dict[str, Any]) -> None:
        """A mesh this actor spawned failed: __supervise__ handles it (a true return), or this
        actor fails too, which its own owner learns (SV-3)."""
        failure = MeshFailure(d)
        try:
            kept = _kept(failure)  # SV-8
            found = None if kept == "quiet" else self._supervisor_of(failure, kept)
            if found is None:
                return
            token = self._enter()
            try:
                result = found(failure)
                if inspect.isawaitable(result):  # an async __supervise__ on a sync actor
                    loop = asyncio.new_event_loop()
                    try:
                        result = loop.run_until_complete(result)
                    finally:
                        loop.close()
                result = result or kept
            except BaseException as e:
                return self._unhandled(failure, e)
            finally:
                self._leave(token)
            if not result:
                self._unhandled(failure, None)
        finally:
            self._mark_supervised(failure)

    def _gate_sync(self, e: BaseException) -> None:
        """SV-7 on a sync owner's thread: runs the supervision items that come until the one
        for the failed actor of ``e`` has run (or the owner failed)."""
        deadline = time.monotonic() + _GATE_WAIT_S
        while self._gated(e):
            left = deadline - time.monotonic()
            item = self.inbox.next(left, True) if left > 0 else None
            if item is None:
                return
            self._supervise(item.failure)

    # --- async actors ---------------------------------------------------------------------

    def _take_supervision(self, first: Optional[Dict[str, Any]] = None) -> None:
        """Moves the supervision items of the Inbox to the supervision task (started if it
        is not running): called whenever the Inbox's eventfd fires, even while the serve loop
        awaits an endpoint."""
        queue = self._sup_queue
        if first is not None:
            queue.append(first)
        while True:
            item = self.inbox.next(0, True)
            if item is None:
                break
            queue.append(item.failure)
        if queue and (self._sup_task is None or self._sup_task.done()):
            self._sup_task = self.loop.create_task(self._supervise_loop())

    async def _supervise_loop(self) -> None:
        queue = self._sup_queue
        while queue:
            await self._supervise_async(queue.popleft())

    async def _supervise_async(self, d: Dict[str, Any]) -> None:
        failure = MeshFailure(d)
        try:
            kept = _kept(failure)  # SV-8
            found = None if kept == "quiet" else self._supervisor_of(failure, kept)
            if found is None:
                return
            token = self._enter()
            try:
                result = found(failure)
                if inspect.isawaitable(result):
                    result = await result
                result = result or kept
            except asyncio.CancelledError:  # the actor stops: the failure goes with it
                return
            except BaseException as e:
                return self._unhandled(failure, e)
            finally:
                self._leave(token)
            if not result:
                self._unhandled(failure, None)
        finally:
            self._mark_supervised(failure)

    async def _gate_async(self, e: BaseException) -> None:
        """SV-7 in an async owner: waits until __supervise__ handled the failed actor of
        ``e`` (or the owner failed)."""
        waiter = self.loop.create_future()
        self._sup_waiters.setdefault(e.actor_id, []).append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), _GATE_WAIT_S)
        except asyncio.TimeoutError:
            pass
        finally:
            waiters = self._sup_waiters.get(e.actor_id)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)

    async def _stop_supervision(self) -> None:
        """The actor stops: a __supervise__ in progress is cancelled, pending ones dropped."""
        self._sup_queue.clear()
        task = self._sup_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # --- both -----------------------------------------------------------------------------

    def _gated(self, e: BaseException) -> bool:
        """Whether the error ``e`` of a call must wait for this owner's __supervise__: its
        actor belongs to a mesh this actor owns, and that failure has not been supervised
        here yet (nor has this actor failed)."""
        if self.inbox.failed or e.actor_id is None or e.actor_id in self._supervised:
            return False
        children = self.info._children if self.info is not None else ()
        if not any(getattr(c, "name", None) == e.mesh_name for c in children):
            return False
        # A proc's exit is raised to its owner before the calls waiting on it fail: one that
        # was not raised (its ProcMesh was stopped, SV-2) will not be supervised. An actor's
        # own failure report may come after its callers' errors: it is awaited.
        return e._child_failure != "proc" or _mesh.fault_raised(e.actor_id)

    def _mark_supervised(self, failure: "MeshFailure") -> None:
        self._supervised.add(failure.actor_id)
        for waiter in self._sup_waiters.pop(failure.actor_id, ()):
            if not waiter.done():
                waiter.set_result(None)
        if self.inbox.failed:  # every waiter goes on: nothing will be supervised here now
            for waiters in self._sup_waiters.values():
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
            self._sup_waiters.clear()

    def _supervisor_of(self, failure: "MeshFailure", kept: Optional[str] = None
                       ) -> Optional[Callable[..., Any]]:
        """The owner's __supervise__, or None when this actor cannot handle the failure (no
        __supervise__, or failed already): then it is unhandled here, unless its keeper
        handled it (SV-8)."""
        fn = getattr(self.instance, "__supervise__", None)
        if fn is None or self.inbox.failed:
            if kept is None:
                self._unhandled(failure, None)
            return None
        return fn

    def _unhandled(self, failure: "MeshFailure", e: Optional[BaseException]) -> None:
        """Fails this actor at once, with its calls in progress (SV-6)."""
        if self.inbox.failed:  # failed already: its owner has been told once
            return
        how = "did not handle" if e is None else "raised in __supervise__ for"
        text = f"{how} the failure of mesh '{failure.mesh_name}' it owns:\n{failure.report()}"
        if e is not None:
            text += f"\n__supervise__ raised:\n{self._format(e)}"
        self.inbox.fail(text)  # the runtime logs the failure, with this text, once
        self._fail_in_flight()

    # Provided by server.py's _ActorServer.
    def _enter(self) -> Any: ...
    def _leave(self, token: Any) -> None: ...
    def _format(self, e: BaseException) -> str: ...
    def _fail_in_flight(self) -> None: ...
