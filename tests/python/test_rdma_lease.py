"""Checked leases of podium.rdma (docs/data.md, "Leases"): a successful check by a buffer's
owner grants a short lease, under which later small transfers of the same buffer and kind skip
the check; a drop waits until the leases its owner granted ended, or until their readers
confirmed their revocation (DA-26, DA-27, DA-28, DA-42)."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from podium.actor import Actor, ActorError, endpoint, SupervisionError
from podium.rdma import RDMABuffer
from podium._core import data as _data
from conftest import run_script

T = 30  # seconds: bound on every get() below
LONG_MS = 3000  # a lease long enough that two calls in a row surely fall inside it


class Owner(Actor):
    """Owns buffers; says how many checks its process answered."""

    def __init__(self) -> None:
        self.mem = {}

    @endpoint
    def set_lease(self, ms: int, max_bytes: int) -> None:
        _data.set_lease(ms, max_bytes)

    @endpoint
    def make(self, key: str, n: int) -> RDMABuffer:
        self.mem[key] = bytearray(bytes([len(key)]) * n)
        return RDMABuffer(memoryview(self.mem[key]))

    @endpoint
    def contents(self, key: str) -> bytes:
        return bytes(self.mem[key])

    @endpoint
    def stats(self) -> dict:
        return _data.lease_stats()

    @endpoint
    def registrations(self) -> int:
        return _data.registration_count()

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Peer(Owner):
    """Reads other actors' buffers (and has an Owner's lease settings, stats and pid)."""

    @endpoint
    def read(self, buf: RDMABuffer) -> bytes:
        out = bytearray(buf.size())
        buf.read_into(memoryview(out)).get(timeout=T)
        return bytes(out)


def _ended(pid: int) -> bool:
    """Whether `pid` has ended: gone, or a zombie (its memory is released by then)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):  # gone between the lookup and the read
        return True


def _checks(owner) -> int:
    return owner.stats.call_one().get(timeout=T)["checks_answered"]


def _read(buf: RDMABuffer) -> bytes:
    out = bytearray(buf.size())
    buf.read_into(memoryview(out)).get(timeout=T)
    return bytes(out)


@pytest.fixture
def leases():
    """set(ms, max_bytes) sets the controller's lease; restored afterwards."""
    saved = _data.lease_config()

    def do(ms: int, max_bytes: int = 4 << 20) -> None:
        _data.set_lease(ms, max_bytes)

    yield do
    _data.set_lease(*saved)


@pytest.fixture
def owner(spawn, procs, leases):
    """An Owner granting leases of LONG_MS (restored to the default afterwards)."""
    o = spawn(Owner).slice(gpus=0)
    config = _data.lease_config()
    o.set_lease.call_one(LONG_MS, 4 << 20).get(timeout=T)
    leases(LONG_MS)
    yield o
    o.set_lease.call_one(*config).get(timeout=T)


def test_a_second_read_sends_no_check(owner):  # DA-26, DA-28
    buf = owner.make.call_one("ab", 4096).get(timeout=T)
    before = _checks(owner)
    assert _read(buf) == b"\x02" * 4096
    assert _checks(owner) == before + 1
    leased = _data.lease_stats()["leased"]
    assert _read(buf) == b"\x02" * 4096
    assert _read(buf) == b"\x02" * 4096
    assert _checks(owner) == before + 1  # both under the lease: no message to the owner
    assert _data.lease_stats()["leased"] == leased + 2
    assert _data.lease_left(buf._owner.proc, buf._id, False) > 0


