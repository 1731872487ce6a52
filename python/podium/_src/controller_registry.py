"""get_or_spawn_controller(): the controller process's registry of singleton actors, by name
(``ControllerController``, spawned once on the controller's this_proc()), which also runs
spawn_procs on HostMesh references for the procs that hold them (HM-1, HM-2). Procs learn the
registry with their actors' spawn (proc_mesh.py's meta ``registry``)."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, List, Optional, Type, TypeVar

from podium._src import server
from podium._src.actor_mesh import ActorMesh
from podium._src.endpoint import Actor, endpoint
from podium._src.endpoint import check_spawn as _check_spawn
from podium._src.future import Future
from podium._src.proc_mesh import (
    REGISTRY_NAME,
    HostMesh,
    ProcMesh,
    _attached,
    _attached_lock,
    runtime_id,
    this_proc,
)
from podium._src.runtime import ensure_runtime

T = TypeVar("T")


class ControllerController(Actor):
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


def registry_for_spawn(Class: type) -> Optional[ActorMesh[Any]]:
    """The registry that spawned actors reach get_or_spawn_controller() through: in the
    controller it is spawned (once) on first need; in a proc it came with its actors' spawn."""
    if Class is ControllerController:
        return None
    if server.in_proc() or server.registry() is not None:
        return server.registry()
    return controller_registry()


def controller_registry() -> ActorMesh[Any]:
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = this_proc().spawn(REGISTRY_NAME, ControllerController)
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
        registry = controller_registry()
    return registry.get_or_spawn.call_one(name, Class, args, kwargs)
