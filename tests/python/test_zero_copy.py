"""Large arrays and tensors travel beside the pickle stream, not inside it (issue 19, part 5;
PK-1 in python/podium/_src/pickling.py, BU-1 in cpp/podium/base/buffer.h).

A NumPy array or CPU torch tensor above the copy threshold becomes a message part of its own,
written with writev; a call that alone received such a part unpickles it writable, over the
received bytes themselves (a NumPy array from a read-only buffer would be read-only: its
`writeable` flag is how the test sees that no copy was made)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from podium._src import pickling
from podium.actor import Actor, endpoint, this_host

T = 30
pytestmark = pytest.mark.timeout(120)


class Receiver(Actor):
    @endpoint
    def numpy_info(self, a: np.ndarray) -> tuple:
        a[0] = -1  # writable: the part's own bytes
        return bool(a.flags.writeable), bool(a.flags.owndata), int(a.sum())

    @endpoint
    def torch_info(self, t, p) -> tuple:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a read-only buffer under a tensor warns
            t.add_(1)
        return (tuple(t.shape), t.stride(), str(t.dtype), float(t.sum()),
                type(p).__name__, p.requires_grad)

    @endpoint
    def give(self, n: int) -> np.ndarray:
        return np.arange(n, dtype=np.int64)


def test_a_numpy_array_is_a_part_of_its_own_and_arrives_writable_without_a_copy():  # BU-1
    a = np.arange(100_000, dtype=np.int64)
    parts = pickling.dumps((a,))
    assert len(parts) == 2 and memoryview(parts[1]).nbytes == a.nbytes
    assert len(parts[0]) < 1000  # the bytes are not in the stream
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        r = procs.spawn("recv", Receiver)
        writeable, owndata, total = r.numpy_info.call_one(a).get(timeout=T)
        assert writeable and not owndata  # a view over the received part, not a copy
        assert total == int(a.sum()) - 0 - 1  # a[0] was 0, set to -1 in the actor
        assert a[0] == 0  # the sender's array is untouched
    finally:
        procs.stop().get(timeout=T)


def test_a_reply_part_shared_with_the_future_arrives_read_only():  # BU-1
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        r = procs.spawn("recv", Receiver)
        out = r.give.call_one(50_000).get(timeout=T)
        assert out.tolist() == list(range(50_000))
        assert not out.flags.writeable  # the future keeps the reply: not the sole holder
    finally:
        procs.stop().get(timeout=T)


def test_a_torch_tensor_travels_out_of_band_and_arrives_writable():  # PK-1
    torch = pytest.importorskip("torch", reason="torch is not installed")
    t = torch.arange(200_000, dtype=torch.float64).reshape(400, 500)[:, 100:200]
    p = torch.nn.Parameter(torch.ones(65536))
    parts = pickling.dumps(((t, p), {}))
    sizes = sorted(memoryview(x).nbytes for x in parts[1:])
    assert sizes == [65536 * 4, 200_000 * 8]  # both storages beside the stream
    assert len(parts[0]) < 4096
    back_t, back_p = pickle.loads(parts[0], buffers=[bytearray(x) for x in parts[1:]])[0]
    assert torch.equal(back_t, t) and back_t.stride() == t.stride()
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        r = procs.spawn("recv", Receiver)
        shape, stride, dtype, total, ptype, grad = r.torch_info.call_one(t, p).get(timeout=T)
        assert shape == (400, 100) and stride == (500, 1) and dtype == "torch.float64"
        assert total == float((t + 1).sum())
        assert ptype == "Parameter" and grad is True
    finally:
        procs.stop().get(timeout=T)