def test_a_leased_transfer_is_copied_before_it_returns(owner):  # DA-43, DA-31
    from podium.rdma import RDMAAction
    n = 3 * 4096 + 5
    buf = owner.make.call_one("abc", n).get(timeout=T)
    dst = bytearray(n)
    buf.read_into(memoryview(dst)).get(timeout=T)  # checked: the lease comes with it
    buf.write_from(memoryview(bytearray(b"\x07" * n))).get(timeout=T)  # the write lease too
    before, leased = _data.stats(), _data.lease_stats()["leased"]
    dst[:] = bytes(n)
    read = buf.read_into(memoryview(dst))
    assert read.done() and read._core is None, "copied by read_into itself, under the lease"
    assert read.get(timeout=T) is None and bytes(dst) == b"\x07" * n
    action = RDMAAction().read_remote(memoryview(dst), buf)
    assert action.submit().done()
    wrote = buf.write_from(memoryview(bytearray(b"\x09" * n)))
    assert wrote.done() and wrote.get(timeout=T) is None
    assert owner.contents.call_one("abc").get(timeout=T) == b"\x09" * n
    after = _data.stats()
    assert after["transfers"] - before["transfers"] == 3  # each counted once
    assert after["caller_copied"] - before["caller_copied"] == 3
    assert _data.lease_stats()["leased"] == leased + 3
    # A summed read too, with its sum (DA-41); a list of one from an action.
    want = sum(int.from_bytes((b"\x09" * n + bytes(3))[i:i + 8], "little")
               for i in range(0, n, 8)) % (1 << 64)
    summed = buf.read_into(memoryview(dst), checksum=True)
    assert summed.done() and summed.get(timeout=T) == want
    action = RDMAAction().read_remote(memoryview(dst), buf, checksum=True)
    assert action.submit().get(timeout=T) == [want]
    # What it leaves to the transfer: no time at all.
    with pytest.raises(TimeoutError):
        buf.read_into(memoryview(dst), timeout=0).get(timeout=T)


def test_a_forged_token_gets_no_lease(owner):  # DA-26, DA-7
    buf = owner.make.call_one("f", 4096).get(timeout=T)
    _read(buf)  # the real token holds a lease
    owner_state, ref = buf.__reduce__()[1]
    forged = RDMABuffer._rebuild(owner_state, (ref[0], "0" * 32) + ref[2:])
    before = _checks(owner)
    with pytest.raises(PermissionError, match="token does not match"):
        forged.read_into(memoryview(bytearray(4096))).get(timeout=T)
    assert _checks(owner) == before + 1


def test_a_write_lease_is_not_a_read_lease(owner):  # DA-26
    buf = owner.make.call_one("rw", 4096).get(timeout=T)
    before = _checks(owner)
    _read(buf)
    assert _checks(owner) == before + 1
    buf.write_from(memoryview(b"\x07" * 4096)).get(timeout=T)  # needs a check of its own
    assert _checks(owner) == before + 2
    buf.write_from(memoryview(b"\x08" * 4096)).get(timeout=T)
    assert _read(buf) == b"\x08" * 4096
    assert _checks(owner) == before + 2  # each kind under its own lease
    assert owner.contents.call_one("rw").get(timeout=T) == b"\x08" * 4096
    # And the other way round: a write lease first does not serve a read.
    other = owner.make.call_one("wr", 4096).get(timeout=T)
    other.write_from(memoryview(b"\x01" * 4096)).get(timeout=T)
    assert _checks(owner) == before + 3
    assert _read(other) == b"\x01" * 4096
    assert _checks(owner) == before + 4


def test_lease_zero_checks_every_time(owner, leases):  # DA-28
    buf = owner.make.call_one("z", 4096).get(timeout=T)
    leases(0)
    before = _checks(owner)
    for i in range(3):
        _read(buf)
        assert _checks(owner) == before + i + 1
    assert _data.lease_left(buf._owner.proc, buf._id, False) == 0


def test_the_environment_sets_the_lease():  # DA-28
    code = "from podium._core import data; print(*data.lease_config())"
    env = dict(os.environ, PODIUM_RDMA_LEASE_MS="0", PODIUM_RDMA_LEASE_MAX_BYTES="8192")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=T)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "8192"]
    env.pop("PODIUM_RDMA_LEASE_MS")
    env.pop("PODIUM_RDMA_LEASE_MAX_BYTES")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=T)
    assert out.stdout.split() == ["250", str(4 << 20)]


def test_a_transfer_larger_than_the_bound_still_checks(owner, leases):  # DA-28
    leases(LONG_MS, 8192)
    big = owner.make.call_one("big", 16384).get(timeout=T)
    small = owner.make.call_one("s", 8192).get(timeout=T)
    before = _checks(owner)
    _read(big)
    _read(big)
    assert _checks(owner) == before + 2
    _read(small)
    _read(small)
    assert _checks(owner) == before + 3
    assert _data.lease_left(big._owner.proc, big._id, False) == 0  # none was asked for


