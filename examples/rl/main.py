"""GRPO on CPU with podium (docs/rl.md): a generator service of 2 replicas samples groups of
completions, a reward actor checks them, a replay buffer actor holds them, a trainer mesh of 2
procs trains data-parallel, and the weights go from the trainer to the generators over the data
plane after every step, versioned. Generation overlaps training; --max-staleness bounds how
old the weights behind a trained sample may be.

    python examples/rl/main.py [--steps 150] [--max-staleness 1] [--plot rl.png] [--seed 0]

The policy (a ~100K-parameter transformer made here, no downloaded weights) learns to reverse
4 digits from scratch, by RL alone. Progress is printed per step; the plot shows mean reward,
exact reversals and generated tokens/s (over 10-step windows) per step.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import cloudpickle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rl_core  # noqa: E402

# The actors are defined in rl_core, which the procs cannot import from this folder: send the
# module's code with them.
cloudpickle.register_pickle_by_value(rl_core)


def plot(run: rl_core.Run, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in run.steps]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, [r["reward"] for r in run.steps], color="tab:blue", label="mean reward")
    ax.plot(steps, [r["exact"] for r in run.steps], color="tab:cyan", linestyle="--",
            label="exact reversals")
    ax.set_xlabel("train step")
    ax.set_ylabel("reward")
    ax.set_ylim(0, 1.05)
    ax2 = ax.twinx()
    # Generated tokens per second over the last (up to) 10 steps: one step's is too noisy.
    rate = []
    for i in range(len(run.steps)):
        window = run.steps[max(0, i - 9):i + 1]
        rate.append(sum(r["tokens"] for r in window) / sum(r["step_s"] for r in window))
    ax2.plot(steps, rate, color="tab:orange", alpha=0.8, label="tokens/s (10-step window)")
    ax2.set_ylabel("generated tokens/s")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="center right")
    ax.set_title(f"GRPO, reverse {rl_core.DIGITS} digits (max staleness "
                 f"{run.cfg.max_staleness})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: "list[str] | None" = None) -> int:
    d = rl_core.Config()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--max-staleness", type=int, default=d.max_staleness)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--plot", default="rl.png", help="PNG of mean reward and tokens/s")
    a = p.parse_args(argv)
    if a.max_staleness < 0:
        p.error("--max-staleness must be >= 0")
    cfg = dataclasses.replace(d, steps=a.steps, max_staleness=a.max_staleness, seed=a.seed,
                              lr=a.lr)

    def progress(row: dict, run: rl_core.Run) -> None:
        if row["step"] == 1:
            print(f"started in {run.startup_s:.1f} s; weights: "
                  f"{row['sync_bytes'] / 1024:.0f} KiB per version", flush=True)
        print(f"step {row['step']:4d}  reward {row['reward']:.3f}  exact {row['exact']:.3f}  "
              f"tokens/s {row['tokens_per_s']:7.0f}  sync {row['sync_ms']:6.2f} ms  "
              f"staleness {row['staleness']}  t {row['time_s']:6.1f} s", flush=True)

    run = rl_core.run(cfg, progress)
    plot(run, a.plot)
    first = run.steps[:10]
    last = run.steps[-10:]
    print(f"mean reward: first 10 steps {sum(r['reward'] for r in first) / len(first):.3f}, "
          f"last 10 steps {sum(r['reward'] for r in last) / len(last):.3f}; "
          f"stale batches dropped: {run.dropped}; plot: {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
