"""podium.tensor: distributed tensors, as Monarch's tensor engine (docs/tensor.md).

Inside ``with mesh.activate():`` torch ops run on every proc of the mesh; tensors are
``podium.Tensor`` handles. The names here are re-exported by ``podium`` itself, lazily, so
that ``import podium`` never imports torch."""

from podium.tensor import _actors  # noqa: F401  (actor calls carry handles; rref: TE-19, TE-20)
from podium.tensor._fetch import RemoteException, fetch_shard, inspect, show
from podium.tensor._grad import grad_generator
from podium.tensor._move import slice_mesh, to_mesh
from podium.tensor._collective import reduce, reduce_
from podium.tensor._remote import remote, Remote
from podium.tensor._stream import Borrow, coalescing, get_active_stream, Stream
from podium.tensor._tensor import get_active_mesh, no_mesh, Tensor

__all__ = [
    "Borrow",
    "RemoteException",
    "Remote",
    "Stream",
    "Tensor",
    "coalescing",
    "fetch_shard",
    "get_active_mesh",
    "get_active_stream",
    "grad_generator",
    "inspect",
    "no_mesh",
    "reduce",
    "reduce_",
    "remote",
    "show",
    "slice_mesh",
    "to_mesh",
]
