"""HostMesh, ProcMesh, this_host(), this_proc(), get_or_spawn_controller(), and starting the
runtime of this process.

The first call that needs the runtime starts the controller runtime in C++
(podium._core.mesh.init_controller), which spawns procs as ``python -m podium._src.proc``.

Spawn message layout (read by server.py): part 0 is the pickled spawn meta dict —
``sys_path``, ``labels``/``sizes``/``base_ranks`` (the region spawned on), ``proc_mesh`` (the
ProcMesh, for context().actor_instance.proc_mesh), ``registry`` (the controller's
get_or_spawn_controller registry, an ActorMesh, or None) and ``bootstrap`` (None, "run": this
actor runs the procs' bootstrap function, or "wait": wait for it before __init__) — then the
cloudpickled ``(Class, args, kwargs)``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import pickle
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Type, TypeVar

from podium._core import mesh as _mesh
from podium._core import ndslice as _nd
from podium._src import context, logs, pickling, runtime, server, supervision, tls
from podium._src.actor_mesh import ActorMesh, _decode_bootstrap, _decode_none
from podium._src.context import actor_context
from podium._src.endpoint import Actor, check_actor_class, check_call, endpoint
from podium._src.errors import PROC_MESH_IS_STOPPED, SupervisionError
from podium._src.future import Future
from podium._src.runtime import enable_transport, ensure_runtime
from podium._src.shape import _RegionView, MeshShape, select

T = TypeVar("T")

# ProcMesh.stop(): how long the procs have to exit before they are killed.
STOP_GRACE_MS = 5000
# ProcMesh.stop(): how long the actors' stops (drain + __cleanup__) may take before the procs
# are asked to exit anyway.
STOP_ACTORS_MS = 10000
BOOTSTRAP_NAME = "podium-bootstrap"
REGISTRY_NAME = "podium-controllers"


def attach_to_workers(*, workers: Any, name: Optional[str] = None,
                      private_key: Any = None, ca: Any = "trust_all_connections") -> "HostMesh":
    """The workers (``python -m podium worker --listen tcp://0.0.0.0:PORT`` on each host) as a
    HostMesh of extent ``{"hosts": N}``, at once; ``.initialized`` resolves once every worker
    accepted this controller, or raises naming the first that refused (a wrong secret, a
    certificate it does not trust) or did not answer in time (``PODIUM_ATTACH_TIMEOUT_MS``,
    default 10 s). Workers are ``tcp://HOST:PORT`` strings, or Futures of them. Starts podium
    on TCP if nothing started it yet (``enable_transport("tcp")``).

    TLS: ``ca`` (PEM bytes or a path: the CA bundle every process's certificate chains to)
    and ``private_key`` (PEM bytes or a path: one PEM with this controller's private key and
    its certificate chain, leaf first) turn on mutual TLS for every TCP connection of this
    process and of the procs it starts; they must come before podium starts in this process.
    ``ca="trust_all_connections"`` (the default) with no key leaves TLS to the environment
    (``PODIUM_TLS_CERT``, ``PODIUM_TLS_KEY``, ``PODIUM_TLS_CA``), off when those are unset."""
    tls.configure(ca, private_key, "attach_to_workers",
                  running=runtime.running() or _mesh.is_proc())
    addrs = []
    for w in list(workers):
        if isinstance(w, Future):
            w = w.get()
        if not isinstance(w, str):
            raise TypeError(f"attach_to_workers: a worker is 'tcp://HOST:PORT', not {w!r}")
        addrs.append(w)
    if not addrs:
        raise ValueError("attach_to_workers: no workers given")
    if not runtime.running() and runtime.listen_address() is None and not _mesh.is_proc():
        enable_transport("tcp")
    ensure_runtime()
    hm = HostMesh(None, _mesh.HostMesh.attach(addrs))
    hm._name = name
    return hm


def _init_signature(cls: type) -> Any:
    try:
        return inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
                                  inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                                  inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])


def _check_spawn(Class: Any, args: tuple, kwargs: dict) -> None:
    check_actor_class(Class)
    check_call(f"{Class.__qualname__}()", _init_signature(Class), args, kwargs)


# --- HostMesh -------------------------------------------------------------------------------


class HostMesh(MeshShape):
    """This host, as a mesh (no dimensions for this_host(); reshaping gives it dimensions of
    size 1, which spawn_procs keeps in front of ``per_host``)."""

    def __init__(self, region: Optional["_nd.Region"] = None, core: Any = None) -> None:
        # core: the C++ HostMesh of attached workers (attach_to_workers); None: this host.
        self._core = core
        self._name: Optional[str] = None
        if region is None:
            region = core.region if core is not None else _nd.Region(_nd.Extent([], []))
        self._r = region

    @property
    def _region(self) -> "_nd.Region":
        return self._r

    def _reshaped(self, op: Callable[[Any], Any]) -> "HostMesh":
        return HostMesh(op(self._r), self._core)

    def slice(self, **kwargs: Any) -> "HostMesh":
        return HostMesh(select(_RegionView(self._r), kwargs).region, self._core)

    @property
    def initialized(self) -> "Future[None]":
        """Resolves when every worker of this mesh accepted this controller (at once for
        this_host()); raises SupervisionError naming a worker that refused or is unreachable."""
        core = self._core if self._core is not None else _mesh.HostMesh()
        return Future(core.initialized(), _decode_none)

    def shutdown(self) -> "Future[None]":
        """Ends this controller's use of the hosts of this attached mesh (or of this slice of
        it): each worker kills the procs it runs for this controller, persistent or not, and
        is free for the next controller to attach. Those procs count as stopped: their ends
        raise no supervision event, calls to their actors raise SupervisionError naming the
        shutdown, and spawn_procs on these hosts raises. Resolves once every worker answered,
        or after ``PODIUM_ATTACH_TIMEOUT_MS`` (a warning names each worker that did not).
        ValueError for this_host(): stop its ProcMeshes instead."""
        core = self._core if self._core is not None else _mesh.HostMesh()
        return Future(core.with_region(self._r).shutdown(), _decode_none)

    def hosts(self) -> List[Dict[str, Any]]:
        """Per worker of an attached mesh: its address, host name, whether it attached, and
        why it failed (None while it serves)."""
        if self._core is None:
            return []
        return [{"worker": w, "hostname": h, "attached": a, "failure": f}
                for (w, h, a, f) in self._core.hosts()]

    def spawn_procs(
        self,
        per_host: Optional[Dict[str, int]] = None,
        bootstrap: Optional[Callable[[], Any]] = None,
        name: Optional[str] = None,
    ) -> "ProcMesh":
        """Starts one process per point of ``per_host`` (e.g. ``{"gpus": 8}``) on this host
        and returns their ProcMesh at once; ``.initialized`` resolves when all are up (and have
        run ``bootstrap``, when given: a function, sync or async, that runs in every proc
        before any actor, e.g. to set environment variables). On attached workers, ``name``
        is how a later controller finds these procs again (``proc_mesh``) when the workers
        are persistent; one name per live mesh per worker."""
        ensure_runtime()
        per_host = dict(per_host or {})
        for label, size in per_host.items():
            if not isinstance(label, str) or not isinstance(size, int) or isinstance(size, bool):
                raise TypeError(f"per_host maps dimension names to sizes, got {label!r}: {size!r}")
        if bootstrap is not None and not callable(bootstrap):
            raise TypeError(f"bootstrap must be a function, not {type(bootstrap).__name__}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"spawn_procs: name must be a str, not {name!r}")
        if self._core is not None:
            pm = ProcMesh(self._core.with_region(self._r).spawn_procs(list(per_host.items()),
                                                                     name or ""),
                          _ProcShared(True))
        else:
            host = self._r.extent
            dims = list(zip(host.labels, host.sizes)) + list(per_host.items())
            pm = ProcMesh(_mesh.ProcMesh.spawn_procs(dims), _ProcShared(True))
        if bootstrap is not None:
            pm._shared.bootstrap = True
            pm._shared.bootstrap_mesh = pm._spawn(BOOTSTRAP_NAME, _Bootstrap, (bootstrap,), {},
                                                  "run")
        return pm

    def proc_mesh(self, name: str) -> "ProcMesh":
        """The proc mesh ``name`` that this mesh's persistent workers kept after the controller
        that spawned it (``spawn_procs(..., name=name)``) left. This process owns it from now
        on: it watches its procs, is told when they fail, and can stop them. Blocks until
        every worker answered (bounded by ``PODIUM_ATTACH_TIMEOUT_MS``); raises ValueError
        when a worker keeps no such mesh or the workers' parts do not fit together.
        ``.initialized`` fails naming a proc that ended while no controller was attached."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"proc_mesh(name): name must be a non-empty str, not {name!r}")
        if self._core is None:
            raise ValueError(f"proc_mesh({name!r}): proc meshes are found by name on workers "
                             f"attached with attach_to_workers(), not on this host")
        ensure_runtime()
        return ProcMesh(self._core.with_region(self._r).find_procs(name), _ProcShared(True))

    def __reduce__(self):
        if self._core is not None:
            raise TypeError("an attached HostMesh stays in the controller that attached it; "
                            "send the ProcMesh it spawned instead")
        return (HostMesh, (self._r,))

    def __repr__(self) -> str:
        return f"<HostMesh {self.extent}>"


# --- ProcMesh -------------------------------------------------------------------------------


class _ProcShared:
    """What the slices of one ProcMesh share in this process."""

    def __init__(self, owned: bool, bootstrap: bool = False) -> None:
        self.owned = owned  # this process spawned the procs: it alone can stop them
        self.bootstrap = bootstrap  # actors wait for the procs' bootstrap before __init__
        self.bootstrap_mesh: Optional[ActorMesh[Any]] = None
        self.lock = threading.Lock()  # guards actor_meshes, stopped
        self.actor_meshes: List[Any] = []  # C++ ActorMesh handles spawned from here
        self.stopped = False


class ProcMesh(MeshShape):
    """OS processes, shaped as a mesh; ``spawn`` starts one actor in each. Picklable: an actor
    that receives one can spawn on it (only the process that spawned the procs stops them)."""

    def __init__(self, core: Any, shared: _ProcShared) -> None:
        self._core = core
        self._shared = shared

    @property
    def _region(self) -> "_nd.Region":
        return self._core.region

    @property
    def initialized(self) -> "Future[None]":
        """Resolves when every proc is up (and has run its bootstrap); raises
        SupervisionError if one exited first."""
        if self._shared.bootstrap_mesh is not None:  # a failed bootstrap: ActorError (MW-2)
            return Future(self._shared.bootstrap_mesh._core.initialized(), _decode_bootstrap)
        return Future(self._core.initialized(), _decode_none)

    def spawn(self, name: str, Class: Type[T], *args: Any, **kwargs: Any) -> ActorMesh[T]:
        """Creates one ``Class(*args, **kwargs)`` per proc, named ``name``; returns the
        ActorMesh at once (``.initialized`` resolves after every ``__init__``)."""
        if not isinstance(name, str):
            raise TypeError(f"spawn(name, Class, ...): name must be a str, not {name!r}")
        _check_spawn(Class, args, kwargs)
        return self._spawn(name, Class, args, kwargs, "wait" if self._shared.bootstrap else None)

    def _spawn(self, name: str, Class: type, args: tuple, kwargs: dict,
               bootstrap: Optional[str]) -> ActorMesh[Any]:
        with self._shared.lock:
            if self._shared.stopped:
                raise SupervisionError(f"{PROC_MESH_IS_STOPPED}: cannot spawn '{name}' on "
                                       f"the proc mesh {self.extent}")  # MW-2
        region = self._core.region
        meta = pickle.dumps({
            "sys_path": list(sys.path),
            "labels": list(region.extent.labels),
            "sizes": list(region.extent.sizes),
            "base_ranks": list(region.base_ranks()),
            "proc_mesh": self,
            "registry": _registry_for_spawn(Class),
            "bootstrap": bootstrap,
            "creator": context.context().actor_instance._as_creator(),
        })
        try:
            parts = pickling.dumps((Class, args, kwargs))
        except Exception as e:
            pickling.dumps_call(f"{Class.__qualname__}()", args, kwargs)  # names the argument
            raise TypeError(f"cannot pickle actor class {Class.__qualname__}: {e}") from e
        ctx = actor_context()
        # The owner (supervision): the actor spawning it, else this process's root; podium's
        # bootstrap actors have none (a failed bootstrap fails `initialized`).
        # The singletons of get_or_spawn_controller belong to the controller, not its registry.
        owner = None if bootstrap == "run" else (
            str(ctx.actor_instance.actor_id)
            if ctx is not None and ctx.actor_instance.name != REGISTRY_NAME else "")
        core = self._core.spawn("python", name, [meta, *parts], owner)
        mesh = ActorMesh(Class, core, self)
        if bootstrap == "run" or Class is _ControllerController:
            return mesh  # podium's own actors: no owner stops them
        supervision.register_mesh(mesh)
        if ctx is not None:
            ctx.actor_instance._add_child(mesh)  # stopped before the spawner's __cleanup__
        if self._shared.owned:
            with self._shared.lock:
                self._shared.actor_meshes.append(core)
        return mesh

    def actor_mesh(self, name: str, Class: Type[T]) -> ActorMesh[T]:
        """The actors ``name`` of class ``Class`` that run on these procs already (procs
        found with ``HostMesh.proc_mesh``, whose actors outlived their controller). Returns at
        once; their failures are reported to this process (or to the calling actor) from now
        on, as for a mesh it spawned. ``.initialized`` resolves once every proc confirmed its
        actor, and raises SupervisionError naming a rank whose actor does not exist, failed
        or stopped."""
        if not isinstance(name, str):
            raise TypeError(f"actor_mesh(name, Class): name must be a str, not {name!r}")
        check_actor_class(Class)
        with self._shared.lock:
            if self._shared.stopped:
                raise SupervisionError(f"{PROC_MESH_IS_STOPPED}: cannot reach '{name}' on "
                                       f"the proc mesh {self.extent}")  # MW-2
        ctx = actor_context()
        owner = (str(ctx.actor_instance.actor_id)
                 if ctx is not None and ctx.actor_instance.name != REGISTRY_NAME else "")
        core = self._core.adopt(name, owner)
        mesh = ActorMesh(Class, core, self)
        supervision.register_mesh(mesh)
        if ctx is not None:
            ctx.actor_instance._add_child(mesh)
        if self._shared.owned:
            with self._shared.lock:
                self._shared.actor_meshes.append(core)
        return mesh

    def slice(self, **kwargs: Any) -> "ProcMesh":
        return ProcMesh(select(self._core, kwargs), self._shared)

    def _reshaped(self, op: Callable[[Any], Any]) -> "ProcMesh":
        return ProcMesh(op(self._core), self._shared)

    def stop(self) -> "Future[None]":
        """Stops the actor meshes spawned on these procs from this process (each drains its
        queued messages, stops the meshes its actors spawned, runs ``__cleanup__``), then asks
        every proc to exit, killing those still there after a grace period. Resolves when all
        are gone. Later spawns and calls raise SupervisionError."""
        if not self._shared.owned:
            raise RuntimeError(
                f"the proc mesh {self.extent} was spawned by another process; only that "
                f"process can stop it"
            )
        with self._shared.lock:
            self._shared.stopped = True
            cores, self._shared.actor_meshes = self._shared.actor_meshes, []
        first = [c.stop() for c in cores]
        return Future(self._core.stop_after(first, STOP_ACTORS_MS, STOP_GRACE_MS), _decode_none)

    def logging_option(self, stream_to_client: bool = False,
                       aggregate_window_sec: Optional[int] = None,
                       level: int = logging.INFO) -> "Future[None]":
        """As Monarch's: the procs' log level and whether their output streams to the client
        (or to a file per proc); a Future to await. See logs.py (LG-3)."""
        return logs.logging_option(self, stream_to_client, aggregate_window_sec, level)

    async def __aenter__(self) -> "ProcMesh":
        if self._shared.stopped:
            raise RuntimeError(f"{PROC_MESH_IS_STOPPED}: the proc mesh {self.extent}")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if not self._shared.stopped:
            await self.stop()

    def __reduce__(self):
        return (_rebuild_proc_mesh, (tuple(self._core.state()), self._shared.bootstrap))

    def __repr__(self) -> str:
        return f"<ProcMesh {self.extent}>"


def _rebuild_proc_mesh(state: tuple, bootstrap: bool) -> ProcMesh:
    ensure_runtime()
    return ProcMesh(_mesh.ProcMesh.from_state(*state), _ProcShared(False, bootstrap))


class _Bootstrap(Actor):
    """Runs a ProcMesh's bootstrap function in each of its procs (server.py then lets the
    other actors' constructors run)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        if inspect.iscoroutinefunction(fn):
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(fn())
            finally:
                loop.close()
        else:
            fn()


_this_host = HostMesh()
_local_shared = _ProcShared(True)


def this_host() -> HostMesh:
    """The local host, as a mesh with no dimensions."""
    ensure_runtime()
    return _this_host


def this_proc() -> ProcMesh:
    """This process, as a mesh with no dimensions: actors spawned on it run in-process."""
    ensure_runtime()
    return ProcMesh(_mesh.ProcMesh.this_proc(), _local_shared)


# context().actor_instance.proc_mesh of the client is this_proc() (context.py sits below).
context.set_default_proc_mesh(this_proc)


# --- get_or_spawn_controller ----------------------------------------------------------------


class _ControllerController(Actor):
    """The controller process's registry of singleton actors, by name."""

    def __init__(self) -> None:
        self._controllers: Dict[str, ActorMesh[Any]] = {}

    @endpoint
    def get_or_spawn(self, name: str, Class: type, args: tuple, kwargs: dict) -> ActorMesh[Any]:
        mesh = self._controllers.get(name)
        if mesh is None:
            mesh = this_proc().spawn(name, Class, *args, **kwargs)
            self._controllers[name] = mesh
        return mesh


_registry: Optional[ActorMesh[Any]] = None
_registry_lock = threading.Lock()


def _registry_for_spawn(Class: type) -> Optional[ActorMesh[Any]]:
    """The registry that spawned actors reach get_or_spawn_controller() through: in the
    controller it is spawned (once) on first need; in a proc it came with its actors' spawn."""
    if Class is _ControllerController:
        return None
    if server.in_proc() or server.registry() is not None:
        return server.registry()
    return _controller_registry()


def _controller_registry() -> ActorMesh[Any]:
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = this_proc().spawn(REGISTRY_NAME, _ControllerController)
            server.set_registry(_registry)
        return _registry


def get_or_spawn_controller(name: str, Class: Type[T], *args: Any, **kwargs: Any
                            ) -> "Future[ActorMesh[T]]":
    """The singleton actor ``name`` of the controller process, spawned there (on its
    this_proc()) as ``Class(*args, **kwargs)`` by the first caller, from the controller or any
    actor; later callers get the same actor. Returns a Future of its ActorMesh."""
    if not isinstance(name, str):
        raise TypeError(f"get_or_spawn_controller(name, ...): name must be a str, not {name!r}")
    _check_spawn(Class, args, kwargs)
    ensure_runtime()
    registry = server.registry()
    if registry is None:
        if server.in_proc():
            raise RuntimeError("this proc does not know its controller's registry yet")
        registry = _controller_registry()
    return registry.get_or_spawn.call_one(name, Class, args, kwargs)
