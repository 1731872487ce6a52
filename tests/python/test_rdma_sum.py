"""Summed reads (RD-8, DA-40, DA-41): ``read_into(dst, checksum=True)`` resolves to the wrapping
sum of the little-endian uint64 words of the bytes read, computed in C++ by the data plane
(docs/data_summed.md); compared here with a NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from podium.actor import Actor, endpoint
from podium.rdma import RDMAAction, RDMABuffer
from podium._core import data as _data

T = 30  # seconds: bound on every get() below


def pattern(n: int, salt: int) -> bytearray:
    """Bytes that use every value (0xff included), so large sums wrap around 2**64."""
    return bytearray((i * 131 + salt) & 0xFF for i in range(n))


def word_sum(b: bytes) -> int:
    """The reference: NumPy's uint64 sum (it wraps) of the zero-padded little-endian words."""
    padded = bytes(b) + bytes(-len(b) % 8)
    with np.errstate(over="ignore"):
        return int(np.frombuffer(padded, dtype="<u8").sum(dtype=np.uint64))


class Owner(Actor):
    def __init__(self) -> None:
        self.mem = {}

    @endpoint
    def make(self, key: str, n: int, salt: int) -> RDMABuffer:
        self.mem[key] = pattern(n, salt)
        return RDMABuffer(memoryview(self.mem[key]))


class BigOwner(Actor):
    @endpoint
    def make(self, n: int) -> RDMABuffer:
        import os
        self.mem = bytearray(os.urandom(n))
        return RDMABuffer(memoryview(self.mem))

    @endpoint
    def digest(self) -> str:
        import hashlib
        return hashlib.sha256(self.mem).hexdigest()


class Peer(Actor):
    @endpoint
    def read_summed(self, buf: RDMABuffer) -> tuple:
        out = bytearray(buf.size())
        total = buf.read_into(memoryview(out), checksum=True).get(timeout=T)
        return total, bytes(out)


SIZES = [1, 7, 8, 13, 4096 + 5, 408392, (8 << 20) + 3]


def test_a_summed_read_is_the_word_sum_of_the_bytes_read(spawn):  # RD-8, DA-40, DA-41
    owner = spawn(Owner).slice(gpus=0)
    for n in SIZES:
        buf = owner.make.call_one(f"s{n}", n, n % 251).get(timeout=T)
        # dst is larger than the buffer, with non-zero bytes past it: only the n bytes read
        # count.
        dst = bytearray(b"\xa5" * (n + 11))
        total = buf.read_into(memoryview(dst), checksum=True).get(timeout=T)
        assert dst[:n] == pattern(n, n % 251)
        assert isinstance(total, int) and 0 <= total < 2**64
        assert total == word_sum(dst[:n]), f"{n} bytes"
        # Without checksum the same read resolves to None, as Monarch's.
        assert buf.read_into(memoryview(dst), timeout=T).get(timeout=T) is None


def test_a_multi_chunk_summed_read_is_whole(spawn):  # RD-8, DA-41 (unleased, chunked: DA-3)
    owner = spawn(Owner).slice(gpus=0)
    n = (8 << 20) + 3  # over the lease bound and the 4 MiB chunk
    assert n > _data.lease_config()[1]
    buf = owner.make.call_one("big", n, 9).get(timeout=T)
    dst = bytearray(n)
    checked = _data.lease_stats()["checked"]
    total = buf.read_into(memoryview(dst), checksum=True).get(timeout=T)
    assert _data.lease_stats()["checked"] == checked + 1
    assert dst == pattern(n, 9) and total == word_sum(pattern(n, 9))


def test_a_streamed_summed_read_is_summed_by_its_chunks(spawn):  # DA-44, DA-36, DA-40
    # 24 MiB + 3: chunks through the owner's shared pages with streamed stores (DA-36), each
    # summed as it is copied; the sum is the bytes' whatever chunk summed what.
    import hashlib
    owner = spawn(BigOwner).slice(gpus=0)
    n = (24 << 20) + 3
    buf = owner.make.call_one(n).get(timeout=T)
    assert buf._window is not None
    dst = bytearray(n)
    for _ in range(2):  # the second with the reader's window already mapped
        dst[:] = bytes(n)
        total = buf.read_into(memoryview(dst), checksum=True).get(timeout=T)
        assert hashlib.sha256(dst).hexdigest() == owner.digest.call_one().get(timeout=T)
        assert total == word_sum(dst)


