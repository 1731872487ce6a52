"""podium.actor: the actor API, compatible with PyTorch Monarch's ``monarch.actor``."""

import sys as _sys

from podium._src.actor_mesh import Accumulator, ActorMesh, as_endpoint, Endpoint, send
from podium._src.context import Context, context, current_actor_name, current_rank, current_size
from podium._src.endpoint import Actor, concurrent_endpoint, endpoint
from podium._src.errors import ActorError, SupervisionError
from podium._src.future import Future
from podium._src.ports import Channel, Port, PortReceiver
from podium._src.proc_mesh import (
    attach_to_workers,
    enable_transport,
    get_or_spawn_controller,
    HostMesh,
    ProcMesh,
    this_host,
    this_proc,
)
from podium._src.shape import Extent, Point, ValueMesh
from podium._src import supervision as _supervision
from podium._src.supervision import MeshFailure, unhandled_fault_hook
from podium._src.worker import run_worker_loop_forever

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "MeshFailure",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "SupervisionError",
    "ValueMesh",
    "as_endpoint",
    "attach_to_workers",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "enable_transport",
    "endpoint",
    "get_or_spawn_controller",
    "run_worker_loop_forever",
    "send",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]

# A program may replace podium.actor.unhandled_fault_hook: supervision looks it up here.
_supervision.bind_hook_module(_sys.modules[__name__])
