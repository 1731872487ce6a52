"""`podium bench soak [--cycles 1000] [--procs 1] [--json]`: what a controller and a worker
keep per spawn/stop cycle.

A controller that spawns and stops meshes again and again must stay flat (issue 16; mesh
ME-11). This benchmark runs, from this process (the controller, on TCP), `--cycles` cycles of:
spawn `--procs` procs, spawn one actor on each, call it, stop the actors, stop the procs;
first on this host, then on a worker (a `LocalJob` of one host, which makes the job's secret
and ends the worker). Both kinds are warmed up first (as many cycles as
measured, by default: the heap's high-water mark and the tables that keep the last seconds'
records are full before the baseline), and each measurement comes after a settle time
(`--settle`, by default longer than the stop timers and the dead-record grace), so that only
what stays is counted.

For each phase it prints, for the controller and for the worker process: RSS growth per
cycle (VmRSS), heap growth per cycle (the controller's glibc mallinfo2 uordblks; the worker's
heap is not readable from here), and fd and thread counts before and after. `--json` prints
one JSON object instead. Progress goes to stderr. A benchmark, not a test: it asserts
nothing about the figures.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

import podium.actor as pa
from podium._src import runtime
from podium._src.bench_workers import start_local_worker

# The settle time covers the actor stop grace timer (10 s) and the dead-record grace
# (mesh ME-11, 30 s by default), plus this margin.
_SETTLE_MARGIN_S = 2.0
_STOP_TIMERS_S = 10.0
_DEFAULT_GRACE_S = 30.0
_TIMEOUT_S = 60.0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split())]


def _heap_in_use() -> Optional[int]:
    """Bytes of this process's glibc heap in use (mallinfo2 uordblks); None without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        return int(libc.mallinfo2().uordblks)
    except (OSError, AttributeError):
        return None


def _vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _snapshot(pid: int, heap: bool) -> Dict[str, Any]:
    """RSS, fd and thread counts of process `pid` (and this process's heap if `heap`)."""
    out: Dict[str, Any] = {
        "rss": _vm_rss(pid),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": len(os.listdir(f"/proc/{pid}/task")),
    }
    if heap:
        out["heap"] = _heap_in_use()
    return out


# --- the actor and one cycle ---------------------------------------------------------------

from podium.actor import Actor, endpoint