def test_a_drop_revokes_the_leases_it_granted(owner, spawn, procs):  # DA-42, DA-27, DA-8
    peer = spawn(Peer).slice(gpus=1)
    peer.set_lease.call_one(LONG_MS, 4 << 20).get(timeout=T)
    buf = owner.make.call_one("dd", 4096).get(timeout=T)
    assert peer.read.call_one(buf).get(timeout=T) == b"\x02" * 4096  # the peer's lease
    _read(buf)  # and the controller's
    assert _data.lease_left(buf._owner.proc, buf._id, False) > 0
    before = owner.stats.call_one().get(timeout=T)
    answered = _data.lease_stats()["revocations_answered"]
    peer_answered = Peer_stats(spawn, peer)
    regs = owner.registrations.call_one().get(timeout=T)
    buf.drop().get(timeout=T)
    # The drop was held back for the leases (a delayed release), and answered once both
    # lessees, this process and the peer's, confirmed their revocation: no transfer of theirs
    # holds the buffer any more, and their leases are gone, long before their LONG_MS end.
    after = owner.stats.call_one().get(timeout=T)
    assert after["delayed_releases"] == before["delayed_releases"] + 1
    assert after["released_on_revocation"] == before["released_on_revocation"] + 1
    assert _data.lease_stats()["revocations_answered"] == answered + 1
    assert Peer_stats(spawn, peer) == peer_answered + 1
    assert _data.lease_left(buf._owner.proc, buf._id, False) == 0
    # (<=: buffers of this proc's earlier, stopped owners may end their leases meanwhile)
    assert owner.registrations.call_one().get(timeout=T) <= regs - 1
    # Every holder is refused: the owner is asked again, and says it was dropped.
    copy = RDMABuffer._rebuild(*buf.__reduce__()[1])
    with pytest.raises(RuntimeError, match="was dropped"):
        copy.read_into(memoryview(bytearray(4096))).get(timeout=T)
    with pytest.raises(ActorError, match="was dropped"):
        peer.read.call_one(buf).get(timeout=T)
    peer.set_lease.call_one(*_data.lease_config()).get(timeout=T)


@pytest.mark.parametrize("n", [4096, (1 << 20) + 5])  # CMA; shared pages with edges
def test_reads_copied_at_once_race_a_drop_and_never_see_released_memory(owner, n):
    # DA-43, DA-42: threads read copies of a buffer under their lease, each read copied by its
    # caller at once, while the buffer is dropped. The drop revokes the lease and is answered
    # only once no read holds the buffer: every read that succeeds has the buffer's bytes
    # (never pages given back or reused), and none that starts after the drop succeeds.
    import threading
    buf = owner.make.call_one("race", n).get(timeout=T)
    want = b"\x04" * n
    assert _read(buf) == want  # the lease
    stop = threading.Event()
    started_ok: list = []
    bad: list = []
    errors: list = []

    def reader() -> None:
        mine = RDMABuffer._rebuild(*buf.__reduce__()[1])  # a holder of its own: not dropped
        dst = bytearray(n)
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                mine.read_into(memoryview(dst)).get(timeout=T)
            except RuntimeError as e:
                errors.append(str(e))
                continue
            if dst != want:
                bad.append(bytes(dst[:16]))
            started_ok.append(t0)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + T
    while len(started_ok) < 200:
        assert time.monotonic() < deadline, "the readers made no progress"
        time.sleep(0.001)
    buf.drop().get(timeout=T)
    dropped_at = time.monotonic()
    while not errors:
        assert time.monotonic() < deadline, "no read failed after the drop"
        time.sleep(0.001)
    stop.set()
    for t in threads:
        t.join(timeout=T)
    assert not bad, f"{len(bad)} reads saw other bytes, e.g. {bad[0]!r}"
    assert all(t0 < dropped_at for t0 in started_ok), "a read that started after the drop succeeded"
    assert all("dropped" in e for e in errors), errors[:3]


class BigOwner(Actor):
    @endpoint
    def make(self, n: int) -> RDMABuffer:
        self.mem = bytearray(os.urandom(1 << 20)) * (n >> 20)
        return RDMABuffer(memoryview(self.mem))

    @endpoint
    def digest(self) -> str:
        return hashlib.sha256(self.mem).hexdigest()

    @endpoint
    def checks(self) -> int:
        return _data.lease_stats()["checks_answered"]


