"""What the data-plane benchmarks measure with (`podium bench rdma`, `--cuda`): wall-clock
timing of one call, best of several, the time per call of a timed run of calls, GB/s, and the
sizes they step through."""

from __future__ import annotations

import time
from typing import Any, Callable, List


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best(fn: Callable[[], Any], reps: int) -> float:
    """The shortest of ``reps`` timed calls."""
    return min(timed(fn) for _ in range(reps))


def best_per_call(fn: Callable[[], Any], reps: int, min_rep_s: float = 0.005) -> float:
    """Seconds per call of ``fn``: the best of ``reps`` timed runs, each of as many calls as
    take at least ``min_rep_s`` (one call for calls that long or longer).

    A call of tens of microseconds timed alone measures the state the CPU is in as much as
    the call: on a VM, the first calls after an idle spell (a lease's drop wait, a control
    round trip) ran at 2 to 4 times their steady time, over about a millisecond, while a
    floor timed right after them ran warm (docs/data_figures.md, "Timed runs"). Runs of calls
    put the figure and its floor under the same conditions: what a program that moves such
    blocks one after the other gets."""
    calls = calls_per_run(timed(fn), min_rep_s)
    out = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out = min(out, (time.perf_counter() - t0) / calls)
    return out


def calls_per_run(first_s: float, min_rep_s: float = 0.005) -> int:
    """How many calls a timed run makes (``best_per_call``): as many as take at least
    ``min_rep_s`` at the pace of a first call that took ``first_s``; one where that is
    longer."""
    if first_s >= min_rep_s:
        return 1
    return min(100_000, int(min_rep_s / max(first_s, 1e-7)) + 1)


def gbps(n: int, s: float) -> float:
    return n / s / 1e9 if s > 0 else float("inf")


def sizes(first: int, last: int) -> List[int]:
    """``first``, then x4 up to ``last``."""
    out, n = [], first
    while n <= last:
        out.append(n)
        n *= 4
    return out