class SoakEcho(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


def _cycle(hosts: Any, i: int, procs: int) -> None:
    pm = hosts.spawn_procs(per_host={"gpus": procs})
    am = pm.spawn("soak", SoakEcho)
    got = am.echo.call(i).get(timeout=_TIMEOUT_S)
    if len(got) != procs:
        raise RuntimeError(f"cycle {i}: {len(got)} replies, expected {procs}")
    am.stop().get(timeout=_TIMEOUT_S)
    pm.stop().get(timeout=_TIMEOUT_S)


def _run_cycles(name: str, hosts: Any, n: int, procs: int, quiet: bool) -> float:
    """Runs `n` cycles on `hosts`; seconds per cycle."""
    start = time.monotonic()
    step = max(1, n // 10)
    for i in range(n):
        _cycle(hosts, i, procs)
        if not quiet and ((i + 1) % step == 0 or i + 1 == n):
            per = (time.monotonic() - start) / (i + 1)
            print(f"soak: {name} {i + 1}/{n} ({per * 1e3:.1f} ms/cycle)", file=sys.stderr,
                  flush=True)
    return (time.monotonic() - start) / max(1, n)


def _settle(seconds: float, quiet: bool) -> None:
    if seconds > 0 and not quiet:
        print(f"soak: settling {seconds:.0f} s (stop timers, dead-record grace)",
              file=sys.stderr, flush=True)
    time.sleep(seconds)
    gc.collect()


# --- the report ----------------------------------------------------------------------------


def _growth(before: Dict[str, Any], after: Dict[str, Any], cycles: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k in ("rss", "heap"):
        if k in before and before[k] is not None and after.get(k) is not None:
            out[f"{k}_bytes_per_cycle"] = round((after[k] - before[k]) / max(1, cycles), 1)
            out[f"{k}_before"] = before[k]
            out[f"{k}_after"] = after[k]
    for k in ("fds", "threads"):
        out[f"{k}_before"] = before[k]
        out[f"{k}_after"] = after[k]
    return out


def _print_human(report: Dict[str, Any]) -> None:
    print(f"podium bench soak: {report['cycles']} cycles of {report['procs']} proc(s) "
          f"(spawn, call, stop), settle {report['settle_s']} s")
    for phase, title in (("local", "on this host"), ("worker", "on an attached worker")):
        p = report["phases"][phase]
        print(f"\n{report['cycles']} cycles {title} ({p['ms_per_cycle']} ms/cycle):")
        print(f"  {'process':<11} {'RSS B/cycle':>12} {'heap B/cycle':>13} {'fds':>11} "
              f"{'threads':>11}")
        for who in ("controller", "worker"):
            g = p[who]
            heap = g.get("heap_bytes_per_cycle")
            print(f"  {who:<11} {g['rss_bytes_per_cycle']:>12.0f} "
                  f"{'-' if heap is None else f'{heap:.0f}':>13} "
                  f"{g['fds_before']:>5} -> {g['fds_after']:<3} "
                  f"{g['threads_before']:>4} -> {g['threads_after']:<3}")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="podium bench soak",
        description="Memory, fds and threads of a controller and a worker over spawn/stop "
                    "cycles (issue 16; mesh ME-11).")
    p.add_argument("--cycles", type=int, default=1000, help="measured cycles per phase")
    p.add_argument("--procs", type=int, default=1, help="procs per spawn")
    p.add_argument("--warmup", type=int, default=None,
                   help="unmeasured cycles first, per kind (default: --cycles, so that the "
                        "heap's high-water mark and the time-windowed tables are reached "
                        "before the baseline)")
    p.add_argument("--grace-ms", type=int, default=None,
                   help="PODIUM_DEAD_RECORD_GRACE_MS for the controller and the worker "
                        "(default: the runtime's, 30 s)")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds to wait before each measurement (default: the longer of the "
                        "stop timers and the dead-record grace, plus 2 s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = args.cycles
    if args.cycles < 1 or args.procs < 1 or args.warmup < 0:
        p.error("--cycles and --procs must be at least 1, --warmup at least 0")

    if runtime.running():
        p.error("podium already runs in this process; the soak bench must start it (on TCP)")
    grace_s = _DEFAULT_GRACE_S
    if args.grace_ms is not None:
        os.environ["PODIUM_DEAD_RECORD_GRACE_MS"] = str(args.grace_ms)
        grace_s = args.grace_ms / 1000.0
    elif os.environ.get("PODIUM_DEAD_RECORD_GRACE_MS", "").isdigit():
        grace_s = int(os.environ["PODIUM_DEAD_RECORD_GRACE_MS"]) / 1000.0
    settle = args.settle if args.settle is not None else (
        max(_STOP_TIMERS_S, grace_s) + _SETTLE_MARGIN_S)

    job = None
    try:
        pa.enable_transport("tcp://127.0.0.1:0")
        # A LocalJob of one worker: it makes the job's secret (SE-4) and ends the worker.
        job, address, wpid = start_local_worker()
        remote = pa.attach_to_workers(workers=[address])
        remote.initialized.get(timeout=_TIMEOUT_S)
        local = pa.this_host()
        me = os.getpid()

        def snap() -> Dict[str, Any]:
            return {"controller": _snapshot(me, True), "worker": _snapshot(wpid, False)}

        _run_cycles("warm-up on this host", local, args.warmup, args.procs, args.quiet)
        _run_cycles("warm-up on the worker", remote, args.warmup, args.procs, args.quiet)
        _settle(settle, args.quiet)
        base = snap()
        local_s = _run_cycles("this host", local, args.cycles, args.procs, args.quiet)
        _settle(settle, args.quiet)
        after_local = snap()
        remote_s = _run_cycles("the worker", remote, args.cycles, args.procs, args.quiet)
        _settle(settle, args.quiet)
        after_remote = snap()
        remote.shutdown().get(timeout=_TIMEOUT_S)
    finally:
        if job is not None:
            job.kill()

    def phase(before: Dict[str, Any], after: Dict[str, Any], seconds: float) -> Dict[str, Any]:
        return {"ms_per_cycle": round(seconds * 1e3, 2),
                "controller": _growth(before["controller"], after["controller"], args.cycles),
                "worker": _growth(before["worker"], after["worker"], args.cycles)}

    report = {
        "benchmark": "soak",
        "cycles": args.cycles,
        "procs": args.procs,
        "warmup": args.warmup,
        "settle_s": settle,
        "dead_record_grace_s": grace_s,
        "phases": {"local": phase(base, after_local, local_s),
                   "worker": phase(after_local, after_remote, remote_s)},
    }
    if args.json:
        print(json.dumps(report), flush=True)
    else:
        _print_human(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
