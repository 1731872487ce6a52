"""`podium.Shape`, `podium.Slice` and `podium.Selection`: Monarch's names over the C++ ndslice
layer (python/bindings/ndslice.cc)."""

from __future__ import annotations

import pickle

import pytest

import podium
from podium import Selection, Shape, Slice
from podium.actor import Extent


def _grid() -> Shape:
    # hosts x gpus = 2 x 4, dense row-major.
    return Shape(["hosts", "gpus"], Slice(offset=0, sizes=[2, 4], strides=[4, 1]))


def test_names_importable_from_podium():
    assert {"Shape", "Slice", "Selection"} <= set(podium.__all__)
    assert Shape.__module__ == Slice.__module__ == Selection.__module__ == "podium"


def test_slice_accessors_and_iteration():
    s = Slice(offset=1, sizes=[2, 3], strides=[6, 2])  # every other rank, two rows
    assert (s.offset, s.sizes, s.strides, s.ndim) == (1, [2, 3], [6, 2], 2)
    assert len(s) == 6
    assert list(s) == [1, 3, 5, 7, 9, 11]
    assert s[0] == 1 and s[-1] == 11 and s[1:4] == (3, 5, 7) and s[::2] == (1, 5, 9)
    assert s.get(4) == 9
    assert s.index(9) == 4
    assert s.coordinates(9) == [1, 1]
    assert s.nditem([1, 2]) == 11
    assert 7 in s and 2 not in s


def test_slice_errors():
    s = Slice(offset=0, sizes=[2, 2], strides=[2, 1])
    with pytest.raises(ValueError):
        s.index(7)  # not in the slice
    with pytest.raises(ValueError):
        s.coordinates(7)
    with pytest.raises(IndexError):
        s.nditem([2, 0])
    with pytest.raises(IndexError):
        s[4]
    with pytest.raises(ValueError):
        Slice(offset=0, sizes=[2, 2], strides=[1, 1])  # overlapping locations
    with pytest.raises(ValueError):
        Slice(offset=0, sizes=[2], strides=[1, 1])  # lengths differ
    with pytest.raises(TypeError):
        Slice(0, [2], [1])  # keyword-only, as in Monarch


def test_slice_new_row_major_equality_and_pickle():
    s = Slice.new_row_major([2, 3])
    assert s == Slice(offset=0, sizes=[2, 3], strides=[3, 1])
    assert s != Slice(offset=1, sizes=[2, 3], strides=[3, 1])
    assert s != "not a slice"
    assert hash(s) == hash(Slice(offset=0, sizes=[2, 3], strides=[3, 1]))
    assert pickle.loads(pickle.dumps(s)) == s
    assert "sizes: [2, 3]" in repr(s)


def test_shape_accessors():
    sh = _grid()
    assert sh.labels == ["hosts", "gpus"]
    assert sh.ndslice == Slice(offset=0, sizes=[2, 4], strides=[4, 1])
    assert len(sh) == 8
    assert sh.ranks() == list(range(8))
    assert sh.extent == Extent(["hosts", "gpus"], [2, 4])
    assert isinstance(sh.extent, Extent)
    assert sh.coordinates(6) == {"hosts": 1, "gpus": 2}
    assert "'hosts': 2" in str(sh)


def test_shape_slicing_keeps_base_ranks():
    sh = _grid()
    row = sh.at("hosts", 1)
    assert row.labels == ["gpus"] and row.ranks() == [4, 5, 6, 7]
    cols = sh.select("gpus", slice(1, None, 2))
    assert cols.labels == ["hosts", "gpus"] and cols.ranks() == [1, 3, 5, 7]
    assert cols.coordinates(7) == {"hosts": 1, "gpus": 1}
    one = sh.index(hosts=1, gpus=3)
    assert one.labels == [] and one.ranks() == [7] and len(one) == 1
    assert Shape.unity().ranks() == [0] and len(Shape.unity()) == 1


def test_shape_errors():
    sh = _grid()
    # As Monarch's Shape.at: ValueError for an unknown label, an index out of range or a
    # negative one (test_monarch_errors.py covers the texts).
    with pytest.raises(ValueError, match="no dimension 'nodes'"):
        sh.at("nodes", 0)  # unknown label
    with pytest.raises(ValueError, match="out of range"):
        sh.at("gpus", 4)
    with pytest.raises(ValueError, match="out of range"):
        sh.at("gpus", -1)
    with pytest.raises(ValueError, match="no dimension"):
        sh.index(nodes=0)
    with pytest.raises(ValueError):
        sh.coordinates(9)  # not a rank of the shape
    with pytest.raises(ValueError):
        Shape(["hosts"], Slice(offset=0, sizes=[2, 4], strides=[4, 1]))  # one label per dim


def test_shape_equality_and_pickle():
    sh = _grid().select("gpus", slice(0, 2))
    assert sh == Shape(["hosts", "gpus"], Slice(offset=0, sizes=[2, 2], strides=[4, 1]))
    assert sh != _grid()
    copy = pickle.loads(pickle.dumps(sh))
    assert copy == sh and copy.ranks() == [0, 1, 4, 5]


def test_selection_evaluates_against_a_shape():
    sh = _grid()
    assert Selection.all().ranks(sh) == list(range(8))
    assert Selection.none().ranks(sh) == []
    assert Selection.first().ranks(sh) == [0]
    assert Selection.first("hosts").ranks(sh) == [0, 1, 2, 3]
    assert Selection.range("gpus", slice(1, 3)).ranks(sh) == [1, 2, 5, 6]
    assert Selection.range("gpus", -1).ranks(sh) == [3, 7]
    sel = Selection.range("gpus", 0) | Selection.first("hosts")
    assert sel.ranks(sh) == [0, 1, 2, 3, 4]
    both = Selection.range("gpus", slice(0, 2)) & Selection.range("hosts", 1)
    assert both.ranks(sh) == [4, 5]
    # On a sliced shape: ranks are the shape's own, base_ranks the root mesh's.
    half = sh.select("gpus", slice(2, 4))
    assert Selection.first("hosts").ranks(half) == [0, 1]
    assert Selection.first("hosts").base_ranks(half) == [2, 3]
    assert "first(hosts)" in repr(Selection.first("hosts"))


def test_selection_errors():
    with pytest.raises(TypeError):
        Selection.first("nodes").ranks(_grid())  # unknown label
    with pytest.raises(TypeError):
        Selection()  # built with all()/none()/first()/range() and | &
