"""Large message parts between procs of one host are lent and pulled, not written to the
socket (CH-25, CH-26 in cpp/podium/channel/net.h; docs/channel.md, "Lent parts").

A part of at least PODIUM_CMA_PART_MIN bytes (512 KiB by default) in a call or a reply on a
Unix-socket link travels as its address; the receiver copies it from the sender's memory
with process_vm_readv into memory of its own, so arrays and tensors arrive as they do
inline: intact, and writable where the call alone holds them (BU-1).

A part of at least PODIUM_SHARED_PART_MIN bytes (1 MiB by default) of a message for one
receiver is instead copied by the sender into a shared block that the receiver maps (CH-29):
the receiver holds the block alone until it lets the part go, and a message for several
receivers (a call to a mesh of several actors) lends its parts as before."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from podium._core import mesh as _mesh
from podium.actor import Actor, endpoint

T = 60
pytestmark = pytest.mark.timeout(180)
MIB = 1 << 20


class Sink(Actor):
    @endpoint
    def numpy_info(self, a: np.ndarray) -> tuple:
        a[0] = 7  # writable: the pulled part's own bytes
        return bool(a.flags.writeable), bool(a.flags.owndata), int(a[1:].sum()), int(a[0])

    @endpoint
    def torch_info(self, t) -> tuple:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a read-only buffer under a tensor warns
            t.add_(1)
        return int(t.numel()), int(t.sum())

    @endpoint
    def give_numpy(self, n: int) -> np.ndarray:
        return np.arange(n, dtype=np.int64)

    @endpoint
    def give_tensor(self, n: int):
        import torch
        return torch.arange(n, dtype=torch.int64)

    @endpoint
    def stats(self) -> dict:
        return dict(_mesh.channel_stats())

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def take(self, a) -> int:
        return len(a)

    @endpoint
    def keep(self, a: np.ndarray) -> int:
        if not hasattr(self, "kept"):
            self.kept = []
        self.kept.append(a)
        a[1] += 1  # the receiver's to write, and nobody else's
        return len(self.kept)

    @endpoint
    def sum_and_echo(self, a: np.ndarray) -> tuple:
        total = int(a.sum(dtype=np.int64))
        a += 1  # the receiver's own memory
        return total, a  # back through a shared block of this proc

    @endpoint
    def give_to(self, other, v: int) -> int:
        """Sends `other` an 8 MiB array of `v` (the part goes in a block of this proc)."""
        return other.keep.call_one(np.full(MIB, v, dtype=np.int64)).get(timeout=T)

    @endpoint
    def kept_values(self) -> list:
        return [(int(a[0]), int(a[1]), int(a[-1]), bool(np.all(a[2:] == a[0]))) for a in self.kept]


def _poll(pred, limit: float = 30.0) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_a_64_mib_numpy_argument_is_pulled_and_arrives_writable(spawn, new_procs):  # CH-25
    sink = spawn(Sink, on=new_procs(gpus=1))
    sink.take.call_one(np.zeros(16, dtype=np.uint8)).get(timeout=T)  # link and handshake
    before = sink.stats.call_one().get(timeout=T)["pulls"]
    a = np.arange(8 * MIB, dtype=np.int64)  # 64 MiB
    writeable, owndata, rest, first = sink.numpy_info.call_one(a).get(timeout=T)
    assert writeable and not owndata  # a view over the pulled part, not a copy
    assert rest == int(a[1:].sum()) and first == 7
    assert a[0] == 0  # the sender's array is untouched
    assert sink.stats.call_one().get(timeout=T)["pulls"] > before


def test_a_64_mib_numpy_result_arrives_intact(spawn, new_procs):  # CH-25
    sink = spawn(Sink, on=new_procs(gpus=1))
    before = _mesh.channel_stats()["pulls"]
    out = sink.give_numpy.call_one(8 * MIB).get(timeout=T)
    assert out.shape == (8 * MIB,) and int(out[-1]) == 8 * MIB - 1
    assert np.array_equal(out[:: 4099], np.arange(0, 8 * MIB, 4099))
    assert _mesh.channel_stats()["pulls"] > before  # the controller pulled the reply


def test_a_64_mib_tensor_argument_and_result_arrive_intact_and_writable(spawn, new_procs):  # CH-25
    torch = pytest.importorskip("torch", reason="torch is not installed")
    sink = spawn(Sink, on=new_procs(gpus=1))
    t = torch.ones(16 * MIB, dtype=torch.int32)  # 64 MiB
    n, total = sink.torch_info.call_one(t).get(timeout=T)
    assert n == 16 * MIB and total == 2 * 16 * MIB
    assert int(t.sum()) == 16 * MIB  # the sender's tensor is untouched
    out = sink.give_tensor.call_one(8 * MIB).get(timeout=T)
    assert out.numel() == 8 * MIB and int(out[-1]) == 8 * MIB - 1
    out.add_(1)  # writable
    assert int(out[0]) == 1


def test_many_large_calls_leave_no_lent_part_behind(spawn, new_procs):  # CH-26
    sink = spawn(Sink, on=new_procs(gpus=1))
    a = np.ones(2 * MIB, dtype=np.uint8)
    futures = [sink.take.call_one(a) for _ in range(50)]
    assert [f.get(timeout=T) for f in futures] == [2 * MIB] * 50
    assert _poll(lambda: _mesh.channel_stats()["lent_parts"] == 0)


def test_a_receiver_killed_mid_pull_leaves_the_sender_healthy(spawn, new_procs):  # CH-26
    # Calls to a mesh of two actors: their parts are lent and pulled, not put in shared
    # blocks (those go to one receiver only, CH-29, and are acked as soon as mapped).
    victims = spawn(Sink, on=new_procs(gpus=2))
    other = spawn(Sink, on=new_procs(gpus=1))
    pid = victims.slice(gpus=0).pid.call_one().get(timeout=T)
    a = np.ones(256 * MIB, dtype=np.uint8)
    futures = [victims.take.call(a) for _ in range(4)]
    # Lent and not acknowledged: the victims are pulling (or about to).
    assert _poll(lambda: _mesh.channel_stats()["lent_parts"] > 0)
    os.kill(pid, signal.SIGKILL)
    for f in futures:
        try:
            f.get(timeout=T)
        except Exception:
            pass  # the proc died: a failed call is what the runtime says (SupervisionError)
    # The sender lends nothing to the dead peer any more, and calls elsewhere still work,
    # large ones included.
    assert _poll(lambda: _mesh.channel_stats()["lent_parts"] == 0)
    assert other.take.call_one(a).get(timeout=T) == 256 * MIB
    assert _poll(lambda: _mesh.channel_stats()["lent_parts"] == 0)


def _counts(stats: dict) -> dict:
    return {k: stats[k] for k in ("shared_copied", "shared_mapped", "shared_map_failed")}


def test_a_large_argument_and_result_for_one_actor_go_in_shared_blocks(spawn, new_procs):  # CH-29
    torch = pytest.importorskip("torch", reason="torch is not installed")
    sink = spawn(Sink, on=new_procs(gpus=1))
    sink.take.call_one(np.zeros(16, dtype=np.uint8)).get(timeout=T)  # link and handshake
    mine, theirs = _mesh.channel_stats(), sink.stats.call_one().get(timeout=T)
    t = torch.ones(16 * MIB, dtype=torch.int32)  # 64 MiB
    for _ in range(3):
        n, total = sink.torch_info.call_one(t).get(timeout=T)
        assert n == 16 * MIB and total == 2 * 16 * MIB  # intact, and writable there
    assert int(t.sum()) == 16 * MIB  # the sender's tensor is untouched
    out = sink.give_tensor.call_one(8 * MIB).get(timeout=T)
    out.add_(1)  # writable here
    assert int(out[0]) == 1 and int(out[-1]) == 8 * MIB
    mine2, theirs2 = _mesh.channel_stats(), sink.stats.call_one().get(timeout=T)
    assert mine2["shared_copied"] - mine["shared_copied"] == 3
    assert theirs2["shared_mapped"] - theirs["shared_mapped"] == 3
    assert theirs2["shared_copied"] - theirs["shared_copied"] >= 1  # the result
    assert mine2["shared_mapped"] - mine["shared_mapped"] >= 1
    assert mine2["shared_map_failed"] == mine["shared_map_failed"]
    assert theirs2["shared_map_failed"] == theirs["shared_map_failed"]


def test_parts_a_receiver_keeps_are_not_overwritten_by_later_calls(spawn, new_procs):  # CH-29
    sink = spawn(Sink, on=new_procs(gpus=1))
    for v in range(6):
        a = np.full(MIB, v, dtype=np.int64)  # 8 MiB, one size: one block class
        assert sink.keep.call_one(a).get(timeout=T) == v + 1
        assert int(a[1]) == v  # the receiver's write stays there
    kept = sink.kept_values.call_one().get(timeout=T)
    assert kept == [(v, v + 1, v, True) for v in range(6)]


def test_a_call_to_several_actors_lends_its_arguments_instead_of_copying(spawn, new_procs):  # CH-29
    sinks = spawn(Sink, on=new_procs(gpus=2))
    small = np.zeros(16, dtype=np.uint8)
    sinks.take.call(small).get(timeout=T)  # links and handshakes
    before = _mesh.channel_stats()
    a = np.ones(4 * MIB, dtype=np.uint8)
    assert [v for _, v in sinks.take.call(a).get(timeout=T).items()] == [4 * MIB] * 2
    after = _mesh.channel_stats()
    assert after["shared_copied"] == before["shared_copied"]
    assert _poll(lambda: _mesh.channel_stats()["lent_parts"] == 0)


def test_concurrent_calls_of_many_sizes_both_ways_arrive_intact(spawn, new_procs):  # CH-29
    import threading
    sinks = spawn(Sink, on=new_procs(gpus=2))
    actors = [sinks.slice(gpus=i) for i in range(2)]
    errors = []

    def caller(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for k in range(10):
            a = rng.integers(0, 1000, size=int(rng.integers(1 << 17, 6 << 17)), dtype=np.int64)
            try:
                total, back = actors[k % 2].sum_and_echo.call_one(a).get(timeout=T)
            except Exception as e:  # reported below, with the others
                errors.append((seed, k, repr(e)))
                continue
            if total != int(a.sum()) or not np.array_equal(back, a + 1):
                errors.append((seed, k, a.nbytes))

    threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=2 * T)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert _mesh.channel_stats()["shared_map_failed"] == 0


def test_a_part_the_receiver_holds_outlives_its_sender(spawn, new_procs):  # CH-29
    sender = spawn(Sink, on=new_procs(gpus=1))
    keeper = spawn(Sink, on=new_procs(gpus=1))
    for v in range(3):
        assert sender.give_to.call_one(keeper, v).get(timeout=T) == v + 1
    # The keeper holds blocks of the sender's (the first part went inline: the link's first
    # frame streams behind its Hello).
    assert keeper.stats.call_one().get(timeout=T)["shared_mapped"] >= 2
    pid = sender.pid.call_one().get(timeout=T)
    os.kill(pid, signal.SIGKILL)

    def gone() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except (FileNotFoundError, ProcessLookupError):
            return True

    assert _poll(gone)
    assert keeper.kept_values.call_one().get(timeout=T) == [(v, v + 1, v, True) for v in range(3)]
