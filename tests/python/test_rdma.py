"""podium.rdma with real procs: buffers owned by actors, read and written by the controller and
by other actors over UCX, passed through endpoints; errors and lifetime (docs/data.md)."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from podium.actor import Actor, ActorError, endpoint, SupervisionError
from podium.rdma import (
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
    RDMAAction,
    RDMABuffer,
)
from podium._core import data as _data
from conftest import run_script

T = 30  # seconds: bound on every get() below


def pattern(n: int, salt: int) -> bytearray:
    return bytearray((i * 131 + salt) & 0xFF for i in range(n))


class Owner(Actor):
    """Owns buffers over its own memory."""

    def __init__(self) -> None:
        self.mem = {}
        self.bufs = {}

    @endpoint
    def make(self, key: str, n: int, salt: int) -> RDMABuffer:
        self.mem[key] = pattern(n, salt)
        self.bufs[key] = RDMABuffer(memoryview(self.mem[key]))
        return self.bufs[key]

    @endpoint
    def contents(self, key: str) -> bytes:
        return bytes(self.mem[key])

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def registrations(self) -> int:
        return _data.registration_count()

    @endpoint
    def cycles(self, n: int) -> tuple:
        """n create/drop cycles over the same memory: registrations before and after."""
        mem = bytearray(4096)
        before = _data.registration_count()
        for _ in range(n):
            RDMABuffer(memoryview(mem)).drop().get(timeout=T)
        return before, _data.registration_count(), _data.buffer_count()

    @endpoint
    def read_own(self, key: str) -> bytes:
        out = bytearray(len(self.mem[key]))
        self.bufs[key].read_into(memoryview(out)).get(timeout=T)
        return bytes(out)


class Peer(Actor):
    """Reads and writes buffers it is handed."""

    @endpoint
    def read(self, buf: RDMABuffer) -> bytes:
        out = bytearray(buf.size())
        buf.read_into(memoryview(out)).get(timeout=T)
        return bytes(out)

    @endpoint
    def write(self, buf: RDMABuffer, data: bytes) -> None:
        buf.write_from(memoryview(bytearray(data))).get(timeout=T)

    @endpoint
    def hold(self, buf: RDMABuffer) -> RDMABuffer:
        self.held = buf
        return buf

    @endpoint
    def read_held(self) -> bytes:
        return _read(self.held)


class AsyncPeer(Actor):
    """Awaits its reads (an async actor: the Future is awaited on its event loop)."""

    @endpoint
    async def read(self, buf: RDMABuffer) -> bytes:
        out = bytearray(buf.size())
        await buf.read_into(memoryview(out))
        return bytes(out)


def _read(buf: RDMABuffer) -> bytes:
    out = bytearray(buf.size())
    buf.read_into(memoryview(out)).get(timeout=T)
    return bytes(out)


@pytest.fixture
def pair(spawn, procs):
    """An Owner on one proc and a Peer on the other proc of the module's mesh."""
    owner = spawn(Owner).slice(gpus=0)
    peer = spawn(Peer).slice(gpus=1)
    return owner, peer


def test_backend_queries():
    assert get_rdma_backend() in ("tcp", "ibverbs")
    assert isinstance(is_ibverbs_available(), bool)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert is_rdma_available() == is_ibverbs_available()
    assert any(issubclass(x.category, DeprecationWarning) for x in w)


def test_controller_and_another_actor_read_an_actors_buffer(pair, spawn):
    owner, peer = pair
    n = 3 << 20
    buf = owner.make.call_one("a", n, 1).get(timeout=T)
    assert isinstance(buf, RDMABuffer) and buf.size() == n
    assert isinstance(buf.owner, str) and buf.owner  # the owner actor's id
    dst = bytearray(n)
    assert buf.read_into(memoryview(dst)).get(timeout=T) is None
    assert dst == pattern(n, 1)
    assert peer.read.call_one(buf).get(timeout=T) == bytes(pattern(n, 1))
    ap = spawn(AsyncPeer).slice(gpus=1)
    assert ap.read.call_one(buf).get(timeout=T) == bytes(pattern(n, 1))
    # The owner reads its own buffer too.
    assert owner.read_own.call_one("a").get(timeout=T) == bytes(pattern(n, 1))


