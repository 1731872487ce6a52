"""`podium bench tensor [--procs 4] [--steps 30] [--warmup 5] [--quick] [--json]`: data-parallel
training of the DDP example's model (examples/ddp_common.py: its model, data, loss and SGD) on
``--procs`` CPU processes (issue 20 item 9).

Two figures side by side, in one run:

- ``controller_ddp``: the same training driven from this process through the tensor engine
  (``ddp_common.train_from_controller``, what examples/ddp.py runs): ``--procs`` procs of one
  mesh, each making its shard of each batch, gradients from ``grad_generator`` averaged with
  ``reduce_(..., "avg")`` over gloo. ``step_ms_median``/``p90``: the controller's time per
  step with a sync after each (the last parameter read back); ``loop_ms_per_step``: steps
  issued back to back, one sync at the end. Its final weights on every rank are compared with
  the single-process reference, as the baseline's are.
- ``dispatch``: controller-side dispatch throughput (``podium.tensor._bench.measure_dispatch``):
  ``--ops`` small ops (``a = a + 1``) to a ``--procs``-proc mesh, from the first op to the last
  proc's value read back (``ops_per_s``), and the controller's own CPU cost per op
  (``controller_cpu_ops_per_s``).
- ``torchrun_ddp``, the baseline: plain ``torch.distributed`` DDP (gloo, CPU) launched with
  ``torchrun`` (``python -m torch.distributed.run --standalone``). Each rank times each of its
training steps (zero_grad, forward, loss, backward with DDP's all-reduce, SGD step; making the
batch is outside the timing) with ``time.perf_counter``; a step's time is the slowest rank's;
the report gives the median and p90 over the steps after ``--warmup``, and the loop's wall time
per step on rank 0. Each rank runs torch with ``ddp_common.TORCH_THREADS`` threads. Rank 0
saves the final weights, compared here with ``ddp_common.train_single_process`` on the same
global batches (``max_abs_diff_vs_single_process``): the baseline trains what the reference
trains.

``ratios``: the controller's step over torchrun's (median against median, loop against loop;
the target is <= 1.25).

``--quick`` (the test's): 2 procs, 3 steps after 1 of warm-up, 500 ops. Progress goes to stderr;
``--json`` prints one JSON object on one line. A benchmark, not a test: it asserts nothing
about the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from podium._src import ddp_common
from podium._src.proc_mesh import this_host
from podium.tensor._bench import measure_dispatch

_TIMEOUT_S = 600.0


def _log(message: str) -> None:
    print(f"bench tensor: {message}", file=sys.stderr, flush=True)


def _percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure_torchrun_ddp(procs: int = 4, steps: int = 30, warmup: int = 5,
                         timeout_s: float = _TIMEOUT_S) -> Dict[str, Any]:
    """Launches ``procs`` ranks of DDP with torchrun for ``warmup + steps`` steps; their
    figures (see the module docstring). RuntimeError naming torchrun's exit status and the
    end of its output when it fails."""
    if procs < 1 or steps < 1 or warmup < 0:
        raise ValueError(f"procs and steps must be >= 1 and warmup >= 0 "
                         f"(got {procs}, {steps}, {warmup})")
    with tempfile.TemporaryDirectory(prefix="podium-bench-tensor-") as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={procs}", "-m", "podium._src.bench_tensor", "--rank-main",
               "--steps", str(steps), "--warmup", str(warmup), "--out", out]
        env = dict(os.environ, OMP_NUM_THREADS=str(ddp_common.TORCH_THREADS))
        start = time.monotonic()
        r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=timeout_s)
        launch_s = time.monotonic() - start
        if r.returncode != 0:
            raise RuntimeError(f"torchrun exited with status {r.returncode}: "
                               f"{(r.stdout + r.stderr)[-3000:]}")
        with open(os.path.join(out, "times.json")) as f:
            ranks = json.load(f)
        final = torch.load(os.path.join(out, "final.pt"))
    per_step = [max(rank[i] for rank in ranks["step_s"]) for i in range(warmup + steps)]
    timed = per_step[warmup:]
    reference = ddp_common.train_single_process(warmup + steps, world=procs)
    return {
        "launcher": "torchrun",
        "backend": "gloo",
        "procs": procs,
        "steps": steps,
        "warmup": warmup,
        "torch_threads_per_rank": ddp_common.TORCH_THREADS,
        "step_ms_median": statistics.median(timed) * 1e3,
        "step_ms_p90": _percentile(timed, 0.9) * 1e3,
        "loop_ms_per_step": ranks["loop_s"] / steps * 1e3,
        "launch_s": launch_s,
        "max_abs_diff_vs_single_process": ddp_common.max_abs_diff(final, reference),
    }


def _rank_main(steps: int, warmup: int, out: str) -> int:
    """One torchrun rank: DDP training, times to ``out``/times.json, weights to final.pt."""
    torch.set_num_threads(ddp_common.TORCH_THREADS)
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        model = DistributedDataParallel(ddp_common.make_model())
        opt = ddp_common.make_optimizer(model.parameters())
        times: List[float] = []
        loop_start = 0.0
        for step in range(warmup + steps):
            x, y = ddp_common.rank_batch(step, rank, world)
            if step == warmup:
                loop_start = time.perf_counter()
            t0 = time.perf_counter()
            ddp_common.train_step(model, opt, x, y)
            times.append(time.perf_counter() - t0)
        loop_s = time.perf_counter() - loop_start
        gathered: List[Any] = [None] * world
        dist.all_gather_object(gathered, times)
        if rank == 0:
            with open(os.path.join(out, "times.json"), "w") as f:
                json.dump({"step_s": gathered, "loop_s": loop_s}, f)
            torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()},
                       os.path.join(out, "final.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def model_info() -> Dict[str, Any]:
    model = ddp_common.make_model()
    return {
        "layers": [ddp_common.IN_FEATURES, ddp_common.HIDDEN, ddp_common.OUT_FEATURES],
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch_per_rank": ddp_common.BATCH_PER_RANK,
        "optimizer": f"SGD lr={ddp_common.LR}",
    }


def measure_controller_ddp(procs: int = 4, steps: int = 30, warmup: int = 5) -> Dict[str, Any]:
    """The controller-driven figures (see the module docstring)."""
    mesh = this_host().spawn_procs(per_host={"gpus": procs})
    try:
        r = ddp_common.train_from_controller(mesh, steps, warmup=warmup)
    finally:
        mesh.stop().get(timeout=60)
    reference = ddp_common.train_single_process(r["trained_steps"], world=procs)
    return {
        "launcher": "podium controller (mesh.activate)",
        "backend": "gloo",
        "procs": procs,
        "steps": steps,
        "warmup": warmup,
        "torch_threads_per_rank": ddp_common.TORCH_THREADS,
        "step_ms_median": statistics.median(r["step_s"]) * 1e3,
        "step_ms_p90": _percentile(r["step_s"], 0.9) * 1e3,
        "loop_ms_per_step": r["loop_s"] / steps * 1e3,
        "max_abs_diff_vs_single_process": max(ddp_common.max_abs_diff(f, reference)
                                              for f in r["final"]),
    }


def run(procs: int, steps: int, warmup: int, ops: int) -> Dict[str, Any]:
    _log(f"controller DDP: {procs} procs, {warmup} + 2 x {steps} steps")
    controller = measure_controller_ddp(procs=procs, steps=steps, warmup=warmup)
    _log(f"torchrun DDP: {procs} procs, {warmup} + {steps} steps")
    baseline = measure_torchrun_ddp(procs=procs, steps=steps, warmup=warmup)
    _log(f"dispatch: {ops} small ops to {procs} procs")
    dispatch = measure_dispatch(ops, procs=procs)
    return {
        "benchmark": "tensor",
        "device": "cpu",
        "torch": torch.__version__,
        "model": model_info(),
        "controller_ddp": controller,
        "torchrun_ddp": baseline,
        "dispatch": dispatch,
        "ratios": {
            "step_median_vs_torchrun": controller["step_ms_median"] / baseline["step_ms_median"],
            "loop_vs_torchrun": controller["loop_ms_per_step"] / baseline["loop_ms_per_step"],
        },
    }


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="podium bench tensor", description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=None, help="data-parallel ranks (default 4)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 30)")
    p.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 5)")
    p.add_argument("--quick", action="store_true", help="2 procs, 1 + 3 steps (the test's)")
    p.add_argument("--ops", type=int, default=None, help="small ops dispatched (default 20000)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    # A torchrun rank of this benchmark (internal).
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    def pick(value: Any, quick: int, full: int) -> int:
        return value if value is not None else (quick if a.quick else full)

    steps, warmup = pick(a.steps, 3, 30), pick(a.warmup, 1, 5)
    if a.rank_main:
        rc = _rank_main(steps, warmup, a.out)
        # Out without the interpreter's teardown: after destroy_process_group, torch's exit
        # path sometimes destroys a thread object still joinable ("terminate called without
        # an active exception", SIGABRT), 2 runs in 25 on the loaded 2-core VM, after both
        # ranks had passed the last barrier and written their results. torchrun then fails
        # the whole baseline for a crash past its end.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    result = run(procs=pick(a.procs, 2, 4), steps=steps, warmup=warmup,
                 ops=pick(a.ops, 500, 20000))
    if a.json:
        print(json.dumps(result))
        return 0
    m = result["model"]
    print(f"model: MLP {m['layers']} ({m['parameters']} parameters), {m['batch_per_rank']} rows "
          f"per rank, {m['optimizer']}")
    for key, what in (("controller_ddp", "podium controller"), ("torchrun_ddp", "torchrun DDP")):
        t = result[key]
        print(f"{what} (gloo, CPU), {t['procs']} procs, {t['torch_threads_per_rank']} torch "
              f"thread(s) each: step median {t['step_ms_median']:.2f} ms, p90 "
              f"{t['step_ms_p90']:.2f} ms, loop {t['loop_ms_per_step']:.2f} ms/step over "
              f"{t['steps']} steps; final weights vs the single-process reference: max |diff| "
              f"{t['max_abs_diff_vs_single_process']:.2e}")
    r, d = result["ratios"], result["dispatch"]
    print(f"controller / torchrun: step x{r['step_median_vs_torchrun']:.2f}, loop "
          f"x{r['loop_vs_torchrun']:.2f} (target <= 1.25)")
    print(f"dispatch: {d['ops_per_s']:,.0f} ops/s end to end ({d['n_ops']} ops to {d['procs']} "
          f"procs), controller CPU {d['controller_cpu_ops_per_s']:,.0f} ops/s (target >= 20,000)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
