"""Restart policies: an actor mesh whose procs are replaced and whose actors are re-created
when one of them fails (``ProcMesh.spawn(name, Cls, ..., restart=RestartPolicy(...))``).
A service's replicas (podium.service) are kept by the same machinery, a Keeper each.

A Keeper holds one mesh's current incarnation (its ActorMesh, and the ProcMesh it spawned
for it, if any). The failures of its incarnations reach it first (supervision SV-8).

Invariants:
  RS-1 A failure of the current incarnation (an actor failed, or its proc ended), reported
       by supervision or seen by a call through the mesh, whichever comes first, starts one
       restart of that incarnation (failures of its other ranks, or of older incarnations,
       start none), and the owner's ``__supervise__`` still runs for it (its answer does not
       fail the owner; the root's unhandled_fault_hook is not run). Once ``max_restarts``
       restarts were made, the next failure is left to the owner as without a policy: it
       fails the owner, or reaches unhandled_fault_hook at the root.
  RS-2 A restart waits its backoff (``backoff * backoff_factor**(k-1)``, at most
       ``max_backoff`` s), stops the failed incarnation's actors and the procs the policy
       spawned for it, spawns new procs and actors, restores every rank from the state its
       ``__checkpoint__`` returned last (when the class defines ``__checkpoint__`` and
       ``__restore__``), and only then makes the new incarnation current: no call reaches a
       new actor before its ``__restore__`` ran. A restart whose spawn or restore fails counts
       as a restart and is tried again while restarts are left.
  RS-3 A call made while the mesh restarts raises RestartingError at once
       (``on_restart="fail"``), or waits for the new incarnation at most ``wait_timeout`` s
       and then raises RestartingError (``on_restart="wait"``). Both name the mesh, the
       failure and the restart. Calls in flight on the failed incarnation fail with its
       SupervisionError; they are never sent again.
  RS-4 With ``checkpoint="after_call"`` (the default; only for classes that define
       ``__checkpoint__``) a call through the mesh resolves only once the checkpoint taken
       right after it (every rank's ``__checkpoint__``) is stored; ``"on_request"`` takes
       one only on ``checkpoint()``. A restart restores the newest stored checkpoint.
  RS-5 ``stop()`` ends the restarts (a failure reported after it is absorbed, told to
       nobody), waits (bounded) for a restart in progress, stops the current incarnation's
       actors and every ProcMesh the policy spawned: no proc the policy started outlives it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, List, Optional, Tuple, TypeVar

from podium._src import supervision
from podium._src.actor_mesh import ActorMesh, Endpoint
from podium._src.endpoint import EndpointProperty, endpoints_of
from podium._src.errors import SupervisionError
from podium._src.future import CoroFuture, Future
from podium._src.shape import MeshShape

T = TypeVar("T")
logger = logging.getLogger("podium.restart")

# How long a restart may take to stop a failed incarnation, and to start a new one.
STOP_WAIT_S = 20.0
START_WAIT_S = 60.0


def _wake(fut: "asyncio.Future") -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass(frozen=True)
class RestartPolicy:
    """How a mesh restarts (RS-1..RS-5). ``max_restarts``: restarts made before a failure is
    left to the owner. Backoff before restart k: ``backoff * backoff_factor**(k-1)`` s, at
    most ``max_backoff``. ``on_restart``: calls made while it restarts ``"wait"`` (at most
    ``wait_timeout`` s) or ``"fail"`` at once. ``checkpoint``: ``"after_call"`` or
    ``"on_request"``. ``spawn_procs``: a function returning the ProcMesh a restart spawns on
    (default: ``this_host().spawn_procs`` with the failed mesh's extent)."""

    max_restarts: int = 3
    backoff: float = 0.1
    backoff_factor: float = 2.0
    max_backoff: float = 5.0
    on_restart: str = "wait"
    wait_timeout: float = 60.0
    checkpoint: str = "after_call"
    spawn_procs: Optional[Callable[[], Any]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"RestartPolicy: max_restarts is an int >= 0, not "
                             f"{self.max_restarts!r}")
        for field in ("backoff", "max_backoff", "wait_timeout"):
            v = getattr(self, field)
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"RestartPolicy: {field} is a number of seconds >= 0, "
                                 f"not {v!r}")
        if not isinstance(self.backoff_factor, (int, float)) or self.backoff_factor < 1:
            raise ValueError(f"RestartPolicy: backoff_factor is >= 1, not "
                             f"{self.backoff_factor!r}")
        if self.on_restart not in ("wait", "fail"):
            raise ValueError(f"RestartPolicy: on_restart is 'wait' or 'fail', not "
                             f"{self.on_restart!r}")
        if self.checkpoint not in ("after_call", "on_request"):
            raise ValueError(f"RestartPolicy: checkpoint is 'after_call' or 'on_request', "
                             f"not {self.checkpoint!r}")
        if self.spawn_procs is not None and not callable(self.spawn_procs):
            raise TypeError("RestartPolicy: spawn_procs is a function returning a ProcMesh")

    def delay(self, k: int) -> float:
        """The backoff before restart ``k`` (1 for the first), bounded by max_backoff."""
        return min(self.max_backoff, self.backoff * self.backoff_factor ** max(0, k - 1))


