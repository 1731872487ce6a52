"""The tensor-engine methods of ProcMesh (``activate``, ``rank_tensor``, ``rank_tensors``,
``to_table``), as Monarch's ProcMesh has them. Their code is in ``podium.tensor``, imported
when first called: torch is optional, and ``import podium`` never imports it."""

from __future__ import annotations

from typing import Any, Dict, Sequence


class TensorMesh:
    """Mixed into ProcMesh; works on any view of it (slice, rename, split, flatten)."""

    def activate(self) -> Any:
        """``with mesh.activate():`` runs torch ops on every proc of this mesh (docs/tensor.md).
        Active from the call, as Monarch's; ``deactivate()`` or leaving ``with`` ends it."""
        from podium.tensor import _remote
        return _remote.activate(self)

    def rank_tensor(self, dim: "str | Sequence[str]") -> Any:
        """A tensor whose value on each proc is its coordinate along `dim` (TE-14)."""
        from podium.tensor import _remote
        return _remote.rank_tensor(self, dim)

    def rank_tensors(self) -> Dict[str, Any]:
        """``{dim: rank_tensor(dim)}`` for every dimension (TE-14)."""
        from podium.tensor import _remote
        return _remote.rank_tensors(self)

    def to_table(self) -> str:
        """The procs of the mesh as a grid (up to 3 dimensions), as Monarch's."""
        from podium.tensor import _remote
        return _remote.to_table(self)
