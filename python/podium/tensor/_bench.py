"""Controller-side dispatch throughput of the tensor engine (``podium bench tensor``).

``measure_dispatch(n_ops, procs=4)`` spawns `procs` procs on this host, activates them and
times a loop of `n_ops` small ops (``a = a + 1`` on a 4-element tensor) from the first op to
the value read back from the last proc: interception, metadata (cached), batching and the
workers' execution are all inside the figure.
"""

from __future__ import annotations

import time
from typing import Any, Dict

import torch

from podium._src.proc_mesh import this_host
from podium.tensor._fetch import fetch_shard
from podium.tensor._tensor import cache_stats

_TIMEOUT_S = 300.0


def measure_dispatch(n_ops: int, procs: int = 4, warmup: int = 200) -> Dict[str, Any]:
    """``{"ops_per_s", "n_ops", "procs", "seconds", "dispatch_s", "dispatch_cpu_s",
    "controller_cpu_ops_per_s", "meta_cache_misses"}``: `ops_per_s` is n_ops over `seconds`,
    from the first op to the last proc's value read back; `dispatch_s` is the controller's
    wall time issuing the ops (batches sent, no wait), `dispatch_cpu_s` its CPU time (the
    controller's cost, whatever else runs on the machine)."""
    if n_ops < 1 or procs < 1:
        raise ValueError("measure_dispatch needs n_ops >= 1 and procs >= 1")
    pm = this_host().spawn_procs(per_host={"procs": procs})
    try:
        with pm.activate():
            a = torch.ones(4)
            for _ in range(warmup):
                a = a + 1
            fetch_shard(a, procs=procs - 1).get(timeout=_TIMEOUT_S)
            misses = cache_stats["misses"]
            t0 = time.perf_counter()
            c0 = time.process_time()
            for _ in range(n_ops):
                a = a + 1
            t1 = time.perf_counter()
            c1 = time.process_time()
            value = fetch_shard(a, procs=procs - 1).get(timeout=_TIMEOUT_S)
            t2 = time.perf_counter()
        if int(value[0].item()) != 1 + warmup + n_ops:
            raise RuntimeError(f"measure_dispatch: the last proc computed {value.tolist()}, "
                               f"not {1 + warmup + n_ops}")
        return {
            "ops_per_s": n_ops / (t2 - t0),
            "n_ops": n_ops,
            "procs": procs,
            "seconds": t2 - t0,
            "dispatch_s": t1 - t0,
            "dispatch_cpu_s": c1 - c0,
            "controller_cpu_ops_per_s": n_ops / max(c1 - c0, 1e-9),
            "meta_cache_misses": cache_stats["misses"] - misses,
        }
    finally:
        pm.stop().get(timeout=60)