class RestartingError(SupervisionError):
    """A call reached a mesh while it restarts (``on_restart="fail"``), or waited longer than
    ``wait_timeout`` for it (RS-3). ``restart``: which restart (1 for the first);
    ``failure``: the MeshFailure that started it."""

    def __init__(self, message: str, failure: Any = None, restart: int = 0) -> None:
        where = {}
        if failure is not None:
            where = dict(mesh_name=failure.mesh_name, rank=failure.rank, point=failure.point,
                         host=failure.host, pid=failure.pid, actor_id=failure.actor_id,
                         cause=failure.cause)
        super().__init__(message, **where)
        self.failure = failure
        self.restart = restart


# The event loop that runs the calls of restarting meshes and services (RS-3, SR-1): started
# on first use, on a daemon thread of its own, so that their Futures run at once (as an actor
# call's do) whether they are awaited, waited on with get(), or neither.
_loop: Optional[asyncio.AbstractEventLoop] = None
_loop_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="podium-service-loop",
                             daemon=True).start()
        return _loop


class Started(CoroFuture):
    """A Future whose coroutine runs at once on the background loop (``await`` it or
    ``get()`` it, from any thread or event loop)."""

    __slots__ = ()

    def __init__(self, coro: Any) -> None:
        super().__init__(coro)
        self._started = True
        asyncio.run_coroutine_threadsafe(self._run(), _background_loop())


def _has(cls: type, hook: str) -> bool:
    return callable(getattr(cls, hook, None))


def _raw(mesh: ActorMesh[Any], hook: str) -> Endpoint[Any]:
    """The actor's ``hook`` method (``__checkpoint__``, ``__restore__``) as an endpoint."""
    return Endpoint(mesh, hook, EndpointProperty(getattr(mesh._class, hook)), raw=True)


def _quiet_get(fut: Any, timeout: float, what: str) -> None:
    try:
        fut.get(timeout)
    except Exception as e:  # the incarnation is gone already: said, not raised
        logger.info("%s: %s", what, e)


class _CallFailure:
    """A failure a call saw (its SupervisionError), as the keeper keeps a MeshFailure."""

    def __init__(self, e: SupervisionError) -> None:
        self.mesh_name = e.mesh_name
        self.actor_id = e.actor_id
        self.rank = e.rank
        self.point = e.point
        self.host = e.host
        self.pid = e.pid
        self.cause = e.cause
        self._report = e.message

    def report(self) -> str:
        return self._report


