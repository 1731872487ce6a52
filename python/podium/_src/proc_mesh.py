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

Invariants:
  HM-1 ``HostMesh.stop()`` stops exactly the ProcMeshes spawned through that HostMesh object
       and its slices (never those another HostMesh spawned on the same hosts) and keeps the
       hosts for the next spawn_procs; ``shutdown()`` also ends this controller's use of
       attached hosts. A HostMesh unpickled in another process is a reference: its
       ``stop()`` and ``shutdown()`` raise RuntimeError naming why, and it spawns through
       the attaching controller's registry actor (only the controller talks to its workers),
       but the procs belong to the process that asked (HM-2).
  HM-2 Procs that an actor spawns through a HostMesh reference are that actor's, as if it had
       spawned them on its own host: their failures reach its ``__supervise__`` (and fail it
       when unhandled), its ProcMesh stops them (``stop()`` asks the controller, then waits
       until their ends reach this process), and they end with its proc (the controller
       stops them when that proc stops and kills them when it fails; runtime ME-15), so
       stopping the actor's mesh stops them, recursively. The controller's ``stop()`` of
       the original HostMesh stops them too (they were spawned through it), and its exit
       ends them (HA-5).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import pickle
import sys
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Type, TypeVar

from podium._core import mesh as _mesh
from podium._core import ndslice as _nd
from podium._src import context, logs, pickling, runtime, server, supervision, tls
from podium._src import proc_log_read, workspace_sync
from podium._src import restart as _restart
from podium._src.bootstrap_cmd import _launches, _prod, _python_command
from podium._src.actor_mesh import ActorMesh, check_endpoint_names
from podium._src.context import actor_context
from podium._src.endpoint import Actor, check_actor_class, endpoint
from podium._src.endpoint import check_spawn
from podium._src.errors import PROC_MESH_IS_STOPPED, SupervisionError
from podium._src.future import Future
from podium._src.runtime import enable_transport, ensure_runtime
from podium._src.tensor_mesh import TensorMesh
from podium._src.shape import _RegionView, MeshShape, select
from podium._src.mesh_stop import (
    _decode_bootstrap_true,
    _decode_stopped,
    _decode_true,
    _stop_all,
    _stop_through_registry,
)

T = TypeVar("T")

# ProcMesh.stop(): how long the procs have to exit before they are killed.
STOP_GRACE_MS = 5000
# ProcMesh.stop(): how long the actors' stops (drain + __cleanup__) may take before the procs
# are asked to exit anyway.
STOP_ACTORS_MS = 10000


def _check_spawn(Class: Any, args: tuple, kwargs: dict) -> None:
    """The class and its arguments (endpoint.check_spawn), and its endpoints' names."""
    check_spawn(Class, args, kwargs)
    check_endpoint_names(Class)


# spawn_procs: more procs than this on one host is refused up front (a typo of 10**12 once
# reached the C++ layer as a std::bad_alloc).
MAX_PROCS_PER_HOST = 1 << 16

BOOTSTRAP_NAME = "podium-bootstrap"
REGISTRY_NAME = "podium-controllers"


