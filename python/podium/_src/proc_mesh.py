"""HostMesh, ProcMesh, this_host(), this_proc(), and starting the runtime of this process.

The first call that needs the runtime starts the controller runtime in C++
(podium._core.mesh.init_controller), which spawns procs as ``python -m podium._src.proc``.
"""

from __future__ import annotations

import atexit
import pickle
import sys
import threading
from typing import Any, Dict, Optional, Type, TypeVar

from podium._core import mesh as _mesh
from podium._core import ndslice as _nd
from podium._src import pickling, server
from podium._src.actor_mesh import ActorMesh, _decode_none
from podium._src.endpoint import check_actor_class, check_call
from podium._src.future import Future
from podium._src.shape import MeshShape, select

T = TypeVar("T")

PROC_ARGV = [sys.executable, "-m", "podium._src.proc"]
STOP_GRACE_MS = 5000

_lock = threading.Lock()
_running = False


def ensure_runtime() -> None:
    """Starts this process's podium runtime (a controller, unless it is a proc) once."""
    global _running
    if _running:
        return
    with _lock:
        if _running:
            return
        _mesh.init_controller(PROC_ARGV)  # does nothing in a proc, whose runtime is serving
        server.start()
        atexit.register(_at_exit)
        _running = True


def _at_exit() -> None:
    server.stop()
    _mesh.shutdown()


class HostMesh(MeshShape):
    """This host, as a mesh with no dimensions."""

    def __init__(self) -> None:
        self._r = _nd.Region(_nd.Extent([], []))

    @property
    def _region(self) -> "_nd.Region":
        return self._r

    def spawn_procs(self, per_host: Optional[Dict[str, int]] = None) -> "ProcMesh":
        """Starts one process per point of ``per_host`` (e.g. ``{"gpus": 8}``) on this host and
        returns their ProcMesh at once; ``.initialized`` resolves when all are up."""
        ensure_runtime()
        per_host = dict(per_host or {})
        for label, size in per_host.items():
            if not isinstance(label, str) or not isinstance(size, int) or isinstance(size, bool):
                raise TypeError(f"per_host maps dimension names to sizes, got {label!r}: {size!r}")
        return ProcMesh(_mesh.ProcMesh.spawn_procs(list(per_host.items())))

    def __repr__(self) -> str:
        return "<HostMesh this_host()>"


class ProcMesh(MeshShape):
    """OS processes, shaped as a mesh; ``spawn`` starts one actor in each."""

    def __init__(self, core: Any) -> None:
        self._core = core

    @property
    def _region(self) -> "_nd.Region":
        return self._core.region

    @property
    def initialized(self) -> "Future[None]":
        """Resolves when every proc is up; raises SupervisionError if one exited first."""
        return Future(self._core.initialized(), _decode_none)

    def spawn(self, name: str, Class: Type[T], *args: Any, **kwargs: Any) -> ActorMesh[T]:
        """Creates one ``Class(*args, **kwargs)`` per proc, named ``name``; returns the
        ActorMesh at once (``.initialized`` resolves after every ``__init__``)."""
        if not isinstance(name, str):
            raise TypeError(f"spawn(name, Class, ...): name must be a str, not {name!r}")
        check_actor_class(Class)
        check_call(f"{Class.__qualname__}()", _init_signature(Class), args, kwargs)
        region = self._core.region
        meta = pickle.dumps(
            (list(sys.path), list(region.extent.labels), list(region.extent.sizes),
             list(region.base_ranks()))
        )
        try:
            parts = pickling.dumps((Class, args, kwargs))
        except Exception as e:
            pickling.dumps_call(f"{Class.__qualname__}()", args, kwargs)  # names the argument
            raise TypeError(f"cannot pickle actor class {Class.__qualname__}: {e}") from e
        return ActorMesh(Class, self._core.spawn("python", name, [meta, *parts]), self)

    def slice(self, **kwargs: Any) -> "ProcMesh":
        return ProcMesh(select(self._core, kwargs))

    def stop(self) -> "Future[None]":
        """Asks every proc of the mesh to exit (killing those still there after a grace
        period); resolves when all are gone."""
        return Future(self._core.stop(STOP_GRACE_MS), _decode_none)

    async def __aenter__(self) -> "ProcMesh":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"<ProcMesh {self.extent}>"


def _init_signature(cls: type) -> Any:
    import inspect

    try:
        return inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
                                  inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                                  inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])


_this_host = HostMesh()


def this_host() -> HostMesh:
    """The local host, as a mesh with no dimensions."""
    ensure_runtime()
    return _this_host


def this_proc() -> ProcMesh:
    """This process, as a mesh with no dimensions: actors spawned on it run in-process."""
    ensure_runtime()
    return ProcMesh(_mesh.ProcMesh.this_proc())
