"""Distributed tensors: PyTorch written as if the whole mesh were attached to the controller.

A walk-through of podium's tensor engine on 4 procs of this host (CPU; pass ``--device cuda``
where GPUs are present):

1. ``with mesh.activate():`` every torch op runs on every proc; tensors are handles.
2. ``podium.inspect`` reads one proc's value back.
3. A failing command raises ``RemoteException`` when its value is read; the workers live on.
4. Collectives along named mesh dimensions, after ``split`` and ``rename``.
5. A two-stage pipeline: stage 0's output moves to stage 1 with ``to_mesh``.

    python examples/distributed_tensors.py
"""

from __future__ import annotations

import argparse

import torch

import podium
from podium.actor import this_host


def main(device: str) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        # 1-2. Ops on every proc; each proc's rank tensor holds its own coordinate.
        with procs.activate():
            rank = procs.rank_tensor("gpus").float()
            x = torch.ones(2, 3, device=device) * (rank + 1)
            print("value on gpus=2:", podium.inspect(x, gpus=2).tolist())

            # 3. A failure: an index out of range raises on the workers; reading the value
            # raises RemoteException here (rank, host, remote traceback). Then we go on.
            bad = x.index_select(0, torch.tensor([5], device=device))
            try:
                podium.inspect(bad * 2)
            except podium.RemoteException as e:
                print(f"remote failure on rank {e.rank}: {type(e.exception).__name__}")
            print("after the failure:", podium.inspect(x.sum(), gpus=3).item())

            # 4. All-reduce along the only dimension.
            total = x.reduce("gpus", "sum")
            print("all-reduced:", podium.inspect(total, gpus=0)[0].tolist())

        # 4b. The same procs as a 2x2 grid: reduce along one dimension or both.
        grid = procs.split(gpus=("dp", "tp"), tp=2).rename(tp="model")
        with grid.activate():
            r = grid.rank_tensor(("dp", "model")).float()
            along_model = r.reduce("model", "sum")
            along_both = r.reduce(("dp", "model"), "max")
            print("along model:", [podium.inspect(along_model, dp=d, model=m).item()
                                   for d in range(2) for m in range(2)])
            print("along both:", podium.inspect(along_both, dp=1, model=1).item())

        # 5. A two-stage pipeline: stage 0 computes, its output moves to stage 1.
        stages = procs.split(gpus=("stage", "dp"), dp=2)
        first, second = stages.slice(stage=0), stages.slice(stage=1)
        with first.activate():
            w0 = torch.full((3, 3), 2.0, device=device)
            h = torch.ones(4, 3, device=device) @ w0 + first.rank_tensor("dp").float()
        h1 = h.to_mesh(second)
        with second.activate():
            out = (h1 * 10).sum(dim=1)
            print("pipeline output on stage 1:", [podium.inspect(out, dp=d).tolist()
                                                  for d in range(2)])
        print("done")
    finally:
        procs.stop().get(timeout=60)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    main(parser.parse_args().device)