class Keeper:
    """Keeps one mesh alive (RS-1..RS-5). ``respawn(gen)`` returns ``(procs, mesh)``: the
    ProcMesh it spawned (stopped with the incarnation) and the ActorMesh, not yet
    initialized. ``quiet``: failures are not told to the owner and exhausted restarts leave
    the keeper "failed" instead of failing the owner (a service's replica)."""

    def __init__(self, what: str, cls: type, respawn: Callable[[int], Tuple[Any, Any]],
                 policy: RestartPolicy, quiet: bool = False) -> None:
        self.what = what
        self.cls = cls
        self.policy = policy
        self._respawn = respawn
        self._quiet = quiet
        # The spawner's context: restarts spawn as it did (the same owner supervises them).
        self._ctx = contextvars.copy_context()
        self._cond = threading.Condition()  # guards every field below
        # Coroutines of current_async() waiting for a change: (their loop, a future to set).
        self._async_waiters: List[Tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self.state = "starting"  # running, restarting, failed, stopped
        self.gen = 0
        self.mesh: Any = None
        self.procs: Any = None  # the ProcMesh spawned for the current incarnation, if any
        self.restarts = 0
        self.failure: Any = None  # the last MeshFailure
        self.error: Optional[str] = None  # why it is failed
        self._states: Optional[List[Any]] = None  # the newest checkpoint, per rank
        self._thread: Optional[threading.Thread] = None
        # The incarnation whose failure started the restart in progress, and a failure of
        # the one a restart (or start_first) is bringing up, which must not become current.
        self._failed_name: Optional[str] = None
        self._pending: Any = None
        self.checkpoints = _has(cls, "__checkpoint__")
        self.restores = self.checkpoints and _has(cls, "__restore__")

    # --- incarnations ---------------------------------------------------------------------

    def start(self, procs: Any, mesh: Any, running: bool = True) -> None:
        """Incarnation 0: ``mesh`` (on ``procs`` when the keeper spawned them)."""
        with self._cond:
            self.procs, self.mesh = procs, mesh
            if running:
                self.state = "running"
            self._notify()
        supervision.keep_mesh(mesh.name, self._on_failure)

    def start_first(self, timeout: float = START_WAIT_S) -> None:
        """Spawns incarnation 0 with ``respawn(0)`` and waits until it is up (raises why
        not; what it spawned is stopped)."""
        # In the spawner's context: the same owner supervises it.
        procs, mesh = self._ctx.copy().run(self._respawn, 0)
        self.start(procs, mesh, running=False)
        try:
            mesh.initialized.get(timeout)
            with self._cond:
                pending, self._pending = self._pending, None
                if pending is None and self.state == "starting":
                    self.state = "running"
                self._notify()
            if pending is not None:  # it failed as it came up
                raise SupervisionError(f"{self.what} failed as it started: "
                                       f"{pending.report()}")
        except BaseException:
            self.stop(STOP_WAIT_S)
            raise

    def _on_failure(self, failure: Any) -> Optional[str]:
        """SV-8: the keeper's answer to a failure of one of its meshes (RS-1)."""
        tell = "quiet" if self._quiet else "tell"
        with self._cond:
            if self.state == "stopped":
                return "quiet"  # late news of what stop() stopped
            if self.mesh is None or failure.mesh_name != self.mesh.name:
                return tell  # an older incarnation's, or one being started by a restart
            if self.state in ("starting", "restarting"):
                # Another rank of the incarnation being restarted is not news; the one being
                # brought up failed: its start or restart fails with it.
                if failure.mesh_name != self._failed_name:
                    self._pending = failure
                return tell
            self.failure = failure
            if self.restarts >= self.policy.max_restarts:
                self.state = "failed"
                self.error = (f"{self.what} failed after {self.restarts} restart(s) "
                              f"(max_restarts={self.policy.max_restarts}): "
                              f"{failure.report()}")
                self._notify()
                answer: Optional[str] = "quiet" if self._quiet else None
            else:
                self.state = "restarting"
                self._failed_name = failure.mesh_name
                self.restarts += 1
                k = self.restarts
                self._thread = threading.Thread(
                    target=self._ctx.copy().run, args=(self._restart, k),
                    name="podium-restart", daemon=True)
                self._thread.start()
                answer = tell
                self._notify()
        if answer == "quiet" and self.state == "failed":
            logger.error("%s", self.error)
        elif answer is not None:
            logger.warning("%s: restarting (restart %d of at most %d) after: %s", self.what,
                           self.restarts, self.policy.max_restarts, failure.report())
        return answer

    def call_failed(self, mesh: Any, e: BaseException) -> None:
        """A call on incarnation ``mesh`` raised ``e``: when ``e`` says that its actor
        failed or its proc ended, the restart starts now, without waiting for the
        supervision event (which a sync owner busy in an endpoint handles only after it)."""
        if not isinstance(e, SupervisionError) or not getattr(e, "_child_failure", None):
            return
        with self._cond:
            if self.state != "running" or mesh is not self.mesh:
                return
        self._on_failure(_CallFailure(e))

    def _restart(self, k: int) -> None:
        """RS-2, on a thread of its own, in the spawner's context."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self.state == "stopped", self.policy.delay(k))
                if self.state == "stopped":
                    return
                old_mesh, old_procs = self.mesh, self.procs
                gen = self.gen + 1
            self._retire(old_mesh, old_procs)
            try:
                procs, mesh = self._respawn(gen)
            except Exception as e:
                procs, mesh, error = None, None, e
            else:
                error = None
                with self._cond:
                    self.procs, self.mesh, self.gen = procs, mesh, gen
                    self._pending = None
                supervision.keep_mesh(mesh.name, self._on_failure)
                try:
                    mesh.initialized.get(START_WAIT_S)
                    self._restore(mesh)
                except Exception as e:
                    error = e
            with self._cond:
                if self.state == "stopped":
                    break  # stop() stops what this made
                if error is None and self._pending is not None:
                    error = SupervisionError(self._pending.report())
                self._pending = None
                self._failed_name = self.mesh.name if self.mesh is not None else None
                if error is None:
                    self.state = "running"
                    self._notify()
                    logger.warning("%s: restarted (restart %d)", self.what, k)
                    break
                if self.restarts >= self.policy.max_restarts:
                    self.state = "failed"
                    self.error = (f"{self.what}: restart {k} failed and no restart is left "
                                  f"(max_restarts={self.policy.max_restarts}): {error}")
                    self._notify()
                    logger.error("%s", self.error)
                    break
                self.restarts += 1
                k = self.restarts
                logger.warning("%s: restart failed (%s); trying again", self.what, error)

    def _retire(self, mesh: Any, procs: Any) -> None:
        """Stops a failed incarnation: its actors, and the procs spawned for it."""
        if mesh is not None:
            _quiet_get(mesh.stop(), STOP_WAIT_S, f"{self.what}: stopping the failed actors")
        if procs is not None and not procs._shared.stopped:
            _quiet_get(procs.stop(), STOP_WAIT_S, f"{self.what}: stopping the failed procs")

    def _restore(self, mesh: Any) -> None:
        with self._cond:
            states = self._states
        if not self.restores or states is None:
            return
        ep = _raw(mesh, "__restore__")
        futs = []
        for rank, state in enumerate(states):
            parts = [ep._meta(rank), *ep._parts((state,), {})]
            futs.append(ep._single(mesh._core.call_rank(rank, "__restore__", parts), rank))
        for f in futs:
            f.get(START_WAIT_S)

    # --- calls ----------------------------------------------------------------------------

    def _notify(self) -> None:
        """Under the lock: a field changed. Wakes the threads waiting on the condition and the
        coroutines of current_async(), each on its own loop (no poll)."""
        self._cond.notify_all()
        waiters, self._async_waiters = self._async_waiters, []
        for loop, fut in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_wake, fut)

    def watch(self, loop: asyncio.AbstractEventLoop) -> "asyncio.Future[None]":
        """A future of ``loop`` that resolves at this keeper's next change (_notify): a
        coroutine waiting on several keepers registers with each, checks, then awaits the
        first (no poll, no lost wake-up)."""
        with self._cond:
            fut = loop.create_future()
            self._async_waiters.append((loop, fut))
            return fut

    def _now(self) -> Any:
        """Under the lock: the current ActorMesh if it runs, None while it (re)starts and
        calls wait; raises as RS-3 says otherwise."""
        if self.state == "running":
            return self.mesh
        if self.state == "stopped":
            raise SupervisionError(f"{self.what} was stopped")
        if self.state == "failed":
            raise SupervisionError(self.error or f"{self.what} failed")
        if self.state == "restarting" and self.policy.on_restart == "fail":
            raise self._restarting("is restarting")
        return None

    def current(self, timeout: Optional[float] = None) -> Any:
        """The current incarnation's ActorMesh, as RS-3 says (blocks while it restarts)."""
        wait = self.policy.wait_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                mesh = self._now()
                if mesh is not None:
                    return mesh
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._restarting(f"did not come back within {wait:g} s")
                self._cond.wait(left)

    def _restarting(self, how: str) -> RestartingError:
        f = self.failure
        cause = f.report() if f is not None else "starting"
        return RestartingError(f"{self.what} {how} (restart {self.restarts} of at most "
                               f"{self.policy.max_restarts}) after: {cause}", f, self.restarts)

    async def current_async(self, timeout: Optional[float] = None) -> Any:
        """current() for a coroutine: waits for the change that ends the restart (woken by
        _notify), bounded by the timeout, never blocking the loop."""
        wait = self.policy.wait_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                mesh = self._now()
                if mesh is not None:
                    return mesh
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._restarting(f"did not come back within {wait:g} s")
                changed = loop.create_future()
                self._async_waiters.append((loop, changed))
            try:
                await asyncio.wait_for(changed, left)
            except asyncio.TimeoutError:
                pass

    async def checkpoint_async(self, mesh: Any) -> None:
        """Takes every rank's ``__checkpoint__`` of ``mesh`` and stores it, if ``mesh`` is
        still the current incarnation (RS-4)."""
        if not self.checkpoints:
            return
        vm = await _raw(mesh, "__checkpoint__").call()
        states = list(vm.values())
        with self._cond:
            if mesh is self.mesh:
                self._states = states

    @property
    def auto_checkpoint(self) -> bool:
        return self.checkpoints and self.policy.checkpoint == "after_call"

    def stop(self, timeout: float = STOP_WAIT_S) -> None:
        """RS-5."""
        with self._cond:
            if self.state == "stopped" and self.mesh is None:
                return
            self.state = "stopped"
            self._notify()
            thread = self._thread
        # Its mesh names stay kept: a failure reported after the stop is absorbed (RS-5).
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout + START_WAIT_S)
        with self._cond:
            mesh, procs = self.mesh, self.procs
            self.mesh = None
        if mesh is not None:
            _quiet_get(mesh.stop(), timeout, f"{self.what}: stopping the actors")
        if procs is not None and not procs._shared.stopped:
            procs.stop().get(timeout)


