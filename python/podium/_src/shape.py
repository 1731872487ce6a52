"""Extent, Point and ValueMesh: thin Python faces over the C++ ndslice layer
(podium._core.ndslice). Rank arithmetic, slicing and their errors all come from C++."""

from __future__ import annotations

import bisect
import collections.abc
from typing import Any, Dict, Generic, Iterable, Iterator, List, Sequence, Tuple, TypeVar

from podium._core import ndslice as _nd

R = TypeVar("R")


class Extent(collections.abc.Mapping):
    """The named dimensions of a mesh and their sizes, in order: a mapping label -> size.

    ``str(Extent(["hosts", "gpus"], [2, 4]))`` is ``{'hosts': 2, 'gpus': 4}``."""

    __slots__ = ("_core",)

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        self._core = _nd.Extent(list(labels), [int(s) for s in sizes])

    @classmethod
    def _wrap(cls, core: "_nd.Extent") -> "Extent":
        e = cls.__new__(cls)
        e._core = core
        return e

    @property
    def labels(self) -> List[str]:
        return list(self._core.labels)

    @property
    def sizes(self) -> List[int]:
        return list(self._core.sizes)

    @property
    def nelements(self) -> int:
        """How many ranks: the product of the sizes (1 with no dimensions)."""
        return self._core.num_ranks

    def __getitem__(self, label: str) -> int:
        if not isinstance(label, str) or label not in self._core.labels:
            raise KeyError(label)
        return self._core.size(label)

    def __iter__(self) -> Iterator[str]:
        return iter(self._core.labels)

    def __len__(self) -> int:
        return self._core.ndim

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Extent):
            return self._core == other._core
        return collections.abc.Mapping.__eq__(self, other)

    def __hash__(self) -> int:
        return hash((tuple(self._core.labels), tuple(self._core.sizes)))

    def __str__(self) -> str:
        return str(self._core)

    def __repr__(self) -> str:
        return f"Extent({self._core})"

    def __reduce__(self):
        return (Extent, (self.labels, self.sizes))


class Point(collections.abc.Mapping):
    """One position in an Extent: a mapping label -> coordinate, with ``.rank`` (row-major) and
    ``.extent``. ``str(point)`` looks like ``{'hosts': 0/1, 'gpus': 1/2}``."""

    __slots__ = ("_core",)

    def __init__(self, rank: int, extent: Extent) -> None:
        self._core = extent._core.point_of_rank(rank)

    @classmethod
    def _wrap(cls, core: "_nd.Point") -> "Point":
        p = cls.__new__(cls)
        p._core = core
        return p

    @property
    def rank(self) -> int:
        return self._core.rank

    @property
    def extent(self) -> Extent:
        return Extent._wrap(self._core.extent)

    def __getitem__(self, label: str) -> int:
        if not isinstance(label, str) or label not in self._core.extent.labels:
            raise KeyError(label)
        return self._core.get(label)

    def __iter__(self) -> Iterator[str]:
        return iter(self._core.extent.labels)

    def __len__(self) -> int:
        return self._core.extent.ndim

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Point):
            return self._core == other._core
        return collections.abc.Mapping.__eq__(self, other)

    def __hash__(self) -> int:
        return hash((self.rank, tuple(self._core.extent.labels), tuple(self._core.extent.sizes)))

    def __str__(self) -> str:
        return str(self._core)

    def __repr__(self) -> str:
        return f"Point({self._core})"

    def __reduce__(self):
        return (Point, (self.rank, self.extent))


def select(obj: Any, kwargs: Dict[str, Any]) -> Any:
    """Applies mesh.slice(**kwargs) through obj.slice(label, int | Range), the C++ slicing of
    Region / ProcMesh / ActorMesh: an int removes the dimension, a slice keeps it. Unknown
    label -> TypeError, out of range -> IndexError (raised by C++)."""
    for label, sel in kwargs.items():
        if isinstance(sel, slice):
            obj = obj.slice(label, _nd.Range(sel.start, sel.stop, sel.step))
        elif isinstance(sel, int) and not isinstance(sel, bool):
            obj = obj.slice(label, sel)
        else:
            raise TypeError(
                f"slice({label}=...) takes an int or a slice, not {type(sel).__name__}"
            )
    return obj


