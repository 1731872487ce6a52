"""`podium bench rdma [--max-mib 256] [--reps 5] [--json]`: podium.rdma between two procs of
one host, with memcpy of the same sizes, measured in the same run, as the floor.

An actor on a spawned proc owns one buffer per size (4 KiB, then x4 up to ``--max-mib``); the
controller reads each into its own memory (``read_into``) and writes it back
(``write_from``), ``--reps`` times; the best time of each is reported as bandwidth, next to
the bandwidth of a memcpy of the same size in this process (a memoryview slice assignment)
and the ratio. It also reports the latency of a 4 KiB read next to the round trip of an empty
``call_one`` to the same actor, that round trip again while another thread reads the
largest buffer (at most 256 MiB) over and over, and ``--cycles`` create/drop cycles in the owner with its
registration count before and after. Progress goes to stderr; ``--json`` prints one JSON
object on one line. A benchmark, not a test: it asserts nothing about the figures (docs/data.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any, Dict, List, Tuple

import podium.actor as pa
from podium._core import data as _data
from podium.rdma import RDMABuffer, get_rdma_backend

_TIMEOUT_S = 120.0


class _Owner(pa.Actor):
    def __init__(self) -> None:
        self.mem: Dict[int, bytearray] = {}

    @pa.endpoint
    def make(self, n: int) -> RDMABuffer:
        self.mem[n] = bytearray(n)
        return RDMABuffer(memoryview(self.mem[n]))

    @pa.endpoint
    def ping(self) -> None:
        return None

    @pa.endpoint
    def cycles(self, n: int) -> List[int]:
        mem = bytearray(4096)
        before = _data.registration_count()
        for _ in range(n):
            RDMABuffer(memoryview(mem)).drop().get(timeout=_TIMEOUT_S)
        return [before, _data.registration_count()]


def _best(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _gbps(n: int, s: float) -> float:
    return n / s / 1e9 if s > 0 else float("inf")


def _rtt_under_bulk(owner: Any, n: int) -> Tuple[float, int, int]:
    """The median call_one round trip to the owner while another thread reads an n-byte
    buffer of the same owner again and again; and how many reads ran meanwhile."""
    buf = owner.make.call_one(n).get(timeout=_TIMEOUT_S)
    dst = memoryview(bytearray(n))
    stop = threading.Event()
    reads = [0]

    def bulk() -> None:
        while not stop.is_set():
            buf.read_into(dst).get(timeout=_TIMEOUT_S)
            reads[0] += 1

    t = threading.Thread(target=bulk, name="rdma-bench-bulk", daemon=True)
    t.start()
    try:
        while reads[0] == 0 and t.is_alive():  # bounded: each read has its own timeout
            time.sleep(0.001)
        rtts = sorted(_best(lambda: owner.ping.call_one().get(timeout=_TIMEOUT_S), 1)
                      for _ in range(200))
    finally:
        stop.set()
        t.join(timeout=_TIMEOUT_S)
    buf.drop().get(timeout=_TIMEOUT_S)
    return rtts[100], n, reads[0]


def run(max_mib: int, reps: int, cycles: int) -> Dict[str, Any]:
    pm = pa.this_host().spawn_procs(per_host={"procs": 1})
    try:
        pm.initialized.get(timeout=_TIMEOUT_S)
        owner = pm.spawn("rdma_bench_owner", _Owner).slice(procs=0)
        sizes = []
        n = 4096
        while n <= max_mib << 20:
            sizes.append(n)
            n *= 4
        rows = []
        for n in sizes:
            buf = owner.make.call_one(n).get(timeout=_TIMEOUT_S)
            local = memoryview(bytearray(n))
            other = memoryview(bytearray(n))
            buf.read_into(local).get(timeout=_TIMEOUT_S)  # warm: endpoint, pages
            r = _best(lambda: buf.read_into(local).get(timeout=_TIMEOUT_S), reps)
            w = _best(lambda: buf.write_from(local).get(timeout=_TIMEOUT_S), reps)

            def copy() -> None:
                other[:] = local

            copy()
            m = _best(copy, reps)
            rows.append({"bytes": n, "read_gbps": _gbps(n, r), "write_gbps": _gbps(n, w),
                         "memcpy_gbps": _gbps(n, m), "read_vs_memcpy": m / r,
                         "write_vs_memcpy": m / w})
            print(f"rdma {n:>11} B: read {_gbps(n, r):7.2f} GB/s, write {_gbps(n, w):7.2f} "
                  f"GB/s, memcpy {_gbps(n, m):7.2f} GB/s", file=sys.stderr)
            buf.drop().get(timeout=_TIMEOUT_S)
        small = owner.make.call_one(4096).get(timeout=_TIMEOUT_S)
        dst = memoryview(bytearray(4096))
        lat = sorted(_best(lambda: small.read_into(dst).get(timeout=_TIMEOUT_S), 1)
                     for _ in range(200))[100]
        rtt = sorted(_best(lambda: owner.ping.call_one().get(timeout=_TIMEOUT_S), 1)
                     for _ in range(200))[100]
        under = _rtt_under_bulk(owner, min(max(sizes), 256 << 20))
        before, after = owner.cycles.call_one(cycles).get(timeout=_TIMEOUT_S * 10)
        return {
            "benchmark": "rdma",
            "backend": get_rdma_backend(),
            "same_host_path": "cma" if _data.cma_allowed() else "ucx",
            "ucx_version": _data.ucx_version(),
            "sizes": rows,
            "read_4k_median_us": lat * 1e6,
            "call_one_rtt_median_us": rtt * 1e6,
            "call_one_rtt_under_bulk_median_us": under[0] * 1e6,
            "bulk_bytes": under[1],
            "bulk_reads_during": under[2],
            "create_drop_cycles": cycles,
            "registrations_before": before,
            "registrations_after": after,
        }
    finally:
        pm.stop().get(timeout=_TIMEOUT_S)


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="podium bench rdma", description=__doc__.split("\n\n")[0])
    p.add_argument("--max-mib", type=int, default=256, help="largest size, MiB (default 256)")
    p.add_argument("--reps", type=int, default=5, help="repetitions per size (best is kept)")
    p.add_argument("--cycles", type=int, default=10000, help="create/drop cycles (default 10000)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    result = run(a.max_mib, a.reps, a.cycles)
    if a.json:
        print(json.dumps(result))
    else:
        for row in result["sizes"]:
            print(f"{row['bytes']:>11} B  read {row['read_gbps']:7.2f} GB/s "
                  f"({row['read_vs_memcpy']:.0%} of memcpy)  write {row['write_gbps']:7.2f} GB/s "
                  f"({row['write_vs_memcpy']:.0%})  memcpy {row['memcpy_gbps']:7.2f} GB/s")
        print(f"4 KiB read median {result['read_4k_median_us']:.1f} us; call_one RTT median "
              f"{result['call_one_rtt_median_us']:.1f} us, "
              f"{result['call_one_rtt_under_bulk_median_us']:.1f} us while "
              f"{result['bulk_bytes']} B reads run ({result['bulk_reads_during']} of them)")
        print(f"{result['create_drop_cycles']} create/drop cycles: registrations "
              f"{result['registrations_before']} -> {result['registrations_after']}")
    return 0
