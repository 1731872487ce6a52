"""How meshes stop, and the decoders of their Futures: ProcMesh.stop through a controller's
registry (HM-2), and HostMesh.stop/shutdown of many proc meshes at once.
proc_mesh.py's classes call these; nothing here refers back to them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

from podium._core import mesh as _mesh
from podium._src import logs
from podium._src.actor_mesh import _decode_bootstrap, _decode_none
from podium._src.future import CoroFuture, Future

if TYPE_CHECKING:
    from podium._src.proc_mesh import ProcMesh, _ProcShared

def _decode_bootstrap_true(value: Any) -> bool:
    _decode_bootstrap(value)
    return True


def _decode_true(value: Any) -> bool:
    _decode_none(value)
    return True


def _stop_all(meshes: List["ProcMesh"], then: Optional[Callable[[], Any]]) -> "Future[None]":
    """Stops `meshes` in parallel (HostMesh.stop), or, with `then` (HostMesh.shutdown of
    attached hosts, which kills their procs as stopped), marks them stopped and runs `then`.
    Resolves when all is done; raises the first failure."""
    if then is not None:
        for pm in meshes:
            logs.before_kill(pm._shared)  # what they stream is printed before they die
            with pm._shared.lock:
                pm._shared.stopped = True
                pm._shared.actor_meshes = []
        cores = [then()]
    else:
        cores = [pm.stop()._core for pm in meshes if not pm._shared.stopped]
    return Future(_mesh.all_of(cores), _decode_all, (cores, meshes))


def _decode_all(_: Any, arg: Tuple[List[Any], List["ProcMesh"]]) -> None:
    cores, meshes = arg
    try:
        for c in cores:
            _decode_none(c)
    finally:
        for pm in meshes:
            logs.after_stop(pm._shared)


def _decode_stopped(core: Any, shared: "_ProcShared") -> None:
    try:
        _decode_none(core)
    finally:  # the lines its actors sent as they stopped are printed (LG-7)
        logs.after_stop(shared)


# How long a stop through the registry (HM-2) waits for the procs' ends to reach this process
# once the controller began stopping them, beyond their grace: the kill and the notices.
_REMOTE_END_EXTRA_MS = 10000


def _stop_through_registry(core: Any, first: List[Any], shared: "_ProcShared",
                           registry: Any, token: int, actors_ms: int,
                           grace_ms: int) -> "Future[None]":
    """HM-2: stops procs a controller spawned for this process: once the actor meshes' stops
    (`first`) are done (or after `actors_ms`), asks the controller to stop the procs, then
    waits until every proc's end reached this process (their grace, `grace_ms`, and
    _REMOTE_END_EXTRA_MS). Starts at once, on a thread of its
    own (the steps wait on other processes); the Future resolves when it is done."""
    done: "concurrent.futures.Future[None]" = concurrent.futures.Future()

    def run() -> None:
        try:
            deadline = time.monotonic() + actors_ms / 1000
            for f in first:  # whatever their outcome, as ProcMesh::stop_after (ME-12)
                f.wait(max(0.0, deadline - time.monotonic()))
            registry.stop_procs_for.call_one(token).get()
            end_s = (grace_ms + _REMOTE_END_EXTRA_MS) / 1000
            if not core.ended().wait(end_s):
                raise RuntimeError(f"the procs of {core.extent} did not end within "
                                   f"{end_s:.0f} s of their controller's stop")
        except BaseException as e:  # the caller's Future raises it
            failed: Optional[BaseException] = e
        else:
            failed = None
        try:  # the lines its actors sent as they stopped are printed (LG-7)
            logs.after_stop(shared)
        finally:
            if failed is None:
                done.set_result(None)
            else:
                done.set_exception(failed)

    threading.Thread(target=contextvars.copy_context().run, args=(run,), daemon=True,
                     name="podium-remote-stop").start()

    async def wait() -> None:
        await asyncio.wrap_future(done)

    return CoroFuture(wait())