def test_a_drop_waits_for_a_checked_transfer_in_flight(spawn, new_procs):  # DA-42
    # A transfer too large for a lease is checked, then copied: its reader is a lessee until
    # it is done, so a drop that arrives meanwhile is answered only after it, and the bytes
    # read are the buffer's, not what its memory holds after the drop.
    o = spawn(BigOwner, on=new_procs(gpus=1))
    n = 256 << 20
    buf = o.make.call_one(n).get(timeout=T)
    want = o.digest.call_one().get(timeout=T)
    assert n > _data.lease_config()[1]
    dst = bytearray(n)
    # The check is answered in well under a millisecond, the copy takes tens: a read is
    # caught in flight at once in practice; a run that never catches one fails, not skips.
    for attempt in range(50):  # (a loaded machine slows the looks more than the copy)
        before = o.checks.call_one().get(timeout=T)
        fut = buf.read_into(memoryview(dst), timeout=T)
        while o.checks.call_one().get(timeout=T) == before and not fut.done():
            pass  # each look is a call to the owner: the check is answered on its loop
        if not fut.done():
            break
        fut.get(timeout=T)  # the copy beat the look: once more
    else:
        raise AssertionError("fifty 256 MiB reads were each done before a drop could be sent")
    buf.drop().get(timeout=T)
    assert fut.done()  # the drop was answered after the read completed
    fut.get(timeout=0)
    assert hashlib.sha256(dst).hexdigest() == want


def Peer_stats(spawn, peer) -> int:
    """Revocations the peer's process answered."""
    return peer.stats.call_one().get(timeout=T)["revocations_answered"]


def test_a_drop_whose_lessee_ended_waits_out_its_lease(spawn, new_procs, leases):
    # DA-42, DA-27: a lessee that cannot confirm leaves the drop to the lease's end.
    pm = new_procs(gpus=1)
    o = spawn(Owner, on=pm)
    o.set_lease.call_one(LONG_MS, 4 << 20).get(timeout=T)
    doomed = new_procs(gpus=1)
    peer = spawn(Peer, on=doomed)
    peer.set_lease.call_one(LONG_MS, 4 << 20).get(timeout=T)
    buf = o.make.call_one("gone", 4096).get(timeout=T)
    assert peer.read.call_one(buf).get(timeout=T) == b"\x04" * 4096
    pid = peer.pid.call_one().get(timeout=T)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + T
    while not _ended(pid):
        assert time.monotonic() < deadline, f"pid {pid} did not end"
        time.sleep(0.005)
    before = o.stats.call_one().get(timeout=T)
    regs = o.registrations.call_one().get(timeout=T)
    buf.drop().get(timeout=T)  # bounded: the lease ends LONG_MS after it was granted
    after = o.stats.call_one().get(timeout=T)
    assert after["delayed_releases"] == before["delayed_releases"] + 1
    assert after["released_on_revocation"] == before["released_on_revocation"]  # not confirmed: waited out
    # The ask to the ended lessee failed (it does not wait forever).
    deadline = time.monotonic() + T
    while (o.stats.call_one().get(timeout=T)["revocations_unconfirmed"]
           == before["revocations_unconfirmed"]):
        assert time.monotonic() < deadline, "the revocation's ask never ended"
        time.sleep(0.02)
    assert o.registrations.call_one().get(timeout=T) == regs - 1


def test_an_owner_that_stops_revokes_its_leases_before_releasing(spawn, new_procs, leases):
    # DA-27, DA-42, RD-3
    pm = new_procs(gpus=1)
    o = spawn(Owner, on=pm)
    probe = spawn(Owner, on=pm)
    o.set_lease.call_one(LONG_MS, 4 << 20).get(timeout=T)
    leases(LONG_MS)
    buf = o.make.call_one("st", 4096).get(timeout=T)
    _read(buf)
    base = probe.registrations.call_one().get(timeout=T)
    before = probe.stats.call_one().get(timeout=T)
    answered = _data.lease_stats()["revocations_answered"]
    o.stop().get(timeout=T)
    assert probe.stats.call_one().get(timeout=T)["delayed_releases"] == \
        before["delayed_releases"] + 1
    # The stop asks this process, the one lessee, to revoke its lease; once it confirmed, the
    # registration goes, long before the LONG_MS lease would have ended.
    deadline = time.monotonic() + T
    while probe.stats.call_one().get(timeout=T)["released_on_revocation"] == \
            before["released_on_revocation"]:
        assert time.monotonic() < deadline, "the lessee's revocation was not confirmed"
        time.sleep(0.01)
    assert _data.lease_stats()["revocations_answered"] == answered + 1
    assert _data.lease_left(buf._owner.proc, buf._id, False) == 0
    with pytest.raises(RuntimeError, match="stopped"):
        # No lease left: the owner is asked, and says why.
        _read(buf)
    # The release follows the lease's end on the owner's loop.
    deadline = time.monotonic() + T
    while probe.registrations.call_one().get(timeout=T) > base - 1:
        assert time.monotonic() < deadline, "the registration was not released"
        time.sleep(0.02)


