"""The per-call fast paths give the same answers as the general paths they skip: the
positional-arity check against inspect.Signature.bind, and plain-value pickling against
cloudpickle."""

from __future__ import annotations

import enum
import inspect
import pickle

import pytest

from podium._src import pickling
from podium._src.endpoint import EndpointProperty


def _binds(fn, n: int, port: bool) -> bool:
    try:
        inspect.signature(fn).bind(*([None] * ((2 if port else 1) + n)))
        return True
    except TypeError:
        return False


def f0(self): ...
def f1(self, a): ...
def f2(self, a, b=1): ...
def f3(self, a, *rest): ...
def f4(self, a, *, k): ...
def f5(self, a, *, k=2): ...
def f6(self, /, a, b, c=3, *rest, k=4, **kw): ...
def f7(*args): ...
def f8(self, port, a): ...


@pytest.mark.parametrize("fn", [f0, f1, f2, f3, f4, f5, f6, f7, f8])
@pytest.mark.parametrize("port", [False, True])
def test_the_arity_fast_path_never_accepts_what_bind_rejects(fn, port):
    prop = EndpointProperty(fn, explicit_response_port=port)
    for n in range(6):
        if prop.takes_positional(n):
            assert _binds(fn, n, port), (fn.__name__, n, port)


def test_the_arity_fast_path_covers_the_common_shapes():
    assert EndpointProperty(f1).takes_positional(1)
    assert EndpointProperty(f2).takes_positional(1) and EndpointProperty(f2).takes_positional(2)
    assert not EndpointProperty(f2).takes_positional(3)
    assert EndpointProperty(f3).takes_positional(5)
    assert not EndpointProperty(f4).takes_positional(1)  # k is required: bind decides
    assert EndpointProperty(f8, explicit_response_port=True).takes_positional(1)


class Color(enum.IntEnum):
    RED = 1


class Point:
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return isinstance(other, Point) and other.x == self.x


PLAIN = [0, -1, 2**70, 1.5, "s", b"b", True, None, (1, "a"), [1, 2.0], {"k": 1},
         ((1, 2), {"a": "b"}), (True, [1, 2, 3])]
NOT_PLAIN = [Color.RED, Point(1), (Point(1),), ((Point(1),), {}), {"k": Point(2)}, {1: 2},
             ((1, (2, 3)), {}), bytearray(b"x"), [[1, [2]]]]


@pytest.mark.parametrize("value", PLAIN + NOT_PLAIN)
def test_every_value_round_trips(value):
    assert pickle.loads(pickling.dumps(value)[0]) == value


def test_only_plain_values_take_the_c_pickler():
    for v in PLAIN:
        assert pickling._plain(v), v
    for v in NOT_PLAIN:
        assert not pickling._plain(v), v


def test_plain_and_cloudpickle_streams_decode_alike():
    import cloudpickle

    for v in PLAIN:
        assert pickle.loads(pickling.dumps(v)[0]) == pickle.loads(cloudpickle.dumps(v, protocol=5))