class RestartingActorMesh(MeshShape, Generic[T]):
    """What ``ProcMesh.spawn(..., restart=RestartPolicy(...))`` returns: an actor mesh whose
    failed procs are replaced and whose actors are re-created (RS-1..RS-5). Endpoints have
    call, call_one, choose and broadcast, sent to the current incarnation."""

    def __init__(self, keeper: Keeper) -> None:
        self._keeper = keeper

    @property
    def _region(self) -> Any:
        mesh = self._keeper.mesh
        if mesh is None:
            raise SupervisionError(f"{self._keeper.what} was stopped")
        return mesh._region

    @property
    def name(self) -> str:
        return self.current.name

    @property
    def current(self) -> ActorMesh[T]:
        """The current incarnation's ActorMesh (waits, or raises, as RS-3 says)."""
        return self._keeper.current()

    @property
    def restarts(self) -> int:
        return self._keeper.restarts

    @property
    def state(self) -> str:
        """"running", "restarting", "failed" or "stopped"."""
        return self._keeper.state

    @property
    def initialized(self) -> "Future[None]":
        return self.current.initialized

    def checkpoint(self) -> "Future[None]":
        """Takes and stores every rank's ``__checkpoint__()`` now (RS-4)."""
        keeper = self._keeper
        if not keeper.checkpoints:
            raise TypeError(f"{keeper.cls.__qualname__} defines no __checkpoint__")

        async def run() -> None:
            await keeper.checkpoint_async(await keeper.current_async())

        return Started(run())

    def stop(self) -> "Future[None]":
        """Stops the actors and the procs the policy spawned; no restart follows (RS-5)."""
        keeper = self._keeper

        async def run() -> None:
            await asyncio.get_running_loop().run_in_executor(None, keeper.stop)

        return Started(run())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in endpoints_of(self._keeper.cls):
            raise AttributeError(f"{self._keeper.cls.__qualname__} has no endpoint '{name}'")
        ep = self.__dict__[name] = _RestartingEndpoint(self._keeper, name)
        return ep

    def __reduce__(self):
        raise TypeError(f"{self._keeper.what} has a restart policy: it stays in the process "
                        f"that spawned it; pass its current incarnation (.current) instead")

    def __repr__(self) -> str:
        k = self._keeper
        return f"<RestartingActorMesh {k.what} {k.state}, {k.restarts} restart(s)>"


