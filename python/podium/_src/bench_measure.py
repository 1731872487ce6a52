"""What the data-plane benchmarks measure with (`podium bench rdma`, `--cuda`): wall-clock
timing of one call, best of several, GB/s, and the sizes they step through."""

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


def gbps(n: int, s: float) -> float:
    return n / s / 1e9 if s > 0 else float("inf")


def sizes(first: int, last: int) -> List[int]:
    """``first``, then x4 up to ``last``."""
    out, n = [], first
    while n <= last:
        out.append(n)
        n *= 4
    return out
