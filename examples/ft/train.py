"""Fault-tolerant data-parallel training that keeps going (docs/fault_tolerance.md).

R replica groups (each a proc mesh of P procs with its own gloo group) train one model; the
controller keeps a per-step quorum, so when a group's proc dies the others finish the step
without it and keep training, while a replacement group is spawned in the background, reads
the current weights and optimizer state of a healthy group over the data plane (RDMABuffer)
and rejoins at a step boundary. The fault injector kills a group every K steps.

    python examples/ft/train.py                       # 3 groups, faults every 40 steps
    python examples/ft/train.py --inject "every=20 kinds=sigkill,segfault,exit" --steps 400
    python examples/ft/train.py --inject none         # no faults

It first runs the same steps without faults (the reference curve; --no-baseline skips it),
then the run with faults, prints progress as it goes and writes a plot of both loss curves
(--plot, PNG) with the faults marked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import List, Optional

from podium._src import ft


def run(groups: int, procs: int, steps: int, inject: Optional[str], seed: int,
        step_timeout_s: float, log=print) -> ft.Trainer:
    trainer = ft.Trainer(groups=groups, procs=procs, seed=seed, inject=inject,
                         step_timeout_s=step_timeout_s, log=log)
    try:
        t0 = time.monotonic()
        trainer.start()
        log(f"{groups} groups of {procs} procs started in {time.monotonic() - t0:.2f} s")
        trainer.run(steps, progress_every=max(1, steps // 20))
    finally:
        trainer.stop()
    return trainer


def smooth(values: List[float], window: int = 9) -> List[float]:
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1):i + 1]
        out.append(sum(part) / len(part))
    return out


def plot(path: str, clean: Optional[ft.Trainer], faulty: ft.Trainer) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if clean is not None:
        ax.plot([s.step for s in clean.steps], smooth([s.loss for s in clean.steps]),
                label="no faults", color="tab:blue")
    ax.plot([s.step for s in faulty.steps], smooth([s.loss for s in faulty.steps]),
            label="with faults", color="tab:orange", alpha=0.85)
    for f in faulty.faults:
        ax.axvline(f.step, color="tab:red", alpha=0.3, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (mean of the quorum, smoothed over 9 steps)")
    ax.set_yscale("log")
    ax.set_title(f"{faulty.R} replica groups; red: a fault ({len(faulty.faults)} in all)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=3, help="replica groups R (default 3)")
    p.add_argument("--procs", type=int, default=1, help="procs per group P (default 1)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--inject", default="every=40 kinds=sigkill,segfault,exit",
                   help='faults: "every=K kinds=sigkill,segfault,exit", or "none"')
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-timeout", type=float, default=3.0,
                   help="a group whose gradient is not in within this many seconds is dropped")
    p.add_argument("--plot", default="ft_loss.png", help="PNG of both loss curves ('' for none)")
    p.add_argument("--no-baseline", action="store_true", help="skip the fault-free run")
    p.add_argument("--json", help="write the step logs and faults here")
    args = p.parse_args(argv)
    inject = None if args.inject in ("", "none") else args.inject
    ft.parse_inject(inject)  # refuse a bad spec before anything starts
    clean = None
    if not args.no_baseline:
        print("== without faults", flush=True)
        clean = run(args.groups, args.procs, args.steps, None, args.seed, args.step_timeout)
    print(f"== with faults: {inject}", flush=True)
    faulty = run(args.groups, args.procs, args.steps, inject, args.seed, args.step_timeout)
    for f in faulty.faults:
        nxt = f"{f.t_next_step - f.t_fault:.3f} s" if f.t_next_step else "never"
        rej = f"{f.t_rejoin - f.t_fault:.2f} s" if f.t_rejoin else "not within the run"
        print(f"fault {f.kind:8s} at step {f.step} in group {f.slot}: survivors' step done "
              f"after {nxt}, replacement rejoined after {rej}")
    if clean is not None:
        a, b = clean.steps[-1].loss, faulty.steps[-1].loss
        print(f"final loss: {a:.5f} without faults, {b:.5f} with {len(faulty.faults)} faults")
    if args.plot:
        plot(args.plot, clean, faulty)
        print(f"plot: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"clean": clean.summary() if clean else None,
                       "faulty": faulty.summary()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
