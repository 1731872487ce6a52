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
from podium._src import config
from podium._src.bootstrap_cmd import BootstrapCommand, default_bootstrap_cmd
from podium._src.compat import (
    attach,
    ChannelTransport,
    hosts_from_config,
    proc_mesh,
    ProcId,
    returns_future,
    run_worker_loop_until_shutdown,
    shutdown_context,
    start_worker_loop_forever,
    Uid,
)
from podium._src.telemetry import get_meter, span, traced
from podium._src.restart import RestartPolicy
from podium._src import service as _service  # noqa: F401  (Actor.options makes services)
from podium.debugger.controller import debug_controller

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "BootstrapCommand",
    "Channel",
    "ChannelTransport",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "MeshFailure",
    "Point",
    "Port",
    "PortReceiver",
    "ProcId",
    "ProcMesh",
    "RestartPolicy",
    "SupervisionError",
    "Uid",
    "ValueMesh",
    "as_endpoint",
    "attach",
    "attach_to_workers",
    "concurrent_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "debug_controller",
    "default_bootstrap_cmd",
    "enable_transport",
    "endpoint",
    "get_meter",
    "get_or_spawn_controller",
    "hosts_from_config",
    "proc_mesh",
    "returns_future",
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "send",
    "shutdown_context",
    "span",
    "start_worker_loop_forever",
    "this_host",
    "this_proc",
    "traced",
    "unhandled_fault_hook",
]

# `import podium.actor.config` works too (the module is podium._src.config).
_sys.modules.setdefault(__name__ + ".config", config)

# A program may replace podium.actor.unhandled_fault_hook: supervision looks it up here.
_supervision.bind_hook_module(_sys.modules[__name__])
