"""podium._core bindings: ndslice wrappers, zero-copy message parts, futures that release
the GIL while they wait."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from podium._core import base, ndslice
from podium._src import pickling
from podium.actor import Actor, Extent, Point, endpoint


def test_extent_and_point_come_from_cpp():
    e = Extent(["hosts", "gpus"], [2, 4])
    assert str(e) == "{'hosts': 2, 'gpus': 4}"
    assert dict(e) == {"hosts": 2, "gpus": 4}
    assert e.nelements == 8 and len(e) == 2
    p = Point(6, e)
    assert p.rank == 6
    assert dict(p) == {"hosts": 1, "gpus": 2}
    assert str(p) == "{'hosts': 1/2, 'gpus': 2/4}"
    assert p.extent == e
    with pytest.raises(IndexError):
        Point(8, e)
    with pytest.raises(KeyError):
        p["cpus"]
    with pytest.raises(ValueError):
        Extent(["a", "a"], [1, 2])  # SL-1: duplicate label


def test_region_slicing_errors_map_to_python_exceptions():
    r = ndslice.Region(ndslice.Extent(["hosts", "gpus"], [2, 4]))
    assert r.select("gpus", 1).base_ranks() == [1, 5]
    assert r.select("gpus", ndslice.Range(1, 3, None)).base_ranks() == [1, 2, 5, 6]
    assert r.select("hosts", -1).base_ranks() == [4, 5, 6, 7]  # negative counts from the end
    with pytest.raises(TypeError, match="cpus"):
        r.select("cpus", 0)
    with pytest.raises(IndexError):
        r.select("gpus", 4)
    with pytest.raises(ValueError):
        r.select("gpus", ndslice.Range(None, None, -1))


def test_large_parts_are_shared_small_parts_copied():
    at_threshold = np.arange(base.COPY_THRESHOLD, dtype=np.uint8)
    bigger = np.ones(base.COPY_THRESHOLD + 1, dtype=np.uint8)
    small = np.ones(100, dtype=np.uint8)
    for arr, shared in ((bigger, True), (small, False), (at_threshold, False)):
        part = base.as_part(memoryview(arr))
        view = np.frombuffer(part, dtype=np.uint8)
        assert view.tobytes() == arr.tobytes()
        same = view.__array_interface__["data"][0] == arr.__array_interface__["data"][0]
        assert same == shared
        assert not view.flags.writeable  # received parts are read-only
    del part, view
    import gc

    gc.collect()
    base.release_deferred()
    assert base.deferred_count() == 0


def test_numpy_array_travels_out_of_band():
    arr = np.random.default_rng(0).random(8 * 1024 * 1024)  # 64 MiB
    parts = pickling.dumps({"a": arr})
    assert len(parts) == 2
    assert len(parts[0]) < 1024  # the stream holds no array bytes
    assert np.frombuffer(parts[1], dtype=arr.dtype).ctypes.data == arr.ctypes.data
    back = pickling.loads([base.as_part(p) for p in parts])
    assert np.array_equal(back["a"], arr)


class Sleeper(Actor):
    @endpoint
    def sleep(self, s: float) -> float:
        time.sleep(s)
        return s


def test_future_wait_releases_the_gil(spawn):
    mesh = spawn(Sleeper).slice(gpus=0)
    ticks = 0
    stop = threading.Event()

    def spin():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    try:
        assert mesh.sleep.call_one(0.5).get(timeout=10) == 0.5
    finally:
        stop.set()
        t.join(5)
    assert ticks > 20  # the other thread ran all along (about 400 when idle)


def test_big_array_round_trip(spawn):
    class Echo(Actor):
        @endpoint
        def echo(self, a):
            return a

        @endpoint
        def checksum(self, a):
            return float(a.sum())

    arr = np.random.default_rng(1).random(8 * 1024 * 1024)  # 64 MiB
    one = spawn(Echo).slice(gpus=0)
    assert one.checksum.call_one(arr).get(timeout=30) == pytest.approx(float(arr.sum()))
    back = one.echo.call_one(arr).get(timeout=30)
    assert np.array_equal(back, arr)
