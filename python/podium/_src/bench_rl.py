"""`podium bench rl [--steps 60] [--max-staleness 1] [--reps 50] [--quick] [--json]`: the RL
example's loop (examples/rl/, installed as ``podium._src.rl_core``; docs/rl.md) on this host:
a generator service of 2 replicas, a reward actor, a replay buffer actor and a trainer mesh of
2 procs, weights synced from the trainer to the generators over the data plane after every
step.

Figures: train steps/s and generated tokens/s over the loop (after start-up). The weight sync
per step, next to the data plane's time for the same bytes: after the last step each generator
in turn runs ``--reps`` rounds of a plain ``RDMABuffer.read_into`` of the trainer's weight slot
and a full weight sync of the same bytes (the summed read into the staging buffer, whose sum
gives the checksum, the header check, the swap: ``generate``'s path), interleaved (which goes
first alternates) so both see the same load; the medians and their ratio (target <= 1.5). Also
the weight syncs made in the loop itself (median, mean, the read's part), where generation and
training compete for the same cores. And the mean reward of the first and last 10 steps, the
start-up time and the stale batches dropped.

``--quick`` (the test's): 12 steps, 20 reads. Progress goes to stderr; ``--json`` prints one
JSON object on one line. A benchmark, not a test: it asserts nothing about the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from typing import Any, Dict, List

from podium._src import rl_core


def _log(message: str) -> None:
    print(f"bench rl: {message}", file=sys.stderr, flush=True)


def run(steps: int, max_staleness: int, reps: int) -> Dict[str, Any]:
    cfg = dataclasses.replace(rl_core.Config(), steps=steps, max_staleness=max_staleness)
    probe: List[Any] = []

    def on_step(row: Dict[str, Any], r: rl_core.Run) -> None:
        if row["step"] % 10 == 0 or row["step"] == 1:
            _log(f"step {row['step']}: reward {row['reward']:.3f}, tokens/s "
                 f"{row['tokens_per_s']:.0f}, sync {row['sync_ms']:.2f} ms")
        if row["step"] == steps:  # the data plane's time for the same bytes, same procs
            # One replica after the other: measured at once, the two would take turns on the
            # cores and each time the other's reads.
            for replica in range(cfg.replicas):
                probe.extend(r.service.compare_sync.call_one(r.slots, reps, replica=replica)
                             .get(timeout=120))

    r = rl_core.run(cfg, on_step)
    loop_s = r.steps[-1]["time_s"] - r.startup_s
    tokens = len(r.samples) * cfg.prompts * cfg.group * rl_core.DIGITS
    syncs = r.sync_times
    sync_med = statistics.median(syncs) * 1e3 if syncs else float("nan")
    read_med = statistics.median(p for p, _, _ in probe) * 1e3
    iso_med = statistics.median(s for _, s, _ in probe) * 1e3
    iso_read = statistics.median(x for _, _, x in probe) * 1e3
    in_loop_read = statistics.median(r.sync_read_times) * 1e3 if syncs else float("nan")
    first, last = r.steps[:10], r.steps[-10:]
    return {
        "steps": steps,
        "max_staleness": max_staleness,
        "generator_replicas": cfg.replicas,
        "trainer_procs": cfg.trainers,
        "parameters": rl_core.num_params(rl_core.Policy()),
        "weight_bytes": r.slots[0].size(),
        "startup_s": r.startup_s,
        "loop_s": loop_s,
        "steps_per_s": steps / loop_s,
        "tokens_per_s": tokens / loop_s,
        "sync_ms_median": sync_med,
        "sync_ms_mean": statistics.mean(syncs) * 1e3 if syncs else float("nan"),
        "sync_read_ms_median": in_loop_read,
        "syncs": len(syncs),
        "sync_isolated_ms_median": iso_med,
        "sync_isolated_read_ms_median": iso_read,
        "data_plane_read_ms_median": read_med,
        "data_plane_reads": len(probe),
        "sync_over_data_plane": iso_med / read_med,
        "sync_in_loop_over_data_plane": sync_med / read_med,
        "target_sync_over_data_plane": 1.5,
        "reward_first10": sum(x["reward"] for x in first) / len(first),
        "reward_last10": sum(x["reward"] for x in last) / len(last),
        "max_staleness_seen": max(x["staleness"] for x in r.steps),
        "stale_batches_dropped": r.dropped,
    }


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="podium bench rl", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None, help="train steps (default 60)")
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--reps", type=int, default=None, help="plain reads timed (default 50)")
    p.add_argument("--quick", action="store_true", help="12 steps, 20 reads (the test's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    steps = a.steps if a.steps is not None else (12 if a.quick else 60)
    reps = a.reps if a.reps is not None else (20 if a.quick else 50)
    if steps < 1 or reps < 1 or a.max_staleness < 0:
        p.error("--steps and --reps must be >= 1, --max-staleness >= 0")
    result = run(steps, a.max_staleness, reps)
    if a.json:
        print(json.dumps(result))
        return 0
    print(f"policy: {result['parameters']} parameters, {result['weight_bytes']} bytes per "
          f"weight version; {result['generator_replicas']} generator replicas, "
          f"{result['trainer_procs']} trainer procs, max staleness {result['max_staleness']}")
    print(f"{result['steps']} steps in {result['loop_s']:.1f} s after a {result['startup_s']:.1f} s "
          f"start: {result['steps_per_s']:.2f} steps/s, {result['tokens_per_s']:.0f} tokens/s")
    print(f"weight sync, after the loop: median {result['sync_isolated_ms_median']:.3f} ms; a "
          f"plain read of the same bytes by the same procs: "
          f"{result['data_plane_read_ms_median']:.3f} ms; ratio "
          f"{result['sync_over_data_plane']:.2f} (target <= 1.5)")
    print(f"weight sync in the loop (generation and training running): median "
          f"{result['sync_ms_median']:.2f} ms, of which the read {result['sync_read_ms_median']:.2f}"
          f" ms (mean {result['sync_ms_mean']:.2f} ms, {result['syncs']} syncs); ratio to the "
          f"plain read {result['sync_in_loop_over_data_plane']:.2f}")
    print(f"mean reward: first 10 steps {result['reward_first10']:.3f}, last 10 "
          f"{result['reward_last10']:.3f}; stale batches dropped: "
          f"{result['stale_batches_dropped']}")
    return 0