def test_a_leased_summed_read_is_summed_too(spawn):  # RD-8, DA-41 on the leased path (DA-28)
    owner = spawn(Owner).slice(gpus=0)
    saved = _data.lease_config()
    _data.set_lease(20_000, 4 << 20)  # long enough that the second read surely runs leased
    try:
        buf = owner.make.call_one("leased", 1000, 3).get(timeout=T)
        dst = bytearray(1000)
        first = buf.read_into(memoryview(dst), checksum=True).get(timeout=T)
        leased = _data.lease_stats()["leased"]
        dst[:] = bytes(1000)
        again = buf.read_into(memoryview(dst), checksum=True).get(timeout=T)
        assert _data.lease_stats()["leased"] == leased + 1
        assert first == again == word_sum(pattern(1000, 3)) and dst == pattern(1000, 3)
    finally:
        _data.set_lease(*saved)


def test_a_summed_read_copied_at_once_is_summed_at_every_offset(spawn):  # DA-43, DA-40
    # Copied by read_into itself under the lease: the shared pages' part summed as it is
    # copied where the destination's words are 8-aligned, after the copy where not, and the
    # partial pages at both ends summed apart; every way adds up to the same sum.
    owner = spawn(Owner).slice(gpus=0)
    saved = _data.lease_config()
    _data.set_lease(20_000, 4 << 20)
    try:
        n = 408392 + 5
        buf = owner.make.call_one("offsets", n, 11).get(timeout=T)
        assert buf._window is not None, "its whole pages are shared: the window's path"
        bytes_ = pattern(n, 11)
        want = word_sum(bytes_)
        backing = bytearray(n + 16)
        for offset in range(9):
            # A plain read first: it renews the lease if it ran low (a check, then a grant).
            buf.read_into(memoryview(backing)[:n]).get(timeout=T)
            backing[:] = b"\x5a" * len(backing)
            summed = buf.read_into(memoryview(backing)[offset:offset + n], checksum=True)
            assert summed.done(), "copied at once (DA-43)"
            assert summed.get(timeout=T) == want, f"offset {offset}"
            assert backing[offset:offset + n] == bytes_
    finally:
        _data.set_lease(*saved)


def test_a_summed_read_from_another_proc(spawn):  # RD-8
    owner = spawn(Owner).slice(gpus=0)
    peer = spawn(Peer).slice(gpus=1)
    for n in (1, 4099, (8 << 20) + 3):
        buf = owner.make.call_one(f"p{n}", n, 7).get(timeout=T)
        total, got = peer.read_summed.call_one(buf).get(timeout=T)
        assert got == bytes(pattern(n, 7)) and total == word_sum(got)


def test_an_action_sums_only_its_summed_reads(spawn):  # RD-8
    owner = spawn(Owner).slice(gpus=0)
    a = owner.make.call_one("a", 333, 1).get(timeout=T)
    b = owner.make.call_one("b", 5000, 2).get(timeout=T)
    w = owner.make.call_one("w", 64, 0).get(timeout=T)
    da, db = bytearray(333), bytearray(5000)
    action = (RDMAAction().read_remote(memoryview(da), a, checksum=True)
              .read_remote(memoryview(db), b)
              .write_remote(w, memoryview(bytearray(64))))
    assert action.submit(timeout=T).get(timeout=T) == [word_sum(pattern(333, 1)), None, None]
    assert db == pattern(5000, 2)
    # No summed read: None, as Monarch's.
    assert RDMAAction().read_remote(memoryview(db), b).submit(timeout=T).get(timeout=T) is None


def test_summed_reads_into_tensors_and_refusals(spawn):  # RD-8, RD-2
    torch = pytest.importorskip("torch")
    owner = spawn(Owner).slice(gpus=0)
    buf = owner.make.call_one("t", 1001, 5).get(timeout=T)
    dst = torch.zeros(1001, dtype=torch.uint8)
    assert buf.read_into(dst, checksum=True).get(timeout=T) == word_sum(pattern(1001, 5))
    # The sum is made in host memory: a device destination is refused before anything moves.
    with pytest.raises(NotImplementedError, match="checksum=True"):
        buf.read_into(torch.zeros(1001, dtype=torch.uint8, device="meta"), checksum=True)
    # A summed read fails as any read does.
    buf.drop().get(timeout=T)
    with pytest.raises(RuntimeError, match="dropped"):
        buf.read_into(dst, checksum=True).get(timeout=T)