class _RegionView:
    """Adapts a C++ Region to the obj.slice(label, sel) protocol of select()."""

    __slots__ = ("region",)

    def __init__(self, region: "_nd.Region") -> None:
        self.region = region

    def slice(self, label: str, sel: Any) -> "_RegionView":
        return _RegionView(self.region.select(label, sel))


class MeshShape:
    """The shape accessors every mesh shares: ``extent``, ``sizes``, ``size(dim)``,
    ``len()``. Subclasses provide ``_region`` (a C++ Region), as an attribute or property."""

    _region: "_nd.Region"

    @property
    def extent(self) -> Extent:
        return Extent._wrap(self._region.extent)

    @property
    def sizes(self) -> Dict[str, int]:
        e = self._region.extent
        return dict(zip(e.labels, e.sizes))

    def size(self, dim: "str | Sequence[str] | None" = None) -> int:
        """The size of dimension ``dim``; of several dimensions, their product; with no
        argument, the number of ranks."""
        e = self._region.extent
        if dim is None:
            return e.num_ranks
        if isinstance(dim, str):
            return e.size(dim)
        n = 1
        for d in dim:
            n *= e.size(d)
        return n

    def __len__(self) -> int:
        return self._region.num_ranks

    # --- reshaping: each returns a new mesh of the same ranks (C++ ndslice Region) ---------
    # A subclass provides _reshaped(op): the same kind of mesh over op(its C++ handle), where
    # the handle (a Region, or a C++ ProcMesh / ActorMesh) has split/flatten/rename.

    def split(self: "_M", **kwargs: Any) -> "_M":
        """Splits dimensions: ``mesh.split(host=("dp", "pp"), gpu=("tp", "cp"), pp=16, cp=2)``
        replaces ``host`` by ``dp`` x ``pp`` (row-major) with ``pp`` of size 16 and ``dp``
        inferred, and ``gpu`` likewise. Dimensions not named stay. ValueError for an unknown
        dimension, a size that does not divide, or a size given for no new dimension."""
        labels = list(self._region.extent.labels)
        splits: Dict[str, List[str]] = {}
        sizes: Dict[str, int] = {}
        for key, value in kwargs.items():
            if key in labels:
                if isinstance(value, str) or not isinstance(value, collections.abc.Sequence):
                    raise ValueError(
                        f"split({key}=...) takes a sequence of new dimension names, got {value!r}"
                    )
                splits[key] = [str(v) for v in value]
            elif isinstance(value, int) and not isinstance(value, bool):
                sizes[key] = value
            else:
                raise ValueError(
                    f"'{key}' is not a dimension of {self._region.extent} (to split it, pass "
                    f"a sequence of names) nor a size of a new dimension (an int)"
                )
        ops = []
        for label, names in splits.items():
            ops.append((label, names, [sizes.pop(n, -1) for n in names]))
        if sizes:
            raise ValueError(f"sizes given for no new dimension: {sorted(sizes)}")

        def apply(handle: Any) -> Any:
            for label, names, new_sizes in ops:
                handle = handle.split(label, names, new_sizes)
            return handle

        return self._reshaped(apply)

    def flatten(self: "_M", name: str) -> "_M":
        """All dimensions into one named ``name``, same ranks in the same order. ValueError
        when the ranks are not evenly spaced (a sparse slice)."""
        return self._reshaped(lambda handle: handle.flatten(name))

    def rename(self: "_M", **kwargs: str) -> "_M":
        """``mesh.rename(host="dp", gpu="tp")``; dimensions not named stay. ValueError for an
        unknown dimension or a name already taken."""
        labels = list(self._region.extent.labels)
        for old in kwargs:
            if old not in labels:
                raise ValueError(f"cannot rename '{old}': the mesh has dimensions {labels}")

        def apply(handle: Any) -> Any:
            for old, new in kwargs.items():
                handle = handle.rename(old, str(new))
            return handle

        return self._reshaped(apply)


