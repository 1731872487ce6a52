"""What examples/ddp.py (data parallel from the controller), the `torchrun` baseline of
`podium bench tensor` and the parity test share: the model, the data, the loss, the optimizer
settings, and the single-process reference.

- The model: a 2-layer MLP (``IN_FEATURES`` -> ``HIDDEN`` -> ReLU -> ``OUT_FEATURES``), its
  initial weights made from ``SEED``.
- The data: step ``s`` has one global batch of ``world * BATCH_PER_RANK`` rows, made from
  ``SEED`` and ``s`` alone; data-parallel rank ``r`` of ``world`` trains on rows
  ``[r * BATCH_PER_RANK, (r + 1) * BATCH_PER_RANK)``.
- The loss: mean squared error against a fixed linear target plus noise; plain SGD (``LR``).

Each rank's loss is a mean over equal shards, so averaging the ranks' gradients (DDP, or a
``reduce_(..., "avg")`` of the gradients) gives the gradient of the global batch's loss: the
weights after N data-parallel steps match ``train_single_process(N, world)``, which sees the
same global batches in one process, within float tolerance.

``train_from_controller`` is the same training driven from one controller through the tensor
engine (``mesh.activate()``): every rank makes its own shard of each step's batch with a
remote function, gradients come from ``podium.grad_generator`` and are averaged along the
mesh dimension with ``reduce_``, and each rank steps its optimizer.

This file is also installed in podium as ``podium._src.ddp_common`` (the benchmark's copy).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

import podium

SEED = 0
IN_FEATURES = 256
HIDDEN = 1024
OUT_FEATURES = 16
BATCH_PER_RANK = 64
LR = 0.05
# Threads of torch in each rank: 4 ranks share the machine's cores in the benchmark.
TORCH_THREADS = 1


def make_model(seed: int = SEED) -> nn.Module:
    """The MLP with its initial weights (the same for every rank and the reference)."""
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, OUT_FEATURES))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 / p.shape[-1] ** 0.5))
    return model


def make_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def _target_weights(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1_000_003)
    return torch.randn(IN_FEATURES, OUT_FEATURES, generator=g) / IN_FEATURES ** 0.5


def global_batch(step: int, world: int, seed: int = SEED) -> Tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s whole batch: ``world * BATCH_PER_RANK`` rows (inputs, targets)."""
    g = torch.Generator().manual_seed(seed * 7919 + step)
    x = torch.randn(world * BATCH_PER_RANK, IN_FEATURES, generator=g)
    noise = 0.1 * torch.randn(world * BATCH_PER_RANK, OUT_FEATURES, generator=g)
    return x, torch.tanh(x @ _target_weights(seed)) + noise


def rank_batch(step: int, rank: int, world: int, seed: int = SEED
               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Data-parallel rank ``rank``'s shard of step ``step``'s global batch."""
    x, y = global_batch(step, world, seed)
    rows = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
    return x[rows].contiguous(), y[rows].contiguous()


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """One step of one process (DDP averages the gradients inside backward())."""
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def train_single_process(steps: int, world: int = 4, seed: int = SEED
                         ) -> Dict[str, torch.Tensor]:
    """The reference: ``steps`` steps on the global batches in one process; the final
    weights (a state_dict)."""
    model = make_model(seed)
    opt = make_optimizer(model.parameters())
    for step in range(steps):
        x, y = global_batch(step, world, seed)
        train_step(model, opt, x, y)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_abs_diff(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two state_dicts of the model."""
    if set(a) != set(b):
        raise ValueError(f"different parameters: {sorted(a)} vs {sorted(b)}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# --- the same training driven from the controller (the tensor engine) ----------------------

PARAMETER_SHAPES = [(HIDDEN, IN_FEATURES), (HIDDEN,), (OUT_FEATURES, HIDDEN), (OUT_FEATURES,)]


def _batches_meta(steps: int, rank: torch.Tensor, world: int
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(steps, BATCH_PER_RANK, IN_FEATURES),
            torch.empty(steps, BATCH_PER_RANK, OUT_FEATURES))


def rank_batches_on(steps: int, rank: torch.Tensor, world: int
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """On a worker: its shards of steps 0..steps-1, stacked (``rank``: its 0-dim rank
    tensor)."""
    shards = [rank_batch(step, int(rank), world) for step in range(steps)]
    return torch.stack([x for x, _ in shards]), torch.stack([y for _, y in shards])


def _initial_meta() -> List[torch.Tensor]:
    return [torch.empty(shape) for shape in PARAMETER_SHAPES]


def initial_parameters() -> List[torch.Tensor]:
    """On a worker: the model's initial parameters, as make_model() makes them."""
    return [p.detach().clone() for p in make_model().parameters()]


def set_torch_threads(n: int) -> None:
    """On a worker: its torch's intra-op threads (torchrun's ranks get OMP_NUM_THREADS)."""
    torch.set_num_threads(n)


def train_from_controller(mesh: Any, steps: int, warmup: int = 1, dim: str = "gpus",
                          device: str = "cpu") -> Dict[str, Any]:
    """Trains ``warmup + steps`` steps data-parallel over ``dim`` of ``mesh`` from this
    process: ``{"step_s": [...], "loop_s", "final": [state_dict of every rank]}``. ``step_s``
    are the controller's times per timed step with a sync after each (the value of the last
    parameter read back); ``loop_s`` is the timed steps without syncs in between, up to one
    at the end."""
    world = dict(zip(mesh.extent.labels, mesh.extent.sizes))[dim]
    batches = podium.remote(rank_batches_on, propagate=_batches_meta)
    initial = podium.remote(initial_parameters, propagate=_initial_meta)
    threads = podium.remote(set_torch_threads, propagate=lambda n: None)
    with mesh.activate():
        threads(TORCH_THREADS)
        model = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN, device=device), nn.ReLU(),
                              nn.Linear(HIDDEN, OUT_FEATURES, device=device))
        names = [name for name, _ in model.named_parameters()]
        params = list(model.parameters())
        with torch.no_grad():
            for p, w in zip(params, initial()):
                p.copy_(w.to(device))
        opt = make_optimizer(params)
        rank = mesh.rank_tensor(dim)
        # Every rank makes its shards before the timed steps, as torchrun's ranks make theirs
        # outside their step timing.
        xs, ys = batches(warmup + 2 * steps, rank, world)

        sizes = [p.numel() for p in params]

        def step(s: int) -> None:
            x, y = xs[s], ys[s]
            loss = loss_fn(model(x.to(device)), y.to(device))
            # One all-reduce of all the gradients, as DDP's bucket: on 2 cores each collective
            # costs more in wake-ups than in bytes.
            grads = list(reversed(list(podium.grad_generator(loss, params))))
            flat = torch.cat([g.reshape(-1) for g in grads]).reduce_(dim, "avg")
            for p, g in zip(params, flat.split(sizes)):
                p.grad = g.view(p.shape)
            opt.step()

        def sync() -> None:
            podium.inspect(params[-1], **{dim: world - 1})

        for s in range(warmup):
            step(s)
        sync()
        step_s = []
        for s in range(warmup, warmup + steps):
            t0 = time.perf_counter()
            step(s)
            sync()
            step_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for s in range(warmup + steps, warmup + 2 * steps):
            step(s)
        sync()
        loop_s = time.perf_counter() - t0
        final = [{n: podium.inspect(p, **{dim: r}).cpu() for n, p in zip(names, params)}
                 for r in range(world)]
    return {"step_s": step_s, "loop_s": loop_s, "final": final, "trained_steps": warmup + 2 * steps}
