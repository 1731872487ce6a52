"""Data-parallel training driven from the controller, checked against one process.

The benchmark's MLP (examples/ddp_common.py) is trained on 4 procs (CPU, gloo) from this one
process: inside ``mesh.activate()`` every proc makes its shard of each step's batch with a
remote function, computes its gradients with ``podium.grad_generator``, averages them along
the ``gpus`` dimension with ``reduce_``, and steps its optimizer. The same model trained in
this process on the whole batches ends with the same weights (the mean of equal shards' mean
losses is the whole batch's mean loss); the program checks that on every proc and prints the
time per step. ``podium bench tensor`` times this next to torchrun's DDP.

    python examples/ddp.py [--procs 4] [--steps 10] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics

import ddp_common

from podium.actor import this_host


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="timed steps (run twice: "
                        "with a sync after each, then back to back)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    mesh = this_host().spawn_procs(per_host={"gpus": args.procs})
    try:
        run = ddp_common.train_from_controller(mesh, args.steps, warmup=1,
                                               device=args.device)
    finally:
        mesh.stop().get(timeout=60)
    reference = ddp_common.train_single_process(run["trained_steps"], world=args.procs)
    worst = max(ddp_common.max_abs_diff(final, reference) for final in run["final"])
    print(f"max |weight - single-process weight| over {args.procs} procs after "
          f"{run['trained_steps']} steps: {worst:.2e}")
    print(f"time per step: {statistics.median(run['step_s']) * 1e3:.2f} ms (median, synced); "
          f"{run['loop_s'] / args.steps * 1e3:.2f} ms back to back")
    if worst > 1e-5:
        raise SystemExit(f"parity failed: {worst}")
    print("parity ok")


if __name__ == "__main__":
    main()
