"""Data-parallel training driven from the controller, checked against one process.

A small linear model is trained for a few SGD steps on 4 procs (CPU, gloo): each proc takes
its quarter of the batch (chosen with ``mesh.rank_tensor``), computes its gradients with
``podium.grad_generator``, averages them along the ``gpus`` dimension with ``reduce_``, and
steps its optimizer. The same model trained in this process on the whole batch ends with the
same weights (the mean of equal shards' mean losses is the whole batch's mean loss); the
program checks that on every proc and prints the time per step.

    python examples/ddp.py [--procs 4] [--steps 20] [--device cpu]
"""

from __future__ import annotations

import argparse
import time
from typing import Dict, List, Tuple

import torch

import podium
from podium.actor import this_host

IN, OUT, BATCH, LR = 16, 4, 64, 0.05


def make_problem(seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, IN, generator=g)
    y = x @ torch.randn(IN, OUT, generator=g) + 0.1 * torch.randn(BATCH, OUT, generator=g)
    init = {"weight": torch.randn(OUT, IN, generator=g) * 0.1,
            "bias": torch.zeros(OUT)}
    return x, y, init


def train_locally(x: torch.Tensor, y: torch.Tensor, init: Dict[str, torch.Tensor],
                  steps: int) -> torch.nn.Linear:
    model = torch.nn.Linear(IN, OUT)
    with torch.no_grad():
        model.weight.copy_(init["weight"])
        model.bias.copy_(init["bias"])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def train_distributed(x: torch.Tensor, y: torch.Tensor, init: Dict[str, torch.Tensor],
                      steps: int, procs: int, device: str) -> Tuple[List[torch.Tensor], float]:
    """(the final weight of every proc, seconds per step)."""
    mesh = this_host().spawn_procs(per_host={"gpus": procs})
    try:
        with mesh.activate():
            model = torch.nn.Linear(IN, OUT, device=device)
            with torch.no_grad():
                model.weight.copy_(torch.tensor(init["weight"].tolist(), device=device))
                model.bias.copy_(torch.tensor(init["bias"].tolist(), device=device))
            # The whole batch goes to every proc once; each keeps its shard.
            rank = mesh.rank_tensor("gpus").to(device)
            xs = torch.tensor(x.tolist(), device=device).view(procs, -1, IN)
            ys = torch.tensor(y.tolist(), device=device).view(procs, -1, OUT)
            xs = xs.index_select(0, rank.view(1)).squeeze(0)
            ys = ys.index_select(0, rank.view(1)).squeeze(0)
            params = list(model.parameters())
            opt = torch.optim.SGD(params, lr=LR)

            def step() -> None:
                loss = torch.nn.functional.mse_loss(model(xs), ys)
                grads = podium.grad_generator(loss, params)
                for p, g in zip(reversed(params), grads):
                    p.grad = g.reduce_("gpus", "avg")
                opt.step()

            step()  # the first step builds the process group
            podium.inspect(model.weight)
            t0 = time.perf_counter()
            for _ in range(steps - 1):
                step()
            weights = [podium.inspect(model.weight, gpus=g) for g in range(procs)]
            per_step = (time.perf_counter() - t0) / max(steps - 1, 1)
        return weights, per_step
    finally:
        mesh.stop().get(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    x, y, init = make_problem()
    reference = train_locally(x, y, init, args.steps).weight.detach()
    weights, per_step = train_distributed(x, y, init, args.steps, args.procs, args.device)
    worst = max((w.cpu() - reference).abs().max().item() for w in weights)
    print(f"max |weight - single-process weight| over {args.procs} procs: {worst:.2e}")
    print(f"time per step: {per_step * 1e3:.2f} ms")
    if worst > 1e-5:
        raise SystemExit(f"parity failed: {worst}")
    print("parity ok")


if __name__ == "__main__":
    main()
