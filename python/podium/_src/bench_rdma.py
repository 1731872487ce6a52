"""`podium bench rdma [--quick] [--max-mib 1024] [--bulk-mib 1024] [--tensor-max-mib 256]
[--reps 3] [--cycles 10000] [--cuda] [--json]`: podium.rdma between two procs of one host, each figure
next to its floor measured in the same run (docs/data.md, "Figures").

An actor on a spawned proc (the owner) and the controller:

- bandwidth: the owner makes one buffer per size (4 KiB, then x4 up to ``--max-mib``); the
  controller reads it into its own memory (``read_into``) and writes it back (``write_from``),
  next to a memcpy of the same size in this process (a memoryview slice assignment) and the
  ratio; each the time per call of the best of ``--reps`` timed runs, a run being as many
  calls as take 5 ms, or one call where that is longer (``bench_measure.best_per_call``);
- making a buffer: per size, the best of ``--reps`` ``RDMABuffer(...)`` calls in the owner
  over memory already written, each dropped and its pages given back before the next (a
  buffer of shared pages moves its pages when it is made: DA-29), next to a memcpy of the
  same bytes there; and the time for the owner to make a buffer and this controller to read
  it once, a user's buffer (shared pages) next to one made for one read (private pages, as
  ``to_mesh`` makes them: DA-38);
- latency: a 4 KiB read next to an empty ``call_one`` to the same actor (medians);
- control under bulk (issue 19 item 6): the ``call_one`` round trip while another thread of
  the controller reads, then writes, a ``--bulk-mib`` buffer of the same owner over and over,
  next to the idle round trip measured just before, and their ratio;
- one CPU: the idle round trip of a controller started on one CPU to a proc of its own (which
  inherits that CPU), next to this controller's idle one just before: what the round trip
  can get from the CPU that a copy in flight leaves it on a machine with two (item 6's floor
  there);
- tensors: a 1-D uint8 torch tensor of 1 MiB, then x4 up to ``--tensor-max-mib``, as the
  argument of a plain endpoint call (out-of-band frame parts, docs/python.md), next to the
  same bytes written into a tensor of the owner through ``RDMABuffer.write_from`` (timed as
  the bandwidth; skipped, with the reason, where torch is not installed);
- another link under a tensor argument: the ``call_one`` round trip to an actor on a second
  proc while another thread calls the owner with the largest tensor over and over, next to
  the idle round trip measured just before (where torch is installed);
- lifetime: ``--cycles`` create/drop cycles in the owner, its registration count before and
  after.

``--quick`` (the test's): sizes up to 1 MiB, a 16 MiB bulk, 1 MiB tensors, 2 reps, 200
cycles, fewer samples: seconds. Progress goes to stderr; ``--json`` prints one JSON object on
one line. A benchmark, not a test: it asserts nothing about the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import podium.actor as pa
from podium._core import data as _data
from podium._src import bench_rdma_cuda
from podium._src.bench_measure import (best_per_call as _per_call, gbps as _gbps, sizes as _sizes,
                                       timed as _time)
from podium.rdma import RDMABuffer, get_rdma_backend

_TIMEOUT_S = 300.0
_MIB = 1 << 20


def _torch() -> Optional[Any]:
    try:
        import torch
    except ImportError:
        return None
    return torch


class _Owner(pa.Actor):
    def __init__(self) -> None:
        self.mem: Dict[int, Any] = {}

    @pa.endpoint
    def make(self, n: int) -> RDMABuffer:
        self.mem[n] = bytearray(n)
        return RDMABuffer(memoryview(self.mem[n]))

    @pa.endpoint
    def make_tensor(self, n: int) -> RDMABuffer:
        torch = _torch()
        assert torch is not None
        self.mem[n] = torch.zeros(n, dtype=torch.uint8)
        return RDMABuffer(self.mem[n])

    @pa.endpoint
    def fill(self, n: int) -> None:
        self.mem[n] = bytearray(b"\x02") * n

    @pa.endpoint
    def make_for_one_read(self, n: int, share: bool) -> RDMABuffer:
        """A buffer over the ``n`` bytes ``fill`` wrote: a user's (its pages moved into shared
        pages, DA-29) or one made for one read, as the tensor engine's ``to_mesh`` makes them
        (pages left private, DA-38)."""
        view = memoryview(self.mem[n])
        return RDMABuffer(view) if share else RDMABuffer._for_one_read(view)

    @pa.endpoint
    def free(self, n: int) -> None:
        self.mem.pop(n, None)
        # The dropped buffer's pages go back to private on a thread of their own (DA-32):
        # what is timed next does not share the CPU with that.
        _data.wait_given_back()

    @pa.endpoint
    def ping(self) -> None:
        return None

    @pa.endpoint
    def take(self, t: Any) -> int:
        return int(t.numel())

    @pa.endpoint
    def create_cost(self, n: int, reps: int) -> List[float]:
        """Seconds to make an ``RDMABuffer`` of ``n`` bytes of memory already written (as a
        program's tensor is), and to memcpy the same bytes here: the best of ``reps`` each.
        A buffer on shared pages (DA-29) moves its pages when it is made; each cycle drops
        the buffer and waits until its pages are given back (DA-32), so the next one moves
        them again."""
        mem = bytearray(b"\x01") * n
        other = bytearray(n)
        made = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            buf = RDMABuffer(memoryview(mem))
            made = min(made, time.perf_counter() - t0)
            buf.drop().get(timeout=_TIMEOUT_S)
            _data.wait_given_back()
        copy = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            other[:] = mem
            copy = min(copy, time.perf_counter() - t0)
        return [made, copy]

    @pa.endpoint
    def cycles(self, n: int) -> List[int]:
        mem = bytearray(4096)
        before = _data.registration_count()
        for _ in range(n):
            RDMABuffer(memoryview(mem)).drop().get(timeout=_TIMEOUT_S)
        return [before, _data.registration_count()]


def _us(samples: List[float]) -> float:
    return statistics.median(samples) * 1e6


def _p90_us(samples: List[float]) -> float:
    return sorted(samples)[len(samples) * 9 // 10] * 1e6


def _say(text: str) -> None:
    print(f"rdma {text}", file=sys.stderr, flush=True)


def _bandwidth(owner: Any, sizes: List[int], reps: int) -> List[Dict[str, Any]]:
    rows = []
    for n in sizes:
        buf = owner.make.call_one(n).get(timeout=_TIMEOUT_S)
        local = memoryview(bytearray(n))
        other = memoryview(bytearray(n))
        buf.read_into(local).get(timeout=_TIMEOUT_S)  # warm: pages on both sides
        r = _per_call(lambda: buf.read_into(local).get(timeout=_TIMEOUT_S), reps)
        w = _per_call(lambda: buf.write_from(local).get(timeout=_TIMEOUT_S), reps)

        def copy() -> None:
            other[:] = local

        copy()
        m = _per_call(copy, reps)
        buf.drop().get(timeout=_TIMEOUT_S)
        owner.free.call_one(n).get(timeout=_TIMEOUT_S)
        del local, other
        made, owner_copy = owner.create_cost.call_one(n, reps).get(timeout=_TIMEOUT_S)
        once = {share: _one_read(owner, n, share, reps) for share in (True, False)}
        rows.append({"bytes": n, "read_gbps": _gbps(n, r), "write_gbps": _gbps(n, w),
                     "memcpy_gbps": _gbps(n, m), "read_vs_memcpy": m / r,
                     "write_vs_memcpy": m / w, "create_us": made * 1e6,
                     "owner_memcpy_us": owner_copy * 1e6,
                     "one_read_shared_us": once[True] * 1e6,
                     "one_read_private_us": once[False] * 1e6})
        _say(f"{n:>11} B: read {_gbps(n, r):7.2f} GB/s, write {_gbps(n, w):7.2f} GB/s, "
             f"memcpy {_gbps(n, m):7.2f} GB/s; made in {made * 1e6:.0f} us "
             f"(memcpy {owner_copy * 1e6:.0f} us); made and read once "
             f"{once[True] * 1e6:.0f} us shared, {once[False] * 1e6:.0f} us private")
    return rows


def _one_read(owner: Any, n: int, share: bool, reps: int) -> float:
    """Seconds for the owner to make a buffer over ``n`` bytes it wrote before (untimed) and
    this controller to read it once (the call that makes it, and the read, checked), the
    best of ``reps``; dropped and
    its pages given back, untimed, after each. The read asks for no lease (one read has no
    use for it), so the drop need not wait for one to end (DA-27)."""
    local = memoryview(bytearray(n))
    best = float("inf")
    lease = _data.lease_config()
    _data.set_lease(0, lease[1])
    try:
        for _ in range(reps):
            owner.fill.call_one(n).get(timeout=_TIMEOUT_S)
            t0 = time.perf_counter()
            buf = owner.make_for_one_read.call_one(n, share).get(timeout=_TIMEOUT_S)
            buf.read_into(local).get(timeout=_TIMEOUT_S)
            best = min(best, time.perf_counter() - t0)
            buf.drop().get(timeout=_TIMEOUT_S)
            owner.free.call_one(n).get(timeout=_TIMEOUT_S)
    finally:
        _data.set_lease(*lease)
    return best


_WARM_S = 0.2  # round trips made, and not counted, before the timed ones


def _rtts(owner: Any, samples: int) -> List[float]:
    """``samples`` call_one round trips to ``owner``, after _WARM_S of untimed ones: a CPU that
    was idle wakes slowly at first (a VM's haltpoll cpuidle governor shrinks its polling
    window while idle and grows it back over tens of ms), and a round trip under bulk, which
    keeps the CPUs busy, would otherwise be compared with cold ones."""
    warm_until = time.monotonic() + _WARM_S
    while time.monotonic() < warm_until:
        owner.ping.call_one().get(timeout=_TIMEOUT_S)
    return [_time(lambda: owner.ping.call_one().get(timeout=_TIMEOUT_S))
            for _ in range(samples)]


_ONE_CPU_CHILD = """
import json, sys
import podium.actor as pa
from podium._src import bench_rdma as b
pm = pa.this_host().spawn_procs(per_host={"procs": 1})
try:
    owner = pm.spawn("rdma_bench_one_cpu", b._Owner).slice(procs=0)
    print(json.dumps([t * 1e6 for t in b._rtts(owner, int(sys.argv[1]))]))
finally:
    pm.stop().get(timeout=b._TIMEOUT_S)
"""


def _rtt_one_cpu(owner: Any, samples: int) -> Optional[Dict[str, Any]]:
    """The floor of item 6 on a machine with two CPUs: while a copy takes one of them, the
    round trip's threads (the controller's and the owner's) share the other. Measured as the
    same idle round trip in a controller of its own started on one CPU (its procs inherit
    it, and the runtime sizes its polling from the start), next to this one's idle round trip
    measured just before. None where this process may run on one CPU only."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    idle = _rtts(owner, samples)
    r = subprocess.run([sys.executable, "-c", _ONE_CPU_CHILD, str(samples)],
                       capture_output=True, text=True, timeout=_TIMEOUT_S,
                       stdin=subprocess.DEVNULL,
                       preexec_fn=lambda: os.sched_setaffinity(0, [cpus[0]]))
    if r.returncode != 0:
        raise RuntimeError(f"the one-CPU controller failed ({r.returncode}): {r.stderr[-2000:]}")
    pinned = [t / 1e6 for t in json.loads(r.stdout.strip().splitlines()[-1])]
    ratio = _us(pinned) / _us(idle)
    _say(f"call_one RTT idle {_us(idle):.1f} us here, {_us(pinned):.1f} us in a controller "
         f"and proc on one CPU: x{ratio:.2f}")
    return {"cpus": len(cpus), "idle_rtt_median_us": _us(idle), "rtt_median_us": _us(pinned),
            "rtt_p90_us": _p90_us(pinned), "ratio": ratio}


def _rtt_under_bulk(owner: Any, n: int, write: bool, samples: int) -> Dict[str, Any]:
    """Item 6: the call_one round trip to the owner while another thread reads (or writes)
    an n-byte buffer of the same owner over and over, next to the idle round trip measured
    just before. Only round trips that start and end while one transfer is in flight count;
    sampling goes on until `samples` of them are in and two transfers have finished, so the
    samples span whole transfers."""
    buf = owner.make.call_one(n).get(timeout=_TIMEOUT_S)
    local = memoryview(bytearray(n))
    buf.read_into(local).get(timeout=_TIMEOUT_S)  # warm: pages on both sides
    idle = _rtts(owner, samples)
    stop = threading.Event()
    transfers = [0]
    busy = threading.Event()  # set while a transfer is in flight

    def bulk() -> None:
        while not stop.is_set():
            busy.set()
            if write:
                buf.write_from(local).get(timeout=_TIMEOUT_S)
            else:
                buf.read_into(local).get(timeout=_TIMEOUT_S)
            busy.clear()
            transfers[0] += 1

    t = threading.Thread(target=bulk, name="rdma-bench-bulk", daemon=True)
    under: List[float] = []
    t.start()
    try:
        busy.wait(timeout=_TIMEOUT_S)
        deadline = time.monotonic() + 60.0
        while ((len(under) < samples or transfers[0] < 2) and t.is_alive()
               and time.monotonic() < deadline):
            start = transfers[0]
            if not busy.is_set():
                continue
            rtt = _time(lambda: owner.ping.call_one().get(timeout=_TIMEOUT_S))
            if busy.is_set() and transfers[0] == start:  # one transfer ran throughout
                under.append(rtt)
    finally:
        stop.set()
        t.join(timeout=_TIMEOUT_S)
    buf.drop().get(timeout=_TIMEOUT_S)
    owner.free.call_one(n).get(timeout=_TIMEOUT_S)
    ratio = _us(under) / _us(idle) if under else float("nan")
    kind = "write" if write else "read"
    _say(f"call_one RTT idle {_us(idle):.1f} us, {_us(under) if under else float('nan'):.1f} "
         f"us while {n} B {kind}s run ({transfers[0]} of them): x{ratio:.2f}")
    return {"kind": kind, "bulk_bytes": n, "idle_rtt_median_us": _us(idle),
            "idle_rtt_p90_us": _p90_us(idle),
            "rtt_median_us": _us(under) if under else None,
            "rtt_p90_us": _p90_us(under) if under else None,
            "samples": len(under),
            "transfers_during": transfers[0], "ratio": ratio}


def _rtt_other_link_under_tensor_arg(owner: Any, pinger: Any, n: int,
                                     samples: int) -> Dict[str, Any]:
    """The call_one round trip to another proc (another link) while another thread calls
    the owner with an n-byte tensor argument over and over, next to the idle round trip
    measured just before: a large part on one link must not hold up the others (its bytes
    are pulled off the io threads, docs/channel.md "Lent parts"). Only round trips that start
    and end inside one call count."""
    torch = _torch()
    assert torch is not None
    src = torch.ones(n, dtype=torch.uint8)
    owner.take.call_one(src).get(timeout=_TIMEOUT_S)  # warm
    idle = _rtts(pinger, samples)
    stop = threading.Event()
    calls = [0]
    busy = threading.Event()

    def bulk() -> None:
        while not stop.is_set():
            busy.set()
            owner.take.call_one(src).get(timeout=_TIMEOUT_S)
            busy.clear()
            calls[0] += 1

    t = threading.Thread(target=bulk, name="rdma-bench-tensor", daemon=True)
    under: List[float] = []
    t.start()
    try:
        busy.wait(timeout=_TIMEOUT_S)
        deadline = time.monotonic() + 60.0
        while ((len(under) < samples or calls[0] < 2) and t.is_alive()
               and time.monotonic() < deadline):
            start = calls[0]
            if not busy.is_set():
                continue
            rtt = _time(lambda: pinger.ping.call_one().get(timeout=_TIMEOUT_S))
            if busy.is_set() and calls[0] == start:
                under.append(rtt)
    finally:
        stop.set()
        t.join(timeout=_TIMEOUT_S)
    ratio = _us(under) / _us(idle) if under else float("nan")
    _say(f"call_one RTT to another proc idle {_us(idle):.1f} us, "
         f"{_us(under) if under else float('nan'):.1f} us while {n} B tensor arguments go to "
         f"the owner ({calls[0]} of them): x{ratio:.2f}")
    return {"tensor_bytes": n, "idle_rtt_median_us": _us(idle), "idle_rtt_p90_us": _p90_us(idle),
            "rtt_median_us": _us(under) if under else None,
            "rtt_p90_us": _p90_us(under) if under else None, "samples": len(under),
            "calls_during": calls[0], "ratio": ratio}


def _tensor_args(owner: Any, sizes: List[int], reps: int) -> List[Dict[str, Any]]:
    torch = _torch()
    assert torch is not None
    rows = []
    for n in sizes:
        src = torch.ones(n, dtype=torch.uint8)
        buf = owner.make_tensor.call_one(n).get(timeout=_TIMEOUT_S)
        buf.write_from(src).get(timeout=_TIMEOUT_S)  # warm
        owner.take.call_one(src).get(timeout=_TIMEOUT_S)
        call = _per_call(lambda: owner.take.call_one(src).get(timeout=_TIMEOUT_S), reps)
        rdma = _per_call(lambda: buf.write_from(src).get(timeout=_TIMEOUT_S), reps)
        rows.append({"bytes": n, "endpoint_arg_ms": call * 1e3, "rdma_write_ms": rdma * 1e3,
                     "endpoint_vs_rdma": call / rdma})
        _say(f"tensor {n:>11} B: endpoint arg {call * 1e3:8.2f} ms, RDMABuffer "
             f"{rdma * 1e3:8.2f} ms (x{call / rdma:.2f})")
        buf.drop().get(timeout=_TIMEOUT_S)
        owner.free.call_one(n).get(timeout=_TIMEOUT_S)
        del src
    return rows


def _drops(owner: Any, n: int) -> Dict[str, Any]:
    """Milliseconds a drop of a 4 KiB buffer takes, from this controller: after a read here
    (which leased it: the drop revokes the lease, DA-42) and never read; `n` of each."""
    dst = memoryview(bytearray(4096))
    after_read, unread = [], []
    for _ in range(n):
        buf = owner.make.call_one(4096).get(timeout=_TIMEOUT_S)
        buf.read_into(dst).get(timeout=_TIMEOUT_S)
        after_read.append(_time(lambda: buf.drop().get(timeout=_TIMEOUT_S)))
        buf = owner.make.call_one(4096).get(timeout=_TIMEOUT_S)
        unread.append(_time(lambda: buf.drop().get(timeout=_TIMEOUT_S)))
    lease_ms, _max_bytes = _data.lease_config()
    out = {"after_read_median_ms": statistics.median(after_read) * 1e3,
           "after_read_max_ms": max(after_read) * 1e3,
           "unread_median_ms": statistics.median(unread) * 1e3,
           "lease_ms": lease_ms, "drops": n}
    _say(f"drop of a 4 KiB buffer: {out['after_read_median_ms']:.2f} ms after a read (max "
         f"{out['after_read_max_ms']:.2f}; the lease it would wait out: {lease_ms} ms), "
         f"{out['unread_median_ms']:.2f} ms never read")
    return out


def run(max_mib: int, reps: int, cycles: int, bulk_mib: int, tensor_max_mib: int,
        samples: int) -> Dict[str, Any]:
    pm = pa.this_host().spawn_procs(per_host={"procs": 1})
    try:
        pm.initialized.get(timeout=_TIMEOUT_S)
        owner = pm.spawn("rdma_bench_owner", _Owner).slice(procs=0)
        rows = _bandwidth(owner, _sizes(4096, max_mib * _MIB), reps)
        small = owner.make.call_one(4096).get(timeout=_TIMEOUT_S)
        dst = memoryview(bytearray(4096))
        lat = [_time(lambda: small.read_into(dst).get(timeout=_TIMEOUT_S))
               for _ in range(samples)]
        rtt = _rtts(owner, samples)
        small.drop().get(timeout=_TIMEOUT_S)
        drops = _drops(owner, 5)
        under = [_rtt_under_bulk(owner, bulk_mib * _MIB, write, samples)
                 for write in (False, True)]
        one_cpu = _rtt_one_cpu(owner, samples)
        torch = _torch()
        tensors = (_tensor_args(owner, _sizes(_MIB, tensor_max_mib * _MIB), reps)
                   if torch is not None else [])
        other_link = None
        if torch is not None:
            pm2 = pa.this_host().spawn_procs(per_host={"procs": 1})
            try:
                pinger = pm2.spawn("rdma_bench_pinger", _Owner).slice(procs=0)
                other_link = _rtt_other_link_under_tensor_arg(
                    owner, pinger, tensor_max_mib * _MIB, samples)
            finally:
                pm2.stop().get(timeout=_TIMEOUT_S)
        before, after = owner.cycles.call_one(cycles).get(timeout=_TIMEOUT_S * 10)
        big = [r for r in rows if r["bytes"] >= _MIB]
        return {
            "benchmark": "rdma",
            "backend": get_rdma_backend(),
            "same_host_path": "cma" if _data.cma_allowed() else "ucx",
            "ucx_version": _data.ucx_version(),
            "copiers": _data.stats()["copiers"],
            "sizes": rows,
            "read_4k_median_us": _us(lat),
            "call_one_rtt_median_us": _us(rtt),
            "rtt_under_bulk": under,
            "rtt_one_cpu": one_cpu,
            "tensor_args": tensors,
            "tensor_args_skipped": None if torch is not None else "torch is not installed",
            "rtt_other_link_under_tensor_arg": other_link,
            "drop_4k": drops,
            "create_drop_cycles": cycles,
            "registrations_before": before,
            "registrations_after": after,
            # The targets, each figure over its floor measured in this run.
            "targets": {
                "min_read_vs_memcpy_1mib_up": min((r["read_vs_memcpy"] for r in big),
                                                  default=None),
                "min_write_vs_memcpy_1mib_up": min((r["write_vs_memcpy"] for r in big),
                                                   default=None),
                "largest_tensor_endpoint_vs_rdma": (tensors[-1]["endpoint_vs_rdma"]
                                                    if tensors else None),
                "max_rtt_under_bulk_ratio": max(u["ratio"] for u in under),
                # Beside it, what the round trip gets from one CPU, with no copy at all.
                "rtt_one_cpu_ratio": one_cpu["ratio"] if one_cpu else None,
            },
        }
    finally:
        pm.stop().get(timeout=_TIMEOUT_S)


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="podium bench rdma", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="small sizes, few reps: seconds (what the test runs)")
    p.add_argument("--max-mib", type=int, default=None, help="largest size, MiB (default 1024)")
    p.add_argument("--bulk-mib", type=int, default=None,
                   help="the transfer in flight while call_one is timed, MiB (default 1024)")
    p.add_argument("--tensor-max-mib", type=int, default=None,
                   help="largest tensor argument, MiB (default 256)")
    p.add_argument("--reps", type=int, default=None, help="repetitions per size (best is kept)")
    p.add_argument("--cycles", type=int, default=None, help="create/drop cycles (default 10000)")
    p.add_argument("--cuda", action="store_true",
                   help="CUDA memory only: GPU to GPU and GPU to host, next to CUDA copies "
                        "(docs/data.md, \"GPU memory\")")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)

    def pick(value: Optional[int], quick: int, full: int) -> int:
        return value if value is not None else (quick if a.quick else full)

    if a.cuda:
        cuda = bench_rdma_cuda.run(max_mib=pick(a.max_mib, 1, 1024), reps=pick(a.reps, 2, 3))
        if a.json:
            print(json.dumps(cuda))
        else:
            bench_rdma_cuda.show(cuda)
        return 0
    result = run(max_mib=pick(a.max_mib, 1, 1024), reps=pick(a.reps, 2, 3),
                 cycles=pick(a.cycles, 200, 10000), bulk_mib=pick(a.bulk_mib, 16, 1024),
                 tensor_max_mib=pick(a.tensor_max_mib, 1, 256),
                 samples=50 if a.quick else 200)
    if a.json:
        print(json.dumps(result))
        return 0
    for row in result["sizes"]:
        print(f"{row['bytes']:>11} B  read {row['read_gbps']:7.2f} GB/s "
              f"({row['read_vs_memcpy']:.0%} of memcpy)  write {row['write_gbps']:7.2f} GB/s "
              f"({row['write_vs_memcpy']:.0%})  memcpy {row['memcpy_gbps']:7.2f} GB/s  "
              f"made in {row['create_us']:.0f} us (memcpy {row['owner_memcpy_us']:.0f} us), "
              f"made and read once {row['one_read_shared_us']:.0f} us shared, "
              f"{row['one_read_private_us']:.0f} us private")
    print(f"4 KiB read median {result['read_4k_median_us']:.1f} us; call_one RTT median "
          f"{result['call_one_rtt_median_us']:.1f} us")
    for u in result["rtt_under_bulk"]:
        print(f"call_one RTT median {u['idle_rtt_median_us']:.1f} us idle, "
              f"{u['rtt_median_us'] or float('nan'):.1f} us while {u['bulk_bytes']} B "
              f"{u['kind']}s run: x{u['ratio']:.2f}")
    c = result["rtt_one_cpu"]
    if c:
        print(f"call_one RTT median {c['idle_rtt_median_us']:.1f} us idle, "
              f"{c['rtt_median_us']:.1f} us with a controller and its proc on one of the "
              f"{c['cpus']} CPUs: x{c['ratio']:.2f} (item 6's floor where a copy takes a CPU)")
    for row in result["tensor_args"]:
        print(f"tensor {row['bytes']:>11} B  endpoint arg {row['endpoint_arg_ms']:8.2f} ms  "
              f"RDMABuffer {row['rdma_write_ms']:8.2f} ms  x{row['endpoint_vs_rdma']:.2f}")
    o = result["rtt_other_link_under_tensor_arg"]
    if o:
        print(f"call_one RTT to another proc median {o['idle_rtt_median_us']:.1f} us idle, "
              f"{o['rtt_median_us'] or float('nan'):.1f} us while {o['tensor_bytes']} B tensor "
              f"arguments go to the owner: x{o['ratio']:.2f}")
    if result["tensor_args_skipped"]:
        print(f"tensor arguments skipped: {result['tensor_args_skipped']}")
    d = result["drop_4k"]
    print(f"drop of a 4 KiB buffer: {d['after_read_median_ms']:.2f} ms after a read (max "
          f"{d['after_read_max_ms']:.2f}; a lease lasts {d['lease_ms']} ms), "
          f"{d['unread_median_ms']:.2f} ms never read")
    print(f"{result['create_drop_cycles']} create/drop cycles: registrations "
          f"{result['registrations_before']} -> {result['registrations_after']}")
    return 0