_M = TypeVar("_M", bound=MeshShape)


# Immutable values, which the ranks of one run of equal replies can share (RunValues).
_SHAREABLE = (type(None), bool, int, float, complex, str, bytes, range)


def shareable(value: Any) -> bool:
    """Whether one object can stand for every rank of a run: nothing a rank's holder could
    change under the others' feet (scalars, and tuples of them)."""
    if type(value) in _SHAREABLE:
        return True
    return type(value) is tuple and len(value) <= 16 and all(type(v) in _SHAREABLE for v in value)


class RunValues(collections.abc.Sequence):
    """Values by rank, held as runs of one value (ME-9): a call whose actors all answered
    alike is one entry whatever the mesh's size. Indexing costs O(log runs)."""

    __slots__ = ("_ends", "_values")

    def __init__(self, runs: Iterable[Tuple[int, Any]]) -> None:
        self._ends: List[int] = []
        self._values: List[Any] = []
        total = 0
        for count, value in runs:
            if count <= 0:
                continue
            total += count
            self._ends.append(total)
            self._values.append(value)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"rank {i} out of range for {n} values")
        return self._values[bisect.bisect_right(self._ends, i)]

    def runs(self) -> int:
        return len(self._values)


class ValueMesh(MeshShape, Generic[R]):
    """The replies of ``call()``: one value per point of the called mesh, in rank order."""

    def __init__(self, region: "_nd.Region", base_values: Sequence[R]) -> None:
        # base_values[b] is the value at base rank b of the region's root.
        self._r = region
        self._base_values = base_values

    @classmethod
    def _from_values(cls, labels: List[str], sizes: List[int], values: Sequence[R]
                     ) -> "ValueMesh[R]":
        return cls(_nd.Region(_nd.Extent(labels, sizes)), values)

    @property
    def _region(self) -> "_nd.Region":
        return self._r

    def values(self) -> Iterable[R]:
        return [self._base_values[b] for b in self._r.base_ranks()]

    def items(self) -> Iterable[Tuple[Point, R]]:
        extent = self._r.extent
        for rank, b in enumerate(self._r.base_ranks()):
            yield Point._wrap(extent.point_of_rank(rank)), self._base_values[b]

    def item(self, **coords: int) -> R:
        """The value at ``coords``, which must name every dimension."""
        extent = self._r.extent
        labels = list(extent.labels)
        unknown = set(coords) - set(labels)
        if unknown:
            raise TypeError(f"unknown dimension(s) {sorted(unknown)}; the mesh has {labels}")
        missing = [l for l in labels if l not in coords]
        if missing:
            raise KeyError(f"item() needs a coordinate for every dimension; missing {missing}")
        rank = extent.rank_of([int(coords[l]) for l in labels])
        return self._base_values[self._r.base_rank(rank)]

    def slice(self, **kwargs: Any) -> "ValueMesh[R]":
        return ValueMesh(select(_RegionView(self._r), kwargs).region, self._base_values)

    def _reshaped(self, op: Any) -> "ValueMesh[R]":
        return ValueMesh(op(self._r), self._base_values)

    def __iter__(self) -> Iterator[Tuple[Point, R]]:
        """(Point, value) pairs in rank order, as items()."""
        return iter(self.items())

    def __repr__(self) -> str:
        body = ", ".join(f"{p}: {v!r}" for p, v in self.items())
        return f"ValueMesh({self.extent}, [{body}])"

    def __reduce__(self):
        e = self._r.extent
        return (ValueMesh._from_values, (list(e.labels), list(e.sizes), list(self.values())))