def test_controller_and_another_actor_write_an_actors_buffer(pair):
    owner, peer = pair
    n = 1 << 20
    buf = owner.make.call_one("w", n, 0).get(timeout=T)
    src = pattern(n // 2, 5)
    buf.write_from(memoryview(src)).get(timeout=T)
    got = owner.contents.call_one("w").get(timeout=T)
    assert got[: n // 2] == bytes(src) and got[n // 2:] == bytes(pattern(n, 0))[n // 2:]
    peer.write.call_one(buf, bytes(pattern(n, 9))).get(timeout=T)
    assert owner.contents.call_one("w").get(timeout=T) == bytes(pattern(n, 9))


def test_await_in_the_controller(pair):
    owner, _ = pair
    buf = owner.make.call_one("aw", 4096, 3).get(timeout=T)
    dst = bytearray(4096)

    async def main():
        await asyncio.wait_for(buf.read_into(memoryview(dst)), T)

    asyncio.run(main())
    assert dst == pattern(4096, 3)


def test_an_action_runs_several_ops_over_two_owners(spawn, procs):
    owners = spawn(Owner)
    b0 = owners.slice(gpus=0).make.call_one("x", 100_000, 1).get(timeout=T)
    b1 = owners.slice(gpus=1).make.call_one("x", 200_000, 2).get(timeout=T)
    w1 = owners.slice(gpus=1).make.call_one("y", 5000, 0).get(timeout=T)
    d0, d1 = bytearray(100_000), bytearray(250_000)
    src = pattern(5000, 77)
    action = RDMAAction().read_remote(memoryview(d0), b0).read_remote(memoryview(d1), b1)
    assert action.write_remote(w1, memoryview(src)) is action
    assert action.submit(timeout=T).get(timeout=T) is None
    assert d0 == pattern(100_000, 1)
    assert d1[:200_000] == pattern(200_000, 2) and d1[200_000:] == bytearray(50_000)
    assert owners.slice(gpus=1).contents.call_one("y").get(timeout=T) == bytes(src)
    # submit() again runs the same operations again.
    d0[:] = bytearray(100_000)
    action.submit(timeout=T).get(timeout=T)
    assert d0 == pattern(100_000, 1)
    with pytest.raises(NotImplementedError):
        RDMAAction().fetch_add(b0, memoryview(d0), 1)


def test_a_buffer_pickles_as_a_small_reference(pair):
    owner, peer = pair
    buf = owner.make.call_one("p", 8 << 20, 4).get(timeout=T)
    data = pickle.dumps(buf)
    assert len(data) < 4096  # a reference, not the bytes
    copy = pickle.loads(data)
    assert copy.size() == buf.size() and copy.owner == buf.owner
    # Through an endpoint and back: the returned copy still reads the owner's memory.
    back = peer.hold.call_one(buf).get(timeout=T)
    assert _read(back) == bytes(pattern(8 << 20, 4))


def test_bad_arguments_raise_before_any_transfer(pair):  # RD-1
    owner, _ = pair
    with pytest.raises(ValueError, match="size 0"):
        RDMABuffer(memoryview(bytearray(0)))
    with pytest.raises(ValueError, match="C-contiguous"):
        RDMABuffer(memoryview(bytearray(10))[::2])
    buf = owner.make.call_one("v", 1000, 0).get(timeout=T)
    before = _data.stats()["transfers"] if _data.available()[0] else 0
    with pytest.raises(ValueError, match="fewer than"):
        buf.read_into(memoryview(bytearray(999)))
    with pytest.raises(ValueError, match="more than"):
        buf.write_from(memoryview(bytearray(1001)))
    with pytest.raises(ValueError, match="read-only"):
        buf.read_into(memoryview(bytes(1000)))
    with pytest.raises(ValueError, match="C-contiguous"):
        buf.read_into(memoryview(bytearray(4000))[::2])
    with pytest.raises(ValueError):
        buf.read_into(memoryview(bytearray(1000)), timeout=-1)
    with pytest.raises(OverflowError):  # as Monarch's, for a timeout no u64 holds
        buf.write_from(memoryview(bytearray(1000)), timeout=-1)
    with pytest.raises(ValueError, match="nan"):
        buf.read_into(memoryview(bytearray(1000)), timeout=float("nan"))
    with pytest.raises(TypeError):
        RDMAAction().read_remote(memoryview(bytearray(1000)), buf).submit(timeout="5")
    assert _data.stats()["transfers"] == before


def test_a_timeout_of_any_length_is_a_limit_never_a_deadline_past(pair):  # RD-1, DA-5
    # A timeout past int64's nanoseconds (1e12 s, 2**70, infinity) once came out negative in
    # C++ and failed every checked transfer at once with TimeoutError: it means no limit.
    owner, _ = pair
    buf = owner.make.call_one("long", 4096, 5).get(timeout=T)
    dst = bytearray(4096)
    lease = _data.lease_config()
    _data.set_lease(0, lease[1])  # every transfer checked: the timeout bounds the check
    try:
        for timeout in (1e12, 2**70, float("inf"), 1e300):
            dst[:] = bytes(4096)
            assert buf.read_into(memoryview(dst), timeout=timeout).get(timeout=T) is None
            assert dst == pattern(4096, 5), timeout
            buf.write_from(memoryview(dst), timeout=timeout).get(timeout=T)
        buf.drop().get(timeout=T)
    finally:
        _data.set_lease(*lease)


def test_a_dropped_buffer_refuses_access(pair):  # RD-1, RD-2, DA-8
    owner, peer = pair
    buf = owner.make.call_one("d", 4096, 0).get(timeout=T)
    other = pickle.loads(pickle.dumps(buf))
    assert peer.hold.call_one(buf).get(timeout=T) is not None
    regs = owner.registrations.call_one().get(timeout=T)
    assert buf.drop().get(timeout=T) is None
    assert owner.registrations.call_one().get(timeout=T) == regs - 1
    with pytest.raises(RuntimeError, match="was dropped"):
        buf.read_into(memoryview(bytearray(4096)))
    with pytest.raises(RuntimeError, match="was dropped"):
        other.read_into(memoryview(bytearray(4096))).get(timeout=T)
    with pytest.raises(ActorError, match="was dropped") as info:  # raised in the peer
        peer.read_held.call_one().get(timeout=T)
    assert isinstance(info.value.exception, RuntimeError)
    buf.drop().get(timeout=T)  # twice: harmless


def test_a_wrong_token_is_refused(pair):  # DA-7
    owner, _ = pair
    buf = owner.make.call_one("t", 4096, 0).get(timeout=T)
    owner_state, ref = buf.__reduce__()[1]
    forged = RDMABuffer._rebuild(owner_state, (ref[0], "0" * 32) + ref[2:])
    with pytest.raises(PermissionError, match="token does not match"):
        forged.read_into(memoryview(bytearray(4096))).get(timeout=T)
    with pytest.raises(PermissionError):
        forged.drop().get(timeout=T)
    _read(buf)  # the real one still works


def test_create_drop_cycles_do_not_grow_registrations(pair):  # DA-2, DA-8
    owner, _ = pair
    before, after, live = owner.cycles.call_one(2000).get(timeout=120)
    assert after == before
    mem = bytearray(4096)
    start = _data.registration_count() if _data.available()[0] else 0
    for _ in range(200):
        RDMABuffer(memoryview(mem)).drop().get(timeout=T)
    assert _data.registration_count() == start


def test_an_owner_that_stops_releases_its_buffers(spawn, new_procs):  # RD-3
    pm = new_procs(gpus=1)
    owner = spawn(Owner, on=pm)
    probe = spawn(Owner, on=pm)
    bufs = [owner.make.call_one(k, 4096, 0).get(timeout=T) for k in ("a", "b", "c")]
    base = probe.registrations.call_one().get(timeout=T)
    assert base >= 3
    owner.stop().get(timeout=T)
    assert probe.registrations.call_one().get(timeout=T) == base - 3
    with pytest.raises(RuntimeError, match="stopped"):
        bufs[0].read_into(memoryview(bytearray(4096))).get(timeout=T)


def test_a_read_from_a_dead_owner_fails_naming_it(spawn, new_procs):  # RD-2
    pm = new_procs(gpus=1)
    owner = spawn(Owner, on=pm)
    buf = owner.make.call_one("k", 4096, 0).get(timeout=T)
    pid = owner.pid.call_one().get(timeout=T)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(SupervisionError) as info:
        buf.read_into(memoryview(bytearray(4096))).get(timeout=T)
    e = info.value
    text = str(e)
    assert buf.owner in text and socket.gethostname() in text and str(pid) in text
    assert "rank 0" in text
    assert e.pid == pid and e.host == socket.gethostname() and e.rank == 0


def _stopped(pid: int) -> bool:
    """True when every thread of `pid` is in the stopped state (SIGSTOP has taken effect)."""
    tasks = os.listdir(f"/proc/{pid}/task")
    for tid in tasks:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state not in ("T", "t"):
            return False
    return True


def _wait_for(cond, what: str, timeout: float = T) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout} s")
        time.sleep(0.005)


def test_a_timeout_cancels_the_transfer(spawn, new_procs):  # RD-2, DA-5
    pm = new_procs(gpus=1)
    owner = spawn(Owner, on=pm)
    buf = owner.make.call_one("s", 4096, 0).get(timeout=T)
    pid = owner.pid.call_one().get(timeout=T)
    before = _data.stats()["transfers"] if _data.available()[0] else 0
    os.kill(pid, signal.SIGSTOP)  # its owner cannot answer the check
    try:
        _wait_for(lambda: _stopped(pid), f"the owner (pid {pid}) stopped")
        with pytest.raises(TimeoutError, match="did not finish within 300 ms"):
            buf.write_from(memoryview(bytearray(b"x" * 4096)), timeout=0.3).get(timeout=T)
    finally:
        os.kill(pid, signal.SIGCONT)
    # The owner answers the late check before this read's (one link, in order); the write
    # that timed out never starts: one transfer ran, and the owner's bytes are unchanged.
    assert _read(buf) == bytes(pattern(4096, 0))
    assert _data.stats()["transfers"] == before + 1
    assert owner.contents.call_one("s").get(timeout=T) == bytes(pattern(4096, 0))


def test_torch_tensors():
    torch = pytest.importorskip("torch", reason="torch is not installed here; the memoryview "
                                                "path is tested above")
    t = torch.arange(1000, dtype=torch.float32)
    buf = RDMABuffer(t)
    out = torch.zeros(1000, dtype=torch.float32)
    buf.read_into(out).get(timeout=T)
    assert torch.equal(out, t)
    buf.write_from(torch.ones(500, dtype=torch.float32)).get(timeout=T)
    assert torch.equal(t[:500], torch.ones(500))
    with pytest.raises(ValueError):
        RDMABuffer(torch.zeros(4, 4))
    with pytest.raises(ValueError):
        RDMABuffer(torch.zeros(10)[::2])
    # A lazily conjugated view's bytes are not its values: refused, as NumPy refuses it.
    with pytest.raises(RuntimeError, match="conjugate"):
        RDMABuffer(torch.zeros(4, dtype=torch.complex64).conj())
    # A tensor that requires grad is moved as its memory (its autograd state is not touched).
    g = torch.zeros(1000, requires_grad=True)
    buf.read_into(g).get(timeout=T)
    assert torch.equal(g.detach(), torch.cat([torch.ones(500), t[500:]])) and g.requires_grad
    buf.drop().get(timeout=T)


class TensorOwner(Actor):
    """Owns 1-D CPU tensors (torch imported in the proc)."""

    @endpoint
    def make(self) -> tuple:
        import torch
        self.t = torch.arange(4096, dtype=torch.float32)
        self.half = torch.zeros(64, dtype=torch.bfloat16)
        # A view with a storage offset: the buffer covers just [1000, 2000).
        return RDMABuffer(self.t), RDMABuffer(self.t[1000:2000]), RDMABuffer(self.half)

    @endpoint
    def values(self) -> tuple:
        return self.t.clone(), self.half.clone()


def test_torch_tensors_owned_by_an_actor(spawn, procs):  # RD-1
    """Tensor buffers of an actor read into tensors (and a slice of one) by the controller and
    another actor, and written from tensor slices; views cover only their own elements."""
    torch = pytest.importorskip("torch", reason="torch is not installed here; the memoryview "
                                                "path is tested above")
    owner = spawn(TensorOwner).slice(gpus=0)
    peer = spawn(Peer).slice(gpus=1)
    whole, part, half = owner.make.call_one().get(timeout=T)
    assert (whole.size(), part.size(), half.size()) == (4096 * 4, 1000 * 4, 64 * 2)
    out = torch.empty(4096, dtype=torch.float32)
    whole.read_into(out).get(timeout=T)
    assert torch.equal(out, torch.arange(4096, dtype=torch.float32))
    big = torch.zeros(3000, dtype=torch.float32)
    part.read_into(big[500:1500]).get(timeout=T)  # into a view with a storage offset
    assert torch.equal(big[500:1500], torch.arange(1000, 2000, dtype=torch.float32))
    assert not big[:500].any() and not big[1500:].any()
    assert peer.read.call_one(part).get(timeout=T) == (
        torch.arange(1000, 2000, dtype=torch.float32).numpy().tobytes())
    src = torch.full((300,), -1.0)
    part.write_from(src[100:200]).get(timeout=T)  # 100 floats into the view's start
    half.write_from(torch.ones(64, dtype=torch.bfloat16)).get(timeout=T)
    t, h = owner.values.call_one().get(timeout=T)
    assert torch.equal(t[1000:1100], torch.full((100,), -1.0))
    assert torch.equal(t[:1000], torch.arange(1000, dtype=torch.float32))
    assert torch.equal(t[1100:], torch.arange(1100, 4096, dtype=torch.float32))
    assert torch.equal(h, torch.ones(64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="holds 40 bytes, fewer than the 16384"):
        whole.read_into(torch.empty(10, dtype=torch.float32))
    for b in (whole, part, half):
        b.drop().get(timeout=T)


class BigOwner(Actor):
    """Owns one large zeroed buffer, and answers pings."""

    @endpoint
    def make(self, n: int) -> RDMABuffer:
        self.mem = bytearray(n)
        return RDMABuffer(memoryview(self.mem))

    @endpoint
    def ping(self) -> int:
        return os.getpid()


def test_calls_are_answered_while_a_large_transfer_is_in_flight(spawn, procs):  # DA-11
    """Control never waits behind bulk (issue 19 item 6): a call_one to the owner, made
    while a 256 MiB read or write of its memory is in flight, is answered before that
    transfer is done, because the bytes move on the data threads, never on a loop or actor
    thread. Not a timing: the order of two completions (docs/data.md)."""
    owner = spawn(BigOwner).slice(gpus=0)
    n = 256 << 20
    buf = owner.make.call_one(n).get(timeout=T)
    local = memoryview(bytearray(n))
    buf.read_into(local).get(timeout=T)  # warm: pages on both sides
    answered_first = 0
    for write in (False, True, False, True):
        fut = buf.write_from(local) if write else buf.read_into(local)
        owner.ping.call_one().get(timeout=T)
        answered_first += 0 if fut.done() else 1
        fut.get(timeout=T)
    assert answered_first >= 1
    buf.drop().get(timeout=T)


def test_only_a_small_checked_transfer_drives_the_loop_while_waited_for(pair):  # DA-35
    """A transfer whose completion the loop reads (the owner's check of a small one) is
    waited for by driving the loop; a leased one, and a checked bulk one, are completed by
    the data plane, so their waiter sleeps and leaves the loop to threads that wait for
    messages."""
    owner, _peer = pair
    small = owner.make.call_one("d1", 4096, 2).get(timeout=T)
    big = owner.make.call_one("d2", 8 << 20, 3).get(timeout=T)
    out = bytearray(8 << 20)
    lease = _data.lease_config()
    _data.set_lease(0, lease[1])  # every transfer checked
    try:
        first = small.read_into(memoryview(out))
        assert first._core.drives_loop
        first.get(timeout=T)
        bulk = big.read_into(memoryview(out))
        assert not bulk._core.drives_loop
        bulk.get(timeout=T)
        assert out == pattern(8 << 20, 3)
    finally:
        _data.set_lease(*lease)
    small.read_into(memoryview(out)).get(timeout=T)  # checked: the lease comes with it
    leased = small.read_into(memoryview(out))
    # DA-43: copied by its caller under the lease, before read_into returned: nothing to wait
    # for, so nothing drives the loop.
    assert leased.done() and leased._core is None
    leased.get(timeout=T)
    assert out[:4096] == pattern(4096, 2)
    small.drop().get(timeout=T)
    big.drop().get(timeout=T)


def test_read_only_memory_can_be_read_but_not_written(pair):  # DA-7
    owner, peer = pair
    buf = RDMABuffer(memoryview(bytes(pattern(4096, 6))))  # owned by the controller
    try:
        assert peer.read.call_one(buf).get(timeout=T) == bytes(pattern(4096, 6))
        with pytest.raises(PermissionError, match="read-only"):
            buf.write_from(memoryview(bytearray(4096))).get(timeout=T)
    finally:
        buf.drop().get(timeout=T)


def test_buffers_over_one_region_share_one_registration():  # DA-2
    mem = bytearray(pattern(8192, 2))
    a = RDMABuffer(memoryview(mem))
    start = _data.registration_count()
    b = RDMABuffer(memoryview(mem))
    assert _data.registration_count() == start
    a.drop().get(timeout=T)
    assert _data.registration_count() == start  # b still holds it
    assert _read(b) == bytes(pattern(8192, 2))
    b.drop().get(timeout=T)
    assert _data.registration_count() == start - 1


def test_over_a_tcp_control_plane(tmp_path):  # RD-2
    """Procs that talk TCP (enable_transport): buffer references and checks travel over the
    authenticated TCP control plane; a dead owner still fails at once, named."""
    r = run_script(tmp_path, "tcp_rdma.py", textwrap.dedent("""
        import os, signal
        from podium.actor import Actor, SupervisionError, endpoint, enable_transport, this_host
        from podium.rdma import RDMABuffer

        enable_transport("tcp")

        class Owner(Actor):
            @endpoint
            def make(self):
                self.mem = bytearray(range(256)) * 64
                return RDMABuffer(memoryview(self.mem)), os.getpid()

            @endpoint
            def first(self):
                return self.mem[0]

        pm = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            owner = pm.spawn("owner", Owner)
            buf, pid = owner.make.call_one().get(timeout=30)
            dst = bytearray(buf.size())
            buf.read_into(memoryview(dst)).get(timeout=30)
            assert dst == bytearray(range(256)) * 64
            buf.write_from(memoryview(bytearray([7]))).get(timeout=30)
            assert owner.first.call_one().get(timeout=30) == 7
            os.kill(pid, signal.SIGKILL)
            try:
                buf.read_into(memoryview(dst)).get(timeout=30)
                print("no error")
            except SupervisionError as e:
                print("SupervisionError", e.pid == pid, e.rank)
        finally:
            pm.stop().get(timeout=30)
        """))
    assert "SupervisionError True 0" in r.stdout, r.stdout + r.stderr


def test_ucx_logs_to_stderr_and_is_given_only_options_it_knows(tmp_path):  # DA-24, DA-25
    """A program that moves bytes, with UCX's log at its most talkative level that still
    prints configuration: every UCX line is on stderr, stdout holds only the program's own
    line, and UCX does not warn about an option it does not know (RMA_PPLN_ENABLE is set only
    where UCX has it)."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import podium.actor as pa
        from podium.rdma import RDMABuffer

        class Owner(pa.Actor):
            @pa.endpoint
            def make(self) -> RDMABuffer:
                self.mem = bytearray(b"x" * 8192)
                return RDMABuffer(memoryview(self.mem))

        if __name__ == "__main__":
            pm = pa.this_host().spawn_procs(per_host={"procs": 1})
            buf = pm.spawn("owner", Owner).make.call_one().get(timeout=30)
            dst = bytearray(8192)
            buf.read_into(memoryview(dst)).get(timeout=30)
            print("moved", bytes(dst[:4]).decode())
            pm.stop().get(timeout=30)
    """))
    env = {k: v for k, v in os.environ.items() if k != "UCX_LOG_FILE"}
    env["UCX_LOG_LEVEL"] = "info"
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["moved xxxx"], r.stdout[-2000:]
    assert "UCX  INFO" in r.stderr  # UCX did log, and to stderr
    assert "invalid configuration" not in r.stderr, r.stderr[-3000:]
