"""podium.rdma on one host through shared pages (docs/data.md, "Shared pages"): a buffer's whole
pages are moved into a memfd in place when it is made, readers on its host map them and copy
with memcpy, the edges go through CMA, and the pages are given back when the buffer ends."""

from __future__ import annotations

import mmap
import os
import signal
import textwrap

import pytest

from podium.actor import endpoint, SupervisionError
from podium.rdma import RDMABuffer
from podium._core import data as _data
from conftest import eventually, run_script
from test_rdma import Owner as BaseOwner, pattern

T = 30  # seconds: bound on every get() below
N = (1 << 20) + 123  # whole pages inside, and two partial pages at its ends


def mapping_of(addr: int) -> str:
    """The permissions and path of the mapping of this process that holds `addr`."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                parts = line.split()
                return " ".join([parts[1]] + parts[5:])
    return ""


class Owner(BaseOwner):
    """test_rdma's Owner, with file mappings, pokes and a look at its own mappings. It shares
    pages even where a GPU driver is mapped (PODIUM_RDMA_SHM=1: no driver pins its buffers)."""

    def __init__(self) -> None:
        super().__init__()
        os.environ["PODIUM_RDMA_SHM"] = "1"

    @endpoint
    def make_file(self, path: str, n: int) -> RDMABuffer:
        f = open(path, "r+b")
        self.mem[path] = (f, mmap.mmap(f.fileno(), n))
        return RDMABuffer(memoryview(self.mem[path][1]))

    @endpoint
    def flush_file(self, path: str) -> None:
        self.mem[path][1].flush()

    @endpoint
    def poke(self, key: str, at: int, value: int) -> None:
        self.mem[key][at] = value

    @endpoint
    def make_for_one_read(self, key: str, n: int, salt: int) -> RDMABuffer:
        self.mem[key] = pattern(n, salt)
        self.bufs[key] = RDMABuffer._for_one_read(memoryview(self.mem[key]))
        return self.bufs[key]

    @endpoint
    def set_lease(self, ms: int, max_bytes: int) -> None:
        _data.set_lease(ms, max_bytes)

    @endpoint
    def mapping(self, key: str, offset: int) -> str:
        import ctypes
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.mem[key]))
        return mapping_of(base + offset)


def test_a_large_buffer_moves_through_shared_pages_with_its_edges(spawn):  # DA-29, DA-30, DA-31
    # The two leased operations below must find their lease alive however slow the machine is
    # between them (with the default 250 ms, a CI rehearsal on the 2-core VM counted one caller
    # copy instead of two): a minute's lease, asked for and granted.
    owner = spawn(Owner).slice(gpus=0)
    saved = _data.lease_config()
    _data.set_lease(60_000, saved[1])
    owner.set_lease.call_one(60_000, saved[1]).get(timeout=T)
    try:
        _shared_pages_with_edges(owner)
    finally:
        _data.set_lease(*saved)
        owner.set_lease.call_one(*saved).get(timeout=T)


def _shared_pages_with_edges(owner) -> None:
    buf = owner.make.call_one("a", N, 1).get(timeout=T)
    assert buf._window is not None, "1 MiB of private memory is moved into shared pages"
    fd, ino, dev, begin, end = buf._window
    assert end - begin >= N - 2 * 4096 and begin % 4096 == 0 and end % 4096 == 0
    assert owner.mapping.call_one("a", N // 2).get(timeout=T).startswith("rw-s /memfd:podium-rdma")
    before = _data.stats()
    dst = bytearray(N)
    buf.read_into(memoryview(dst)).get(timeout=T)  # checked
    assert bytes(dst) == pattern(N, 1)
    owner.poke.call_one("a", 0, 0xEE).get(timeout=T)  # the edges, read through CMA
    owner.poke.call_one("a", N - 1, 0xDD).get(timeout=T)
    owner.poke.call_one("a", N // 2, 0xCC).get(timeout=T)  # the owner's writes, seen at once
    buf.read_into(memoryview(dst)).get(timeout=T)  # leased: copied by this thread
    want = bytearray(pattern(N, 1))
    want[0], want[N - 1], want[N // 2] = 0xEE, 0xDD, 0xCC
    assert dst == want
    for _ in range(2):  # checked, then leased
        src = os.urandom(N)
        buf.write_from(memoryview(bytearray(src))).get(timeout=T)
        assert owner.contents.call_one("a").get(timeout=T) == src
    after = _data.stats()
    assert after["window_bytes"] - before["window_bytes"] >= 4 * (end - begin)
    assert after["caller_copied"] - before["caller_copied"] >= 2
    assert after["windows"] >= 1
    buf.drop().get(timeout=T)


def test_a_4_mib_buffer_is_copied_by_its_reader_with_its_edges_in_one_call(spawn):  # DA-31
    n = 4 << 20  # the bound: the partial pages at the ends do not push it over
    owner = spawn(Owner).slice(gpus=0)
    buf = owner.make.call_one("big", n, 3).get(timeout=T)
    assert buf._window is not None
    dst = bytearray(n)
    buf.read_into(memoryview(dst)).get(timeout=T)  # checked: the lease comes with it
    owner.poke.call_one("big", 0, 0xA1).get(timeout=T)
    owner.poke.call_one("big", n - 1, 0xA2).get(timeout=T)
    before = _data.stats()["caller_copied"]
    buf.read_into(memoryview(dst)).get(timeout=T)  # leased
    assert _data.stats()["caller_copied"] == before + 1
    want = bytearray(pattern(n, 3))
    want[0], want[n - 1] = 0xA1, 0xA2
    assert dst == want
    buf.drop().get(timeout=T)


def test_a_bulk_transfer_streams_its_copy_and_moves_every_byte(spawn):  # DA-36
    n = (24 << 20) + 123  # over kStreamMinBytes, partial pages at both ends
    owner = spawn(Owner).slice(gpus=0)
    buf = owner.make.call_one("bulk", n, 4).get(timeout=T)
    assert buf._window is not None
    dst = bytearray(n)
    buf.read_into(memoryview(dst)).get(timeout=T)
    assert dst == pattern(n, 4)
    src = os.urandom(n)
    buf.write_from(memoryview(bytearray(src))).get(timeout=T)
    assert owner.contents.call_one("bulk").get(timeout=T) == src
    buf.drop().get(timeout=T)


def test_a_dropped_buffer_gives_its_pages_back_and_its_owner_keeps_its_bytes(spawn):  # DA-32
    owner = spawn(Owner).slice(gpus=0)
    buf = owner.make.call_one("b", N, 2).get(timeout=T)
    assert buf._window is not None
    src = os.urandom(N)
    buf.write_from(memoryview(bytearray(src))).get(timeout=T)
    buf.drop().get(timeout=T)
    eventually(lambda: owner.mapping.call_one("b", N // 2).get(timeout=T).startswith("rw-p"),
               10, "the owner's pages private again after the drop")
    assert owner.contents.call_one("b").get(timeout=T) == src
    owner.poke.call_one("b", 5, 0x42).get(timeout=T)
    assert owner.contents.call_one("b").get(timeout=T)[5] == 0x42


def test_a_buffer_made_for_one_read_keeps_its_pages_private(spawn):  # DA-38
    owner = spawn(Owner).slice(gpus=0)
    once = owner.make_for_one_read.call_one("once", N, 3).get(timeout=T)
    assert once._window is None, "a buffer made for one read is not moved into shared pages"
    assert owner.mapping.call_one("once", N // 2).get(timeout=T).startswith("rw-p")
    shared = owner.make.call_one("shared", N, 4).get(timeout=T)
    assert shared._window is not None, "the same size made as a user's buffer is"
    before = _data.stats()
    dst = bytearray(N)
    once.read_into(memoryview(dst)).get(timeout=T)
    assert dst == pattern(N, 3)
    assert _data.stats()["window_bytes"] == before["window_bytes"], "read through CMA"
    once.drop().get(timeout=T)
    shared.drop().get(timeout=T)


def test_a_file_mapping_keeps_writing_to_its_file(spawn, tmp_path):  # DA-29
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(N))
    owner = spawn(Owner).slice(gpus=0)
    buf = owner.make_file.call_one(str(path), N).get(timeout=T)
    assert buf._window is None, "a file mapping is never moved"
    src = os.urandom(N)
    buf.write_from(memoryview(bytearray(src))).get(timeout=T)
    owner.flush_file.call_one(str(path)).get(timeout=T)
    assert path.read_bytes() == src
    buf.drop().get(timeout=T)


def test_a_read_right_after_the_owner_is_killed_fails_naming_it(spawn, new_procs):  # DA-33, RD-2
    pm = new_procs(gpus=1)
    owner = spawn(Owner, on=pm)
    buf = owner.make.call_one("c", N, 3).get(timeout=T)
    pid = owner.pid.call_one().get(timeout=T)
    dst = bytearray(N)
    buf.read_into(memoryview(dst)).get(timeout=T)  # a lease: the next read asks no one
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(SupervisionError) as e:
        buf.read_into(memoryview(dst)).get(timeout=T)
    assert e.value.pid == pid and e.value.rank == 0


def test_sharing_off_keeps_every_transfer_on_cma(tmp_path):  # DA-29
    r = run_script(tmp_path, "no_shm.py", textwrap.dedent("""
        import os
        os.environ["PODIUM_RDMA_SHM"] = "0"
        from podium.actor import Actor, endpoint, this_host
        from podium.rdma import RDMABuffer
        from podium._core import data as _data

        class Owner(Actor):
            @endpoint
            def make(self, n):
                self.mem = bytearray(os.urandom(n))
                return RDMABuffer(memoryview(self.mem)), bytes(self.mem)

        pm = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            buf, want = pm.spawn("owner", Owner).make.call_one(1 << 21).get(timeout=30)
            dst = bytearray(buf.size())
            for _ in range(2):
                buf.read_into(memoryview(dst)).get(timeout=30)
            print("window", buf._window, "same", bytes(dst) == want,
                  "through windows", _data.stats()["window_bytes"])
        finally:
            pm.stop().get(timeout=30)
        """))
    assert "window None same True through windows 0" in r.stdout, r.stdout + r.stderr