def test_an_owner_killed_under_a_lease_fails_the_next_transfer(spawn, new_procs, leases):
    # DA-28, RD-2
    pm = new_procs(gpus=1)
    o = spawn(Owner, on=pm)
    o.set_lease.call_one(20000, 4 << 20).get(timeout=T)
    leases(20000)
    buf = o.make.call_one("k", 4096).get(timeout=T)
    _read(buf)
    assert _data.lease_left(buf._owner.proc, buf._id, False) > 0
    pid = o.pid.call_one().get(timeout=T)
    os.kill(pid, signal.SIGKILL)
    # SIGKILL ends a process asynchronously: a leased read racing its end may still copy the
    # buffer as it was (as a read just before the kill would). Once it has ended, none may.
    deadline = time.monotonic() + T
    while not _ended(pid):
        assert time.monotonic() < deadline, f"pid {pid} did not end"
        time.sleep(0.005)
    with pytest.raises(SupervisionError) as info:
        buf.read_into(memoryview(bytearray(4096))).get(timeout=T)
    e = info.value
    text = str(e)
    assert buf.owner in text and socket.gethostname() in text and str(pid) in text
    assert "rank 0" in text
    assert e.pid == pid and e.host == socket.gethostname() and e.rank == 0
    assert _data.lease_left(buf._owner.proc, buf._id, False) == 0  # forgotten


def test_a_lease_running_out_mid_transfer_is_not_the_callers_timeout(tmp_path):  # DA-28, DA-5
    """A leased read whose owner stopped (SIGSTOP; UCX's shared memory, so the owner's own
    progress is needed) is cut at the end of its lease, then asked again with a check, which
    waits until the caller's own timeout: the error names that timeout, not the lease's."""
    r = run_script(tmp_path, "lease_clamp.py", textwrap.dedent("""
        import os, signal, time
        os.environ["PODIUM_RDMA_CMA"] = "0"
        os.environ["PODIUM_RDMA_LEASE_MS"] = "2000"
        from podium.actor import Actor, endpoint, this_host
        from podium.rdma import RDMABuffer
        from podium._core import data

        class Owner(Actor):
            @endpoint
            def make(self):
                self.mem = bytearray(4096)
                return RDMABuffer(memoryview(self.mem)), os.getpid()

        def stopped(pid):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                        return False
            return True

        pm = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            owner = pm.spawn("owner", Owner)
            buf, pid = owner.make.call_one().get(timeout=30)
            dst = memoryview(bytearray(4096))
            buf.read_into(dst).get(timeout=30)  # checked: a lease of 2 s
            before = data.lease_stats()
            os.kill(pid, signal.SIGSTOP)
            try:
                deadline = time.monotonic() + 30
                while not stopped(pid) and time.monotonic() < deadline:
                    time.sleep(0.005)
                try:
                    buf.read_into(dst, timeout=4).get(timeout=30)
                    print("no error")
                except TimeoutError as e:
                    print("TimeoutError", e)
            finally:
                os.kill(pid, signal.SIGCONT)
            after = data.lease_stats()
            print("leased", after["leased"] - before["leased"],
                  "checked", after["checked"] - before["checked"])
            buf.read_into(dst).get(timeout=30)
            print("read again")
        finally:
            pm.stop().get(timeout=30)
        """))
    out = r.stdout + r.stderr
    assert "did not finish within 4000 ms" in r.stdout, out
    assert "leased 1 checked 1" in r.stdout, out  # the lease ran out; then a check
    assert "read again" in r.stdout, out