class _RestartingEndpoint:
    """An endpoint of a RestartingActorMesh: each adverb goes to the current incarnation."""

    def __init__(self, keeper: Keeper, name: str) -> None:
        self._keeper = keeper
        self._name = name

    def _send(self, adverb: str, args: tuple, kwargs: dict) -> "Future[Any]":
        keeper, name = self._keeper, self._name

        async def run() -> Any:
            mesh = await keeper.current_async()
            try:
                result = await getattr(getattr(mesh, name), adverb)(*args, **kwargs)
            except SupervisionError as e:
                keeper.call_failed(mesh, e)
                raise
            if keeper.auto_checkpoint:
                await keeper.checkpoint_async(mesh)  # RS-4
            return result

        return Started(run())

    def call(self, *args: Any, **kwargs: Any) -> "Future[Any]":
        return self._send("call", args, kwargs)

    def call_one(self, *args: Any, **kwargs: Any) -> "Future[Any]":
        return self._send("call_one", args, kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> "Future[Any]":
        return self._send("choose", args, kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Fire and forget to the current incarnation; while the mesh restarts this raises
        RestartingError (``on_restart="fail"``) or waits as a call does."""
        getattr(self._keeper.current(), self._name).broadcast(*args, **kwargs)


def spawn(procs: Any, name: str, Class: type, args: tuple, kwargs: dict,
          this_host: Callable[[], Any]) -> RestartingActorMesh[Any]:
    """``procs.spawn(name, Class, *args, restart=policy, **kwargs)`` (ProcMesh.spawn)."""
    kwargs = dict(kwargs)
    policy = kwargs.pop("restart")
    extent = procs.extent
    per_host = dict(zip(extent.labels, extent.sizes))

    def respawn(gen: int) -> Tuple[Any, Any]:
        pm = policy.spawn_procs() if policy.spawn_procs is not None else \
            this_host().spawn_procs(per_host=per_host)
        # A name of its own per incarnation: failures of an older one are told apart (RS-1).
        return pm, pm.spawn(f"{name}-restart{gen}", Class, *args, **kwargs)

    mesh = procs.spawn(name, Class, *args, **kwargs)
    keeper = Keeper(f"actor mesh '{name}' of {Class.__qualname__}", Class, respawn, policy)
    keeper.start(None, mesh)
    return RestartingActorMesh(keeper)
