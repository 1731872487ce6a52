"""podium.actor: the actor API, compatible with PyTorch Monarch's ``monarch.actor``."""

from podium._src.actor_mesh import ActorMesh, Endpoint
from podium._src.context import Context, context, current_actor_name, current_rank, current_size
from podium._src.endpoint import Actor, endpoint
from podium._src.errors import ActorError, SupervisionError
from podium._src.future import Future
from podium._src.proc_mesh import HostMesh, ProcMesh, this_host, this_proc
from podium._src.shape import Extent, Point, ValueMesh

__all__ = [
    "Actor",
    "ActorError",
    "ActorMesh",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "Point",
    "ProcMesh",
    "SupervisionError",
    "ValueMesh",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "endpoint",
    "this_host",
    "this_proc",
]