def attach_to_workers(*, workers: Any, name: Optional[str] = None,
                      private_key: Any = None, ca: Any = "trust_all_connections") -> "HostMesh":
    """The workers (``python -m podium worker --listen tcp://0.0.0.0:PORT`` on each host) as a
    HostMesh of extent ``{"hosts": N}``, at once; ``.initialized`` resolves once every worker
    accepted this controller, or raises naming the first that refused (a wrong secret, a
    certificate it does not trust) or did not answer in time (``PODIUM_ATTACH_TIMEOUT_MS``,
    default 10 s; at once, "attach failed" and why, where nothing listens: HA-17). Workers
    are strings, or Futures of them: ``tcp://HOST:PORT``, ``ipc://PATH`` (a worker on this
    host's Unix socket), or ``DIAL@BIND`` as the worker was started (this dials DIAL). Starts
    podium on TCP if nothing started it yet and a worker is on TCP
    (``enable_transport("tcp")``).

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
            raise TypeError(f"attach_to_workers: a worker is 'tcp://HOST:PORT' or "
                            f"'ipc://PATH', not {w!r}")
        addrs.append(w)
    if not addrs:
        raise ValueError("attach_to_workers: no workers given")
    # Workers on Unix sockets are on this host: their procs reach this process however it
    # listens; a TCP worker needs TCP.
    local_only = all(a.startswith("ipc://") for a in addrs)
    if (not local_only and not runtime.running() and runtime.listen_address() is None
            and not _mesh.is_proc()):
        enable_transport("tcp")
    ensure_runtime()
    hm = HostMesh(None, _mesh.HostMesh.attach(addrs))
    hm._name = name
    return hm


# --- HostMesh -------------------------------------------------------------------------------


class _HostShared:
    """What one HostMesh and its slices share in this process: the ProcMeshes spawned through
    them (HostMesh.stop() stops those, and no other mesh's procs on the same hosts), the
    command procs start with (with_python_executable), and whether it was shut down."""

    def __init__(self, command: Any = None, reference: Optional[str] = None) -> None:
        self.lock = threading.Lock()  # guards proc_meshes, shut_down
        self.proc_meshes: List["ProcMesh"] = []
        self.shut_down = False
        self.command = command  # a BootstrapCommand, or None: podium's default
        # Why this HostMesh cannot be stopped or shut down from here (an unpickled copy).
        self.reference = reference
        self.ref: Optional[tuple] = None  # a reference's (controller, key)
        self.core: Any = None  # the C++ HostMesh, once pickled (_host_mesh_ref)
        # (job, dirs) once synced, and the sync's host procs by region (workspace_sync.py):
        # written under lock; spawn_procs reads workspace without it (one reference read).
        self.workspace: Optional[tuple] = None
        self.workspace_hosts: Dict[str, tuple] = {}


class HostMesh(MeshShape):
    """This host, as a mesh (no dimensions for this_host(); reshaping gives it dimensions of
    size 1, which spawn_procs keeps in front of ``per_host``), or the hosts of workers
    attached with attach_to_workers (``{"hosts": N}``). Its lifecycle: HM-1 (module doc)."""

    def __init__(self, region: Optional["_nd.Region"] = None, core: Any = None,
                 shared: Optional[_HostShared] = None) -> None:
        # core: the C++ HostMesh of attached workers (attach_to_workers); None: this host.
        self._core = core
        self._name: Optional[str] = None
        if region is None:
            region = core.region if core is not None else _nd.Region(_nd.Extent([], []))
        self._r = region
        self._host = shared if shared is not None else _HostShared()

    @property
    def _region(self) -> "_nd.Region":
        return self._r

    def _reshaped(self, op: Callable[[Any], Any]) -> "HostMesh":
        return HostMesh(op(self._r), self._core, self._host)

    def slice(self, **kwargs: Any) -> "HostMesh":
        return HostMesh(select(_RegionView(self._r), kwargs).region, self._core, self._host)

    @property
    def is_fake_in_process(self) -> bool:
        """False: podium's hosts are real hosts whose procs are processes of their own."""
        return False

    @property
    def initialized(self) -> "Future[bool]":
        """Resolves to True when every worker of this mesh accepted this controller (at once
        for this_host()); raises SupervisionError naming a worker that refused or is
        unreachable."""
        core = self._core
        if core is None or isinstance(core, _RemoteHosts):  # a reference: its controller's
            core = _mesh.HostMesh()  # resolved at once
        return Future(core.initialized(), _decode_true)

    def with_python_executable(self, python_executable: str) -> "HostMesh":
        """A HostMesh of the same hosts whose spawn_procs starts procs with the interpreter
        ``python_executable`` (a path on the hosts) running podium's proc entry point."""
        if not isinstance(python_executable, str) or not python_executable:
            raise TypeError("with_python_executable: the interpreter is a path, not "
                            f"{python_executable!r}")
        shared = _HostShared(_python_command(python_executable), self._host.reference)
        shared.ref = self._host.ref  # a reference stays one (its spawns go to its controller)
        hm = HostMesh(self._r, self._core, shared)
        hm._name = self._name
        return hm

    def _check_owned(self, what: str) -> None:
        if self._host.reference is not None:
            raise RuntimeError(f"HostMesh.{what}() on {self!r}: {self._host.reference}; only "
                               f"the controller that attached these hosts can {what} them")

    def _take_proc_meshes(self) -> List["ProcMesh"]:
        with self._host.lock:
            meshes, self._host.proc_meshes = self._host.proc_meshes, []
        return meshes

    def stop(self) -> "Future[None]":
        """Stops the ProcMeshes spawned through this HostMesh (and its slices): their actors
        stop, their procs exit. The hosts stay: spawn_procs on this mesh works afterwards
        (HM-1). Raises RuntimeError for a HostMesh received from another process."""
        self._check_owned("stop")
        return _stop_all(self._take_proc_meshes(), None)

    def shutdown(self) -> "Future[None]":
        """Stops the ProcMeshes spawned through this HostMesh, then ends this controller's use
        of the hosts of this attached mesh (or of this slice of it): each worker kills the
        procs it runs for this controller, persistent or not; a worker that is not
        ``--persistent`` then exits (with its zygote), a persistent one is free for the next
        controller to attach. Those procs count as stopped: their ends raise no supervision
        event, calls to their actors raise SupervisionError naming the shutdown, and
        spawn_procs on these hosts raises. Resolves once every worker answered, or after
        ``PODIUM_ATTACH_TIMEOUT_MS`` (a warning names each worker that did not). For
        this_host() it stops the ProcMeshes spawned through it. Raises RuntimeError for a
        HostMesh received from another process."""
        self._check_owned("shutdown")
        with self._host.lock:
            self._host.shut_down = True
        meshes = self._take_proc_meshes()
        if self._core is None:
            return _stop_all(meshes, None)
        return _stop_all(meshes, lambda: self._core.with_region(self._r).shutdown())

    def __enter__(self) -> "HostMesh":
        if self._host.shut_down:
            raise RuntimeError(f"HostMesh has already been shut down ({self!r})")
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._host.shut_down:
            self.shutdown().get()

    async def __aenter__(self) -> "HostMesh":
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> None:
        if not self._host.shut_down:
            await self.shutdown()

    def hosts(self) -> List[Dict[str, Any]]:
        """Per worker of an attached mesh: its address, host name, whether it attached, and
        why it failed (None while it serves)."""
        if self._core is None:
            return []
        if isinstance(self._core, _RemoteHosts):
            raise RuntimeError(f"hosts() of {self!r}: {_REFERENCE}; ask the controller")
        return [{"worker": w, "hostname": h, "attached": a, "failure": f}
                for (w, h, a, f) in self._core.hosts()]

    def spawn_procs(
        self,
        per_host: Optional[Dict[str, int]] = None,
        bootstrap: Optional[Callable[[], Any]] = None,
        name: Optional[str] = None,
        proc_bind: Optional[List[Dict[str, str]]] = None,
        bootstrap_command: Any = None,
    ) -> "ProcMesh":
        """Starts one process per point of ``per_host`` (e.g. ``{"gpus": 8}``) on this host
        and returns their ProcMesh at once; ``.initialized`` resolves when all are up (and have
        run ``bootstrap``, when given: a function, sync or async, that runs in every proc
        before any actor, e.g. to set environment variables). On attached workers, ``name``
        is how a later controller finds these procs again (``proc_mesh``) when the workers
        are persistent; one name per live mesh per worker.

        ``proc_bind``: one dict per proc of a host (``len == prod(per_host.values())``, else
        ValueError), binding that proc's CPUs and NUMA memory before it runs any code
        (``{"cpus": "0-3"}``, ``{"physcpubind": "4"}``, ``{"cpunodebind": "0", "membind":
        "0"}``; LA-1). ``bootstrap_command``: a BootstrapCommand that starts every proc, or a
        function of a proc's Point (host and per_host coordinates) returning one
        (``default_bootstrap_cmd()`` is podium's own)."""
        ensure_runtime()
        per_host = dict(per_host or {})
        for label, size in per_host.items():
            if not isinstance(label, str) or not isinstance(size, int) or isinstance(size, bool):
                raise TypeError(f"per_host maps dimension names to sizes, got {label!r}: {size!r}")
            if size < 1:
                raise ValueError(f"per_host: dimension {label!r} has size {size}; a size is at "
                                 f"least 1")
        if _prod(per_host.values()) > MAX_PROCS_PER_HOST:
            raise ValueError(f"per_host {per_host}: {_prod(per_host.values())} procs per host; "
                             f"at most {MAX_PROCS_PER_HOST}")
        if bootstrap is not None and not callable(bootstrap):
            raise TypeError(f"bootstrap must be a function, not {type(bootstrap).__name__}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"spawn_procs: name must be a str, not {name!r}")
        bootstrap = workspace_sync.wrap_bootstrap(self._host, bootstrap)  # WS-4: synced code
        if self._host.shut_down and self._core is None:  # attached hosts: C++ says why
            raise RuntimeError(f"HostMesh has already been shut down ({self!r})")
        if isinstance(self._core, _RemoteHosts):
            registry = server.registry()
            if registry is None:
                raise RuntimeError(f"spawn_procs on {self!r}: this process does not know the "
                                   "controller that attached these hosts")
            pm, token = registry.spawn_procs_for.call_one(
                self._host.ref, self._r, per_host, bootstrap, name, proc_bind,
                bootstrap_command if bootstrap_command is not None else self._host.command,
                list(_mesh.lineage()),
            ).get()
            pm._shared.owned = True  # HM-2: this process's, stopped through the registry
            pm._shared.remote = (registry, token)
            return pm
        host = self._r.extent
        labels = list(host.labels) + list(per_host)
        sizes = list(host.sizes) + list(per_host.values())
        launches = _launches(labels, sizes, _prod(per_host.values()), proc_bind,
                             bootstrap_command if bootstrap_command is not None
                             else self._host.command)
        if self._core is not None:
            pm = ProcMesh(self._core.with_region(self._r).spawn_procs(list(per_host.items()),
                                                                     name or "", launches),
                          _ProcShared(True))
        else:
            pm = ProcMesh(_mesh.ProcMesh.spawn_procs(list(zip(labels, sizes)), launches),
                          _ProcShared(True))
        if bootstrap is not None:
            pm._shared.bootstrap = True
            pm._shared.bootstrap_mesh = pm._spawn(BOOTSTRAP_NAME, _Bootstrap, (bootstrap,), {},
                                                  "run")
        owner = self._host
        if owner.ref is not None:  # a reference in the controller: the original stops it
            with _attached_lock:
                owner = _attached.get(owner.ref[1])
        if owner is not None:
            with owner.lock:  # the stopped ones need no stop: not kept
                owner.proc_meshes = [p for p in owner.proc_meshes if not p._shared.stopped]
                owner.proc_meshes.append(pm)
        spawned[id(pm)] = pm
        return pm

    def sync_workspace(self, workspace: Any, conda: bool = False,
                       auto_reload: bool = False) -> "Future[None]":
        """Copies ``workspace`` (podium.tools.config.Workspace) to these hosts, onto the
        sys.path of their procs; ``auto_reload`` reloads changed modules (workspace.py)."""
        ensure_runtime()
        return workspace_sync.sync(self, workspace, conda, auto_reload, spawned)

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
        if isinstance(self._core, _RemoteHosts):
            raise RuntimeError(f"proc_mesh({name!r}) on {self!r}: {_REFERENCE}")
        ensure_runtime()
        pm = ProcMesh(self._core.with_region(self._r).find_procs(name), _ProcShared(True))
        spawned[id(pm)] = pm  # podium exec and the dashboard see it as one it spawned
        return pm

    def __reduce__(self):
        if self._core is not None:
            return (_rebuild_host_mesh, (_host_mesh_ref(self), self._r, self._name,
                                         self._host.command))
        return (_rebuild_this_host, (self._r, self._host.command))

    def __repr__(self) -> str:
        return f"<HostMesh {self.extent}>"


# The attached HostMeshes of this controller by id, for the procs that received one pickled
# (_rebuild_host_mesh): their spawn_procs runs here, through the registry actor.
_attached: "weakref.WeakValueDictionary[int, _HostShared]" = weakref.WeakValueDictionary()
_attached_lock = threading.Lock()
spawned: "weakref.WeakValueDictionary[int, ProcMesh]" = weakref.WeakValueDictionary()  # exec
_REFERENCE = ("it is a reference to hosts attached by another process (a HostMesh received "
              "pickled)")


def _host_mesh_ref(hm: "HostMesh") -> tuple:
    """What a pickled attached HostMesh carries: the attaching controller's key for it."""
    if hm._host.ref is not None:  # already a reference: pass the same key on
        return hm._host.ref
    key = id(hm._host)
    with _attached_lock:
        hm._host.core = hm._core
        _attached[key] = hm._host
    return (runtime_id(), key)


def runtime_id() -> str:
    """This process's podium address: which controller a HostMesh reference points to."""
    return str(_mesh.this_proc_id())


def _rebuild_host_mesh(ref: tuple, region: "_nd.Region", name: Optional[str],
                       command: Any) -> "HostMesh":
    ensure_runtime()
    owner, key = ref
    core = None
    if owner == runtime_id():
        with _attached_lock:
            original = _attached.get(key)
        core = original.core if original is not None else None
    shared = _HostShared(command, _REFERENCE)
    shared.ref = ref
    hm = HostMesh(region, core if core is not None else _RemoteHosts(region), shared)
    hm._name = name
    return hm


class _RemoteHosts:
    """The hosts of a HostMesh reference in a process other than the controller that
    attached them: spawn_procs asks that controller (its registry actor) to spawn."""

    def __init__(self, region: "_nd.Region") -> None:
        self.region = region


def _rebuild_this_host(region: "_nd.Region", command: Any) -> "HostMesh":
    return HostMesh(region, None, _HostShared(command))


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
        # HM-2: procs a controller spawned for this process on attached hosts: (its registry,
        # the token it keeps them by); stop() asks it to stop them.
        self.remote: Optional[tuple] = None
        self.log: Any = None  # logs._MeshLogging, once logging_option was called (logs.py)


class ProcMesh(MeshShape, TensorMesh):
    """OS processes, shaped as a mesh; ``spawn`` starts one actor in each. Picklable: an actor
    that receives one can spawn on it (only the process that spawned the procs stops them)."""

    def __init__(self, core: Any, shared: _ProcShared) -> None:
        self._core = core
        self._shared = shared

    @property
    def _region(self) -> "_nd.Region":
        return self._core.region

    @property
    def initialized(self) -> "Future[bool]":
        """Resolves to True when every proc is up (and has run its bootstrap), as Monarch's;
        raises SupervisionError if one exited first, and ActorError if the bootstrap
        function raised (MW-2)."""
        if self._shared.bootstrap_mesh is not None:
            return Future(self._shared.bootstrap_mesh._core.initialized(), _decode_bootstrap_true)
        return Future(self._core.initialized(), _decode_true)

    def spawn(self, name: str, Class: Type[T], *args: Any, **kwargs: Any) -> ActorMesh[T]:
        """Creates one ``Class(*args, **kwargs)`` per proc, named ``name``; returns the
        ActorMesh at once (``.initialized`` resolves after every ``__init__``). With
        ``restart=RestartPolicy(...)``: a RestartingActorMesh (restart.py, RS-1..RS-5)."""
        if not isinstance(name, str):
            raise TypeError(f"spawn(name, Class, ...): name must be a str, not {name!r}")
        if isinstance(kwargs.get("restart"), _restart.RestartPolicy):
            _check_spawn(Class, args, {k: v for k, v in kwargs.items() if k != "restart"})
            return _restart.spawn(self, name, Class, args, kwargs, this_host)
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
        pickling.check_fits(f"the arguments of {Class.__qualname__}()", [meta, *parts])
        ctx = actor_context()
        # The owner (supervision): the actor spawning it, else this process's root; podium's
        # bootstrap actors have none (a failed bootstrap fails `initialized`).
        # The singletons of get_or_spawn_controller belong to the controller, not its registry.
        # podium's internal actors (logs._LogControl) have none either: they end with the procs.
        internal = getattr(Class, "_podium_internal", False)
        owner = None if bootstrap == "run" or internal else (
            str(ctx.actor_instance.actor_id)
            if ctx is not None and ctx.actor_instance.name != REGISTRY_NAME else "")
        core = self._core.spawn("python", name, [meta, *parts], owner)
        mesh = ActorMesh(Class, core, self)
        if bootstrap == "run" or internal or Class is _ControllerController:
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
        check_endpoint_names(Class)
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

    def logs(self, rank: Optional[int] = None, tail: int = 100) -> "Future[List[str]]":
        """The last ``tail`` lines of each proc's log file (or ``rank``'s), prefixed with its
        coordinates, rank and host (proc_log_read.py, PL-3)."""
        return proc_log_read.logs(self, rank, tail)

    def sync_workspace(self, workspace: Any, conda: bool = False,
                       auto_reload: bool = False) -> None:
        """As Monarch's: not for a ProcMesh; HostMesh.sync_workspace syncs once per host."""
        raise NotImplementedError("sync_workspace is not implemented for ProcMesh: use "
                                  "HostMesh.sync_workspace")

    def stop(self) -> "Future[None]":
        """Stops the actor meshes spawned on these procs from this process (each drains its
        queued messages, stops the meshes its actors spawned, runs ``__cleanup__``), then asks
        every proc to exit, killing those still there after a grace period. Resolves when all
        are gone. Later spawns and calls raise SupervisionError. Procs a controller spawned
        for this process on attached hosts (HM-2) are stopped by that controller, asked
        through its registry; this resolves once their ends reached this process."""
        if not self._shared.owned:
            raise RuntimeError(
                f"the proc mesh {self.extent} was spawned by another process; only that "
                f"process can stop it"
            )
        with self._shared.lock:
            self._shared.stopped = True
            cores, self._shared.actor_meshes = self._shared.actor_meshes, []
        first = [c.stop() for c in cores]
        if self._shared.remote is not None:
            return _stop_through_registry(self._core, first, self._shared, *self._shared.remote,
                                          STOP_ACTORS_MS, STOP_GRACE_MS)
        return Future(self._core.stop_after(first, STOP_ACTORS_MS, STOP_GRACE_MS),
                      _decode_stopped, self._shared)

    def logging_option(self, stream_to_client: bool = False,
                       aggregate_window_sec: Optional[int] = None,
                       level: int = logging.INFO) -> "Future[None]":
        """As Monarch's: the procs' log level and whether their output streams to the client
        (aggregated over ``aggregate_window_sec`` seconds when given: similar lines of a
        window print once with their count) or goes to a file per proc; a Future to await.
        See logs.py (LG-3, LG-7)."""
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
    def spawn_procs_for(self, ref: tuple, region: Any, per_host: Dict[str, int],
                        bootstrap: Any, name: Optional[str], proc_bind: Any,
                        command: Any, lineage: List[str]) -> tuple:
        """spawn_procs on a HostMesh reference (HM-1), run by the controller that attached
        the hosts, for the proc lineage[0] (HM-2): the procs end with it, or with a proc it
        descends from (the rest of `lineage`; runtime ME-15).
        Returns the ProcMesh and the token that stop_procs_for takes."""
        with _attached_lock:
            original = _attached.get(ref[1])
        if ref[0] != runtime_id() or original is None or original.core is None:
            raise RuntimeError("spawn_procs on a HostMesh reference: its controller no longer "
                               "holds those hosts")
        pm = HostMesh(region, original.core, original).spawn_procs(
            per_host, bootstrap, name, proc_bind, command)
        pm._core.spawned_for(lineage)  # before the ProcMesh is pickled: its state names them
        with _spawned_for_lock:
            global _next_token
            _next_token += 1
            token = _next_token
            _spawned_for[token] = pm
        return pm, token

    @endpoint
    def stop_procs_for(self, token: int) -> None:
        """Begins the stop of the procs spawn_procs_for returned with `token` (HM-2); the
        process they belong to waits for their ends itself (this actor does not block)."""
        with _spawned_for_lock:
            pm = _spawned_for.pop(token, None)
        if pm is not None and not pm._shared.stopped:
            pm.stop()

    @endpoint
    def get_or_spawn(self, name: str, Class: type, args: tuple, kwargs: dict) -> ActorMesh[Any]:
        mesh = self._controllers.get(name)
        if mesh is None:
            mesh = this_proc().spawn(name, Class, *args, **kwargs)
            self._controllers[name] = mesh
        return mesh


_registry: Optional[ActorMesh[Any]] = None
_registry_lock = threading.Lock()
# HM-2: the ProcMeshes spawn_procs_for spawned for other procs, by token, while the original
# HostMesh keeps them (weak: HostMesh.stop() drops them).
_spawned_for: "weakref.WeakValueDictionary[int, ProcMesh]" = weakref.WeakValueDictionary()
_spawned_for_lock = threading.Lock()
_next_token = 0


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
