"""Reading values back: ``fetch_shard``, ``inspect``, ``show``, and ``RemoteException``.

  TE-4 ``fetch_shard(obj, **coords)`` sends the batch first, then asks the one worker at
    those coordinates (coordinate 0 of every dimension when none are given; all of them
    otherwise) for its values; it returns a Future of ``obj`` with each handle replaced by
    that proc's value, on CPU. A failed value raises ``RemoteException`` from the Future,
    naming the rank, the host, the original error and its remote traceback (TE-2); a dead
    proc fails it with SupervisionError, within supervision's bounds.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils._python_dispatch import _disable_current_modes

from podium._src.future import Future, resolved

from podium.tensor._client import View
from podium.tensor._tensor import Tensor, no_mesh
from podium.tensor._worker import RemoteException  # noqa: F401  (public here)


def root_point(view: View, rank: int) -> Dict[str, int]:
    """The coordinates, in the root mesh, of root rank `rank`."""
    labels, _, sizes, _ = view.client.root_region
    coords: Dict[str, int] = {}
    for label, size in zip(reversed(labels), reversed(sizes)):
        coords[label] = rank % size
        rank //= size
    return coords


def _coords(view: View, shard: Optional[Dict[str, int]]) -> Dict[str, int]:
    if shard is None:
        return {label: 0 for label in view.labels}
    extra = set(shard) - set(view.labels)
    if extra:
        raise KeyError(f"{sorted(extra)}: not dimensions of {view}")
    for label in view.labels:
        if label not in shard:
            raise ValueError(f"Missing key '{label}' in shard map. Need all of "
                             f"{list(view.labels)}")
    return dict(shard)


def _decode(core: Any, arg: tuple) -> Any:
    inner, leaves, spec, positions = arg
    with _disable_current_modes():  # unpickling makes local tensors, inside the block too
        replies = inner.get()
    leaves = list(leaves)
    for pos, (ok, value) in zip(positions, replies):
        if not ok:
            raise RemoteException(value)
        leaves[pos] = value
    return tree_unflatten(leaves, spec)


def fetch_shard(obj: Any, shard: Optional[Dict[str, int]] = None, **kwargs: int) -> Future[Any]:
    """A Future of `obj` with each handle replaced by its value on the proc at the given
    coordinates (TE-4)."""
    if kwargs:
        shard = dict(shard or {})
        shard.update(kwargs)
    leaves, spec = tree_flatten(obj)
    positions: List[int] = []
    views = set()
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, Tensor):
            positions.append(i)
            views.add(leaf._view)
            if leaf._dropped:
                raise TypeError(f"{leaf!r} was dropped")
    if not positions:
        return resolved(obj)
    if len(views) > 1:
        raise ValueError(f"fetch_shard: the tensors live on different meshes: {views}")
    view = views.pop()
    coords = _coords(view, shard)
    client = view.client
    client.flush()
    rank = view.root_rank(coords)
    worker = client.workers.slice(**root_point(view, rank))
    inner = worker.fetch.call_one([leaves[i]._rid for i in positions])
    return Future(inner._core, _decode, (inner, leaves, spec, positions))


def inspect(obj: Any, shard: Optional[Dict[str, int]] = None, **kwargs: int) -> Any:
    """The value of `obj` on the proc at those coordinates, locally (TE-4)."""
    return fetch_shard(obj, shard, **kwargs).result()


def show(obj: Any, shard: Optional[Dict[str, int]] = None, **kwargs: int) -> Any:
    """Prints the value at those coordinates (Monarch draws it with torchshow where installed;
    podium prints it) and returns it."""
    value = inspect(obj, shard, **kwargs)
    with no_mesh.activate():
        print(value)
    return value


def values_of(t: Tensor, timeout: float = 60) -> List[torch.Tensor]:
    """Every proc's value of `t`, in the rank order of its mesh (tests, to_table)."""
    view = t._view
    out = []
    for rank in view.base_ranks():
        out.append(fetch_shard(t, view.coords_of(rank)).get(timeout=timeout))
    return out
