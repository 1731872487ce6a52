"""Collectives along mesh dimensions: ``t.reduce``, ``t.reduce_``, ``podium.reduce``."""

from __future__ import annotations

from typing import Any

from torch.utils._pytree import tree_map

from podium.tensor._tensor import Tensor, _hooks


def _reduce(t: Tensor, dims: Any, reduction: str, scatter: bool, mesh: Any,
            inplace: bool) -> Tensor:
    raise NotImplementedError("reduce: the collectives library is not wired in yet")


def reduce(tensors: Any, dims: Any, reduction: str = "sum", scatter: bool = False,
           mesh: Any = None) -> Any:
    return tree_map(lambda t: t.reduce(dims, reduction, scatter, mesh), tensors)


def reduce_(tensors: Any, dims: Any, reduction: str = "sum", scatter: bool = False,
            mesh: Any = None) -> Any:
    return tree_map(lambda t: t.reduce_(dims, reduction, scatter, mesh), tensors)


_hooks["reduce"] = _reduce
