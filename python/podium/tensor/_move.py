"""Moving tensors between meshes: ``t.to_mesh(mesh)``, ``t.slice_mesh(**kw)``.

  TE-16 ``t.slice_mesh(**kw).to_mesh(dest)`` (or ``t.to_mesh(dest)``) gives a handle on
    `dest` (a view of the same procs, or of another proc mesh) whose value on each proc is the
    source value at the same coordinates of the dimensions both meshes have (every proc along a dimension only `dest` has receives the
    same value: a broadcast). The controller issues one send command to the source view and
    one receive command to `dest`; the workers move the values themselves: small ones in a
    message, large CPU ones (``LARGE`` bytes and more) read one-sidedly through
    ``podium.rdma`` from the sender's memory, never pickled.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Optional

from torch.utils._pytree import tree_map

from podium.tensor._client import View, view_of
from podium.tensor._tensor import Tensor, _hooks, new_handle, state

_keys = itertools.count(1)  # transfer keys, unique in this controller
LARGE = 1 << 20  # bytes: from this size on, to_mesh moves a CPU value over podium.rdma
RECV_TIMEOUT_S = 120.0


class MeshSliceTensor:
    """``t.slice_mesh(**kw)``: the part of `t` on a slice of its mesh, to move with to_mesh."""

    def __init__(self, tensor: Tensor, slicing: View) -> None:
        self.tensor = tensor
        self.slicing = slicing

    def to_mesh(self, mesh: Any, stream: Any = None) -> Tensor:
        t = self.tensor
        if t._dropped:
            raise TypeError(f"{t!r} was dropped")
        if stream is None:
            stream = t._stream
        src = self.slicing
        client = src.client
        dest = view_of(mesh)
        for name, size in zip(dest.labels, dest.sizes):
            if name not in src.labels:
                warnings.warn(f"to_mesh is broadcasting along {name} dimension", stacklevel=3)
            elif src.sizes[src.labels.index(name)] != size:
                raise ValueError(f"dimension {name} of destination device_mesh has a "
                                 "different length than the source tensor")
        missing = set(src.labels) - set(dest.labels)
        if missing:
            raise ValueError(f"destination mesh does not have dimensions {missing}")
        # Workers deliver to the Mailbox actors themselves: those must exist first (a message
        # to an actor not yet spawned in its proc would be dropped).
        client.mailboxes_ready()
        dest.client.mailboxes_ready()
        key = next(_keys)
        r = new_handle(dest, t._key, stream)
        other = None if dest.client is client else dest.client.mailboxes
        client.append(src, ("send", t._ref, key, src.region, dest.region, LARGE, other))
        if other is not None:
            client.flush()  # the values leave before the destination waits for them
        dest.client.append(dest, ("recv", r._rid, key, RECV_TIMEOUT_S))
        return r


def to_mesh(tensors: Any, mesh: Any, stream: Any = None) -> Any:
    """Moves every tensor of a pytree to `mesh` (TE-16)."""
    return tree_map(lambda t: t.to_mesh(mesh, stream), tensors)


def slice_mesh(tensors: Any, **kwargs: Any) -> Any:
    return tree_map(lambda t: t.slice_mesh(**kwargs), tensors)


def _tensor_to_mesh(t: Tensor, mesh: Any, stream: Any) -> Tensor:
    return MeshSliceTensor(t, t._view).to_mesh(mesh, stream)


def _tensor_slice_mesh(t: Tensor, kwargs: dict) -> MeshSliceTensor:
    return MeshSliceTensor(t, view_of(t._view.proc_mesh.slice(**kwargs)))


_hooks["to_mesh"] = _tensor_to_mesh
_hooks["slice_mesh"] = _tensor_slice_mesh
