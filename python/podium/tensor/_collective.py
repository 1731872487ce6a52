"""Collectives along mesh dimensions: ``t.reduce``, ``t.reduce_``, ``podium.reduce``.

The controller checks the call and computes the output's metadata (``reduce_meta``), then
issues ONE command to the tensor's mesh view; each worker finds its group with
``members_along`` (the procs that share its coordinates off the reduced dimensions) and runs
the collective through its proc's ``Communicator`` (gloo on CPU, NCCL on GPU; see
docs/collectives.md).

  TE-17 ``t.reduce(dims, reduction, scatter=False, mesh=None)`` reduces along `dims` (one
    name, several, or all when empty) on every proc: each proc's value becomes the reduction
    over the procs that share its coordinates on the other dimensions (all-reduce; a scattered
    part with ``scatter=True``; the stacked values for ``"stack"``). With ``mesh=`` a view of
    the tensor's mesh the result lives on that view only (reduce to one rank: a slice without
    the reduced dimensions). ``reduce_`` writes the result into `t` and returns `t`.
    Unknown or repeated dimensions, several dimensions with ``stack`` or ``scatter``, and
    what the collective would refuse raise at the call, before anything is sent.
  TE-18 A reduce whose input failed on some procs fails on every proc of each group they
    belong to, soon (the failed procs report to their groups; the others do not wait for the
    collective's timeout): each output holds a Failure, and the workers live on.
"""

from __future__ import annotations

from typing import Any, Tuple

import torch
from torch.utils._pytree import tree_map

from podium.tensor._client import View, view_of
from podium.tensor._collectives import Communicator, members_along, reduce_meta
from podium.tensor._tensor import Tensor, _check, _hooks, _RW, new_handle, state
from podium.tensor._worker import Ref, _Poisoned, coordinates

REDUCTIONS = ("sum", "avg", "product", "min", "max", "stack", "band", "bor", "bxor")


class _Layout:
    """A region state as the (labels, sizes, strides, offset) object members_along reads."""

    __slots__ = ("labels", "sizes", "strides", "offset")

    def __init__(self, region: tuple) -> None:
        self.labels, self.offset, self.sizes, self.strides = (list(region[0]), region[1],
                                                               list(region[2]),
                                                               list(region[3]))


def _in_region(rank: int, region: tuple) -> bool:
    labels, offset, sizes, strides = region
    coords = coordinates(rank, region)
    if any(not 0 <= coords[label] < size for label, size in zip(labels, sizes)):
        return False
    return offset + sum(coords[label] * s for label, s in zip(labels, strides)) == rank


def reduce_on_worker(worker: Any, rid: int, region: tuple, dims: Tuple[str, ...],
                     reduction: str, scatter: bool, inplace: bool, target: Any,
                     device_type: str) -> Any:
    """Runs on each worker of the tensor's view (a "collective" command)."""
    comm = Communicator.get()
    if comm._rank is None:
        Communicator.configure(rank=worker.rank)
    members = members_along(_Layout(region), dims, worker.rank)
    try:
        t = worker._get(Ref(rid))
    except _Poisoned as p:
        # This proc's input failed (TE-2): it still reports to its group, so the other
        # members fail at once instead of at the collective's timeout (TE-18).
        if len(members) > 1:
            group = comm._group(members, "nccl" if device_type == "cuda" else "gloo")
            comm._failed(group, RuntimeError(f"the input failed on rank {worker.rank}: "
                                             f"{p.failure.what}"))
        raise
    out = comm.reduce(t, members=members, reduction=reduction, scatter=scatter,
                      inplace=inplace)
    if target is not None and not _in_region(worker.rank, target):
        return None  # reduced to other ranks: this proc keeps nothing
    return out


def _reduce(t: Tensor, dims: Any, reduction: str, scatter: bool, mesh: Any,
            inplace: bool) -> Tensor:
    view = t._view
    if isinstance(dims, str):
        dims = (dims,)
    dims = tuple(dims)
    for d in dims:
        if d not in view.labels:
            raise KeyError(f"dim {d} not found in {view}")
    if not dims:
        dims = view.labels
    if len(set(dims)) != len(dims):
        raise ValueError(f"reducing the same dimension twice: {dims}")
    if len(dims) > 1 and (reduction == "stack" or scatter):
        raise ValueError(f"reduction {reduction} or scatter = {scatter} is not valid for "
                         "multiple dimensions")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction} not supported, reductions are {REDUCTIONS}")
    if torch.is_grad_enabled() and t.requires_grad:
        raise TypeError(f"reduce({t!r}): the tensor requires grad; reduce a detached tensor "
                        "or its .grad (collectives are not differentiable)")
    stream = state.stream
    if t._stream is not stream or t._dropped or t._access != _RW:
        _check("reduce", (t,), {}, view, [t], stream)
    size = 1
    for d in dims:
        size *= view.sizes[view.labels.index(d)]
    shape, dtype = reduce_meta(tuple(t.shape), t.dtype, size, reduction, scatter, inplace)
    target: Any = None
    out_view: View = view
    if mesh is not None:
        out_view = view_of(mesh)
        if out_view is not view:
            if out_view.client is not view.client or not set(out_view.base_ranks()) <= set(
                    view.base_ranks()):
                raise ValueError(f"reduce(mesh={out_view}): the mesh must be a part of the "
                                 f"tensor's mesh {view}")
            if inplace:
                raise ValueError("reduce_ cannot move the result to another mesh")
            target = out_view.region
    client = view.client
    if client.stream != stream.name:
        client.set_stream(stream.name)
    if inplace:
        out = t
    else:
        contiguous = torch.empty(shape, dtype=dtype, device="meta")
        out = new_handle(out_view, (tuple(shape), tuple(contiguous.stride()), dtype, t.device),
                         stream)
    client.append(view, ("collective", reduce_on_worker, [out._rid],
                         (t._rid, view.region, dims, reduction, scatter, inplace, target,
                          t.device.type)))
    return out


def reduce(tensors: Any, dims: Any, reduction: str = "sum", scatter: bool = False,
           mesh: Any = None) -> Any:
    """``t.reduce(...)`` for every tensor of a pytree (TE-17)."""
    return tree_map(lambda t: t.reduce(dims, reduction, scatter, mesh), tensors)


def reduce_(tensors: Any, dims: Any, reduction: str = "sum", scatter: bool = False,
            mesh: Any = None) -> Any:
    """``t.reduce_(...)`` for every tensor of a pytree (TE-17)."""
    return tree_map(lambda t: t.reduce_(dims, reduction, scatter, mesh), tensors)


_hooks["reduce"] = _reduce
