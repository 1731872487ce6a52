"""The RL example (examples/rl/, installed as podium._src.rl_core; docs/rl.md): GRPO with a
generator service, a reward actor, a replay buffer actor and a data-parallel trainer mesh,
weights synced over the data plane, versioned (RL-1..RL-5), and `podium bench rl --json`."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402  (torch's dependency)

from conftest import eventually, WAIT_S  # noqa: E402
from podium._src import rl_core  # noqa: E402
from podium.actor import Actor, endpoint  # noqa: E402
from podium.rdma import RDMABuffer  # noqa: E402


def _mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


def _check_versions(run):
    """RL-2: every batch was sampled with exactly the weights the trainer published as its
    version (the checksum recomputed from the generator's model), and RL-4: every trainer rank
    held the same weights after every step, the ones published."""
    assert run.samples
    for version, crc, pid in run.samples:
        assert run.published[version] == crc, (version, pid)
    for step, crcs in enumerate(run.trainer_crcs, start=1):
        assert len(set(crcs)) == 1, (step, crcs)
        assert run.published[step] == crcs[0]


def test_grpo_reward_rises_with_bounded_staleness_and_whole_versions():  # RL-2, RL-3, RL-4
    cfg = dataclasses.replace(rl_core.Config(), steps=60, max_staleness=1, seed=0)
    run = rl_core.run(cfg)
    assert [r["step"] for r in run.steps] == list(range(1, 61))
    first, last = _mean(run.steps[:10], "reward"), _mean(run.steps[-10:], "reward")
    # From chance (0.1: one digit in ten per position) to most positions right.
    assert first < 0.3 and last > first + 0.4, (first, last)
    # RL-3: the step that made version t+1 trained on samples of version >= t - 1.
    for t, row in enumerate(run.steps):
        assert all(v >= t - cfg.max_staleness for v in row["versions"]), (t, row["versions"])
        assert row["staleness"] <= cfg.max_staleness
    _check_versions(run)
    # Generation overlapped training: some samples came from weights one step old.
    assert max(r["staleness"] for r in run.steps) == 1
    assert run.sync_times and all(r["tokens_per_s"] >= 0 for r in run.steps)


def test_a_killed_generator_replica_is_retried_and_replaced(tmp_path):  # RL-5, RL-3
    """max_staleness=0 (on-policy); replica 0's proc is SIGKILLed after step 3. The service
    takes it out of routing, retries a route() in flight on it, replaces it; the replacement
    syncs the current weights before it samples and the run finishes every step."""
    cfg = dataclasses.replace(rl_core.Config(), steps=16, max_staleness=0, seed=1)
    seen = {}

    def on_step(row, run):
        svc = run.service
        if row["step"] == 3:
            seen["pids"] = [r["procs"][0]["pid"] for r in svc.status()]
            os.kill(seen["pids"][0], signal.SIGKILL)
        if row["step"] == 8:  # bounded: the replica is back before the last steps
            eventually(lambda: all(r["state"] == "running" for r in svc.status())
                       and svc.status()[0]["restarts"] >= 1, WAIT_S, "replica 0 replaced")
            seen["status"] = svc.status()

    run = rl_core.run(cfg, on_step)
    assert len(run.steps) == 16
    assert seen["status"][0]["restarts"] == 1 and seen["status"][1]["restarts"] == 0
    new_pid = seen["status"][0]["procs"][0]["pid"]
    assert new_pid not in seen["pids"]
    assert any(pid == new_pid for _, _, pid in run.samples)  # the replacement served...
    _check_versions(run)  # ... with whole, published weights (it synced first)
    assert all(r["staleness"] == 0 for r in run.steps)  # RL-3 with max_staleness 0


# --- the weight slots themselves ----------------------------------------------------------------


class _Done:
    def __init__(self, value=None):
        self.value = value

    def get(self, timeout=None):
        return self.value


def _word_sum(raw: torch.Tensor) -> int:
    """What a summed read (RD-8) resolves to: the wrapping sum of the little-endian uint64 words
    of the bytes read (a NumPy reference, independent of rl_core)."""
    b = raw.numpy().tobytes()
    b += bytes(-len(b) % 8)
    with np.errstate(over="ignore"):
        return int(np.frombuffer(b, dtype="<u8").sum(dtype=np.uint64))


class _FakeSlot:
    """An RDMABuffer stand-in of ``size`` bytes: read_into copies ``source()`` into dst and,
    as a summed read, resolves to the word sum of what it copied."""

    def __init__(self, source, size):
        self.source = source
        self.nbytes = size
        self.reads = 0

    def size(self):
        return self.nbytes

    def read_into(self, dst, timeout=60, checksum=False):
        self.reads += 1
        dst.copy_(self.source())
        return _Done(_word_sum(dst) if checksum else None)


def test_slots_alternate_and_torn_reads_are_refused():  # RL-1, RL-2
    n = 1001  # odd: the payload is padded to whole words
    slots = rl_core.WeightSlots(n)
    slots.publish(0, torch.zeros(n))
    before = slots.slots[1].clone()
    slots.publish(2, torch.full((n,), 2.0))
    assert torch.equal(slots.slots[1], before)  # RL-1: version 2 went to slot 0 only
    slots.publish(3, torch.full((n,), 3.0))
    assert rl_core.parse_slot(slots.slots[0])[:2] == (2, True)
    assert rl_core.parse_slot(slots.slots[1])[:2] == (3, True)

    # A torn slot: version 3's header and first half, version 5's second half.
    v5 = rl_core.WeightSlots(n)
    v5.publish(5, torch.full((n,), 5.0))
    torn = slots.slots[1].clone()
    half = torn.numel() // 2
    torn[half:] = v5.slots[1][half:]
    assert rl_core.parse_slot(torn)[1] is False
    # From a summed read's total (RL-2 as a generator checks it): the same verdicts.
    for raw in (slots.slots[0], slots.slots[1], v5.slots[1], torn):
        assert rl_core.parse_slot(raw, _word_sum(raw)) == rl_core.parse_slot(raw)
    assert rl_core.parse_slot(torn, _word_sum(torn))[1] is False
    assert rl_core.parse_slot(slots.slots[1], _word_sum(slots.slots[1]) + 1)[1] is False

    w = rl_core.VersionedWeights(n)
    reads = iter([torn, v5.slots[1]])  # slot 1 read torn, then read again whole
    size = rl_core.slot_bytes(n)
    fake = [_FakeSlot(lambda: slots.slots[0], size), _FakeSlot(lambda: next(reads), size)]
    w.update(3, fake)
    version, crc, flat = w.active()
    assert version == 5 and w.torn_reads == 1 and torch.all(flat == 5.0)
    assert fake[0].reads == 0 and fake[1].reads == 2
    assert crc == rl_core._crc_of(5, torch.full((n,), 5.0))
    # An older version is never taken for a newer one; the active weights stay whole.
    stale = rl_core.VersionedWeights(n)
    with pytest.raises(RuntimeError, match="no intact copy of weights version >= 4"):
        stale.update(4, [_FakeSlot(lambda: slots.slots[0], size),
                         _FakeSlot(lambda: slots.slots[1], size)], tries=3)
    assert stale.version == -1


class Publisher(Actor):
    """Publishes versions 1, 2, 3... as fast as it can on a thread: every weight of version v
    is float(v), so a mix of versions is visible in the values themselves."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.slots = rl_core.WeightSlots(n)
        self.slots.publish(0, torch.zeros(n))
        self.latest = 0
        self.stop = threading.Event()
        self.thread = None

    @endpoint
    def buffers(self):
        return [RDMABuffer(s) for s in self.slots.slots]

    @endpoint
    def start(self) -> None:
        def loop():
            v = 0
            while not self.stop.is_set():
                v += 1
                self.slots.publish(v, torch.full((self.n,), float(v)))
                self.latest = v
        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    @endpoint
    def halt(self) -> int:
        self.stop.set()
        self.thread.join(10)
        return self.latest


class Reader(Actor):
    @endpoint
    def read(self, bufs, n: int, reads: int) -> dict:
        w = rl_core.VersionedWeights(n)
        versions, mixed = [], 0
        for i in range(reads):
            # Bounded: the publisher would have to stall for seconds to run out of tries.
            w.update(w.version + 1 if w.version >= 0 else 0, bufs, tries=20_000)
            version, crc, flat = w.active()
            if not torch.all(flat == float(version)):
                mixed += 1
            versions.append(version)
        return {"versions": versions, "mixed": mixed, "torn": w.torn_reads}


def test_a_generator_never_sees_a_mix_of_versions(spawn, new_procs):  # RL-2
    """A publisher rewrites its two slots without pause while a reader on another proc syncs
    over the data plane again and again: every version the reader takes is whole."""
    n = 100_000
    pub = spawn(Publisher, n, on=new_procs(gpus=1))
    reader = spawn(Reader, on=new_procs(gpus=1))
    bufs = pub.buffers.call_one().get(WAIT_S)
    pub.start.call_one().get(WAIT_S)
    try:
        got = reader.read.call_one(bufs, n, 200).get(WAIT_S * 2)
    finally:
        pub.halt.call_one().get(WAIT_S)
    assert got["mixed"] == 0
    assert got["versions"] == sorted(got["versions"]) and len(set(got["versions"])) == 200


def test_bench_rl_json():
    r = subprocess.run([sys.executable, "-m", "podium", "bench", "rl", "--quick", "--json"],
                       env=os.environ.copy(), stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["steps"] == 12 and out["generator_replicas"] == 2 and out["trainer_procs"] == 2
    assert out["weight_bytes"] == rl_core.slot_bytes(out["parameters"])
    for key in ("steps_per_s", "tokens_per_s", "sync_ms_median", "sync_isolated_ms_median",
                "data_plane_read_ms_median", "sync_over_data_plane", "startup_s"):
        assert out[key] > 0, key
    assert out["data_plane_reads"] == 2 * 20 and out["target_sync_over_data_plane"] == 1.5
    assert out["max_staleness_seen"] <= out["max_staleness"] == 1
    assert 0 <= out["reward_first10"] <= 1 and 0 <= out["reward_last10"] <= 1


def test_the_example_runs_and_plots(tmp_path):
    """examples/rl/main.py as the README runs it (a few steps): progress lines and the PNG."""
    main = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "rl", "main.py")
    png = tmp_path / "rl.png"
    r = subprocess.run([sys.executable, main, "--steps", "4", "--plot", str(png)],
                       env=os.environ.copy(), stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [line for line in r.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 4 and "reward" in steps[0] and "tokens/s" in steps[0]
    assert "sync" in steps[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
