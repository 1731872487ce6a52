"""The policy, the task and the GRPO loss of the RL example (examples/rl/main.py, docs/rl.md),
and the versioned weight slots that carry weights from the trainer to the generators.

This file is also installed in podium as ``podium._src.rl_core`` (what ``podium bench rl`` and
tests/python/test_rl.py run).

- The task: reverse a sequence of ``DIGITS`` digits. A prompt is the digits then ``SEP``; the
  completion is ``DIGITS`` tokens. Reward: the fraction of positions that hold the right digit
  (partial credit; 1.0 is an exact reversal), checked exactly by ``score``.
- The policy: a small causal transformer (``Policy``), its initial weights made from a seed.
- The loss (GRPO): a group of ``group`` completions per prompt; each completion's advantage is
  its reward minus the group's mean, over the group's standard deviation; the loss is PPO's
  clipped surrogate of the per-token probability ratio against the sampler's log-probabilities
  (a stale sample's ratio corrects for the weights it came from), averaged over tokens.

Weight slots (``WeightSlots``, the trainer side; ``VersionedWeights``, the generator side) and
the loop (``run``) keep the invariants of docs/rl.md, where they are stated:

  RL-1 (see docs/rl.md) version v is written into slot v % 2 only.
  RL-2 (see docs/rl.md) a generator samples from one whole, published version.
  RL-3 (see docs/rl.md) a train step uses samples at most max_staleness versions old.
  RL-4 (see docs/rl.md) every trainer rank holds the same weights after every step.
  RL-5 (see docs/rl.md) a failed generator replica is retried, replaced, and resynced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from podium.actor import Actor, current_rank, endpoint, this_host
from podium.rdma import RDMABuffer
from podium.tensor._collectives import Communicator, spawn_store

DIGITS = 4
SEP = 10
VOCAB = 11
SEQ = 2 * DIGITS + 1  # prompt (DIGITS + SEP) then the completion
TORCH_THREADS = 1


# --- the task -------------------------------------------------------------------------------


def make_prompts(n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` prompts: random digits then SEP, int64 (n, DIGITS + 1)."""
    digits = torch.randint(0, 10, (n, DIGITS), generator=gen)
    return torch.cat([digits, torch.full((n, 1), SEP)], dim=1)


def score(prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
    """Reward per completion: the fraction of positions equal to the reversed digits."""
    target = prompts[:, :DIGITS].flip(1)
    return (completions == target).float().mean(dim=1)


# --- the policy -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Policy(nn.Module):
    """A causal transformer over ``VOCAB`` tokens, at most ``SEQ`` long."""

    def __init__(self, d: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(SEQ, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
        h = self.tok(x) + self.pos(torch.arange(n))
        for b in self.blocks:
            h = b(h, mask)
        return self.head(self.ln(h))


def make_policy(seed: int) -> Policy:
    torch.manual_seed(seed)
    return Policy()


def flat_weights(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    i = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(flat[i:i + n].view_as(p))
            i += n


@torch.no_grad()
def sample(model: Policy, prompts: torch.Tensor, gen: torch.Generator
           ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Completions (n, DIGITS) sampled at temperature 1, and their tokens' log-probabilities."""
    seq = prompts
    logps = []
    for _ in range(DIGITS):
        logits = model(seq)[:, -1, :10]  # digits only
        lp = F.log_softmax(logits, dim=-1)
        tok = torch.multinomial(lp.exp(), 1, generator=gen)
        logps.append(lp.gather(1, tok))
        seq = torch.cat([seq, tok], dim=1)
    return seq[:, DIGITS + 1:], torch.cat(logps, dim=1)


def token_logps(model: Policy, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
    seq = torch.cat([prompts, completions], dim=1)
    logits = model(seq[:, :-1])[:, DIGITS:, :10]
    return F.log_softmax(logits, dim=-1).gather(2, completions.unsqueeze(2)).squeeze(2)


def advantages(rewards: torch.Tensor, group: int) -> torch.Tensor:
    """GRPO: each reward minus its group's mean, over the group's std (rows grouped in order)."""
    r = rewards.view(-1, group)
    return ((r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + 1e-4)).view(-1)


def grpo_loss(model: Policy, prompts: torch.Tensor, completions: torch.Tensor,
              old_logps: torch.Tensor, adv: torch.Tensor, clip: float = 0.2) -> torch.Tensor:
    new = token_logps(model, prompts, completions)
    ratio = (new - old_logps).exp()
    a = adv.unsqueeze(1)
    surrogate = torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
    return -surrogate.mean()


# --- versioned weight slots (RL-1, RL-2) -----------------------------------------------------

HEADER = 3  # int64 words: version, payload bytes, checksum


def payload_bytes(numel: int) -> int:
    """The float32 weights, zero-padded to whole 64-bit words."""
    return (numel * 4 + 7) // 8 * 8


def slot_bytes(numel: int) -> int:
    return HEADER * 8 + payload_bytes(numel)


_MIX = 0x9E3779B97F4A7C15  # odd: a version changes every bit of the sum
_WORDS = (1 << 64) - 1


def _crc(version: int, payload: Any) -> int:
    """The checksum of ``version`` and ``payload`` (bytes whose length is a multiple of 8): the
    wrapping sum of its 64-bit words plus ``version * _MIX``, kept to 63 bits. Not a CRC32
    (which costs a few times a same-host read of these bytes): a torn read mixes a newer
    version's prefix with an older one's rest, and fails it unless the changed words' sum
    happens to be 0 mod 2**64; not meant against tampering."""
    words = np.frombuffer(payload, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _crc_of_sum(version, int(words.sum(dtype=np.uint64)))


def _crc_of_sum(version: int, payload_sum: int) -> int:
    """``_crc`` from the payload's word sum (mod 2**64) instead of its bytes."""
    return ((payload_sum & _WORDS) + int(version) * _MIX) & ((1 << 63) - 1)


class WeightSlots:
    """Two slots of ``slot_bytes(numel)`` bytes (uint8 tensors; the trainer makes an RDMABuffer
    of each). ``publish(version, flat)`` writes slot version % 2 (RL-1)."""

    def __init__(self, numel: int) -> None:
        self.numel = numel
        self.slots = [torch.zeros(slot_bytes(numel), dtype=torch.uint8) for _ in range(2)]

    def publish(self, version: int, flat: torch.Tensor) -> int:
        """Writes ``flat`` as ``version``; returns its checksum."""
        slot = self.slots[version % 2]
        payload = flat.detach().to(torch.float32).contiguous().view(torch.uint8)
        head = slot[:HEADER * 8].view(torch.int64)
        head[0] = -1  # a reader that sees this mid-write fails the checksum anyway
        slot[HEADER * 8:HEADER * 8 + payload.numel()].copy_(payload)
        crc = _crc(version, slot[HEADER * 8:].numpy())
        head[1] = slot.numel() - HEADER * 8
        head[2] = crc
        head[0] = version
        return crc


def parse_slot(raw: torch.Tensor, total: Optional[int] = None) -> Tuple[int, bool, int]:
    """(version, whether the checksum matches, checksum) of a slot's bytes. ``total``: the
    word sum of the whole slot, as a summed read (``read_into(..., checksum=True)``) gives it
    for the bytes it read: the payload's sum is then that total less the header's 3 words, and
    the payload is not read again here (same checksum, no second pass over the bytes)."""
    b = raw.numpy()
    version, n, crc = b[:HEADER * 8].view(np.int64).tolist()
    if total is not None:
        return _check_total(version, n, crc, b.size, total)
    if version < 0 or n != b.size - HEADER * 8:
        return version, False, crc
    return version, _crc(version, b[HEADER * 8:]) == crc, crc


def _check_total(version: int, n: int, crc: int, nbytes: int, total: int
                 ) -> Tuple[int, bool, int]:
    """``parse_slot`` of a slot of ``nbytes`` bytes whose header is (version, n, crc) and whose
    words sum to ``total``."""
    if version < 0 or n != nbytes - HEADER * 8:
        return version, False, crc
    # The header's words as uint64 (mod 2**64: a negative int64 wraps the same way).
    return version, _crc_of_sum(version, total - (version + n + crc)) == crc, crc


class VersionedWeights:
    """The generator side (RL-2): the active weights (one version), a staging buffer, and the
    swap. ``active()`` gives (version, crc, flat) of one version; ``update`` reads a newer one."""

    def __init__(self, numel: int) -> None:
        self.numel = numel
        self._lock = threading.Lock()
        self._active = torch.zeros(slot_bytes(numel), dtype=torch.uint8)
        self._staging = torch.zeros(slot_bytes(numel), dtype=torch.uint8)
        # Each buffer's header as int64 words, sharing its memory: update reads 3 words.
        self._heads = {id(t): t[:HEADER * 8].numpy().view(np.int64)
                       for t in (self._active, self._staging)}
        self.version = -1
        self.crc = 0
        self.torn_reads = 0
        self.read_s = 0.0  # of the last update: the reads alone (the rest: checksum and swap)

    def active(self) -> Tuple[int, int, torch.Tensor]:
        with self._lock:
            return (self.version, self.crc,
                    self._active[HEADER * 8:HEADER * 8 + self.numel * 4].view(torch.float32))

    def update(self, want: int, slots: List[Any], tries: int = 20, timeout: float = 60.0) -> int:
        """Makes a version >= ``want`` active, read from ``slots`` (the trainer's two
        RDMABuffers, slot i holding versions == i mod 2). Returns the bytes read. Each read is
        a summed read: the data plane sums the slot's words as it completes the copy, and the
        checksum is checked from that sum, with no pass over the bytes here."""
        if self.version >= want:
            return 0
        moved, read_s, staging, first = 0, 0.0, self._staging, want % 2
        for attempt in range(tries):
            # The wanted version's slot first; after a torn read the other (newer) one too.
            for i in (first,) if attempt == 0 else (first, 1 - first):
                t0 = time.perf_counter()
                total = slots[i].read_into(staging, timeout=timeout,
                                           checksum=True).get(timeout=timeout)
                read_s += time.perf_counter() - t0
                moved += slots[i].size()
                version, ok, crc = _check_total(*self._heads[id(staging)].tolist(),
                                                staging.numel(), total)
                if ok and version >= want:
                    with self._lock:
                        self._active, self._staging = staging, self._active
                        self.version, self.crc = version, crc
                    self.read_s = read_s
                    return moved
                self.torn_reads += 0 if ok else 1
        self.read_s = read_s
        raise RuntimeError(f"no intact copy of weights version >= {want} after {tries} tries "
                           f"({self.torn_reads} torn)")


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _mean(xs: List[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


# --- the actors -----------------------------------------------------------------------------
# Defined here (not in main.py) so that `podium bench rl` and the tests run the same code.


def _crc_of(version: int, flat: torch.Tensor) -> int:
    """The checksum a slot holding ``flat`` as ``version`` has."""
    raw = torch.zeros(payload_bytes(flat.numel()), dtype=torch.uint8)
    raw[:flat.numel() * 4].copy_(flat.detach().to(torch.float32).contiguous().view(torch.uint8))
    return _crc(version, raw.numpy())


class Generator(Actor):
    """A generator replica: samples groups of completions with the newest weights it was told
    of, first bringing its weights up to that version over the data plane (RL-2)."""

    def __init__(self) -> None:
        torch.set_num_threads(TORCH_THREADS)
        self.model = Policy()
        self.weights = VersionedWeights(num_params(self.model))
        self.loaded = (-1, 0)  # (version, crc) of the weights in self.model

    @endpoint
    def generate(self, want: int, slots: List[Any], prompts: int, group: int, seed: int
                 ) -> Dict[str, Any]:
        """``prompts`` prompts made from ``seed``, ``group`` completions each, sampled with
        weights of version >= ``want``. The result names the version and the checksum of the very
        weights that sampled (recomputed from the model, not copied from the header)."""
        t0 = time.perf_counter()
        moved = self.weights.update(want, slots)
        sync_s = time.perf_counter() - t0 if moved else 0.0
        version, crc, flat = self.weights.active()
        if self.loaded[0] != version:
            load_flat(self.model, flat)
            self.loaded = (version, _crc_of(version, flat_weights(self.model)))
        t1 = time.perf_counter()
        gen = torch.Generator().manual_seed(seed)
        p = make_prompts(prompts, gen).repeat_interleave(group, 0)
        completions, logps = sample(self.model, p, gen)
        return {"prompts": p, "completions": completions, "logps": logps, "group": group,
                "version": self.loaded[0], "crc": self.loaded[1], "header_crc": crc,
                "sync_s": sync_s, "sync_read_s": self.weights.read_s if moved else 0.0,
                "sync_bytes": moved, "gen_s": time.perf_counter() - t1,
                "tokens": completions.numel(), "pid": os.getpid()}

    @endpoint
    def compare_sync(self, slots: List[Any], reps: int) -> List[Tuple[float, float, float]]:
        """``reps`` rounds of: a plain read of slot 0 into a buffer of this proc (the data
        plane's time for those bytes), then a full weight sync of the same bytes (the summed
        read, the header check, the swap; ``generate``'s path, into weights of its own).
        Seconds per round: (plain read, sync, the sync's read alone), interleaved so both see
        the same load."""
        dst = torch.zeros(slots[0].size(), dtype=torch.uint8)
        w = VersionedWeights(self.weights.numel)
        out = []
        for rep in range(reps):
            # Which of the two goes first alternates: the second of two back-to-back reads
            # tends to be the slower one (the copier thread is still winding down).
            for sync_first in ((False, True) if rep % 2 == 0 else (True, False)):
                if sync_first:
                    w.version = -1
                    t0 = time.perf_counter()
                    w.update(0, slots)
                    sync_s, sync_read_s = time.perf_counter() - t0, w.read_s
                else:
                    t0 = time.perf_counter()
                    slots[0].read_into(dst, timeout=60).get(timeout=60)
                    plain_s = time.perf_counter() - t0
            out.append((plain_s, sync_s, sync_read_s))
        return out

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Reward(Actor):
    """Exact checking: the fraction of correctly reversed positions (``score``)."""

    @endpoint
    def score(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        return score(prompts, completions)


class ReplayBuffer(Actor):
    """Scored batches, oldest first. ``take(min_version, n)`` drops those older than
    ``min_version`` (too stale to train on, RL-3) and gives the n oldest of the rest."""

    def __init__(self) -> None:
        self.batches: List[Dict[str, Any]] = []
        self.dropped = 0

    @endpoint
    def add(self, batch: Dict[str, Any]) -> int:
        self.batches.append(batch)
        return len(self.batches)

    @endpoint
    def take(self, min_version: int, n: int) -> Dict[str, Any]:
        """Drops the batches older than ``min_version``; then ``batches``: the n oldest of the
        rest (taken out), or None when fewer are left; ``size``: what remains; ``dropped``:
        how many were dropped so far."""
        keep = [b for b in self.batches if b["version"] >= min_version]
        self.dropped += len(self.batches) - len(keep)
        out = None
        if len(keep) >= n:
            out, keep = keep[:n], keep[n:]
        self.batches = keep
        return {"batches": out, "size": len(keep), "dropped": self.dropped}


class Trainer(Actor):
    """One data-parallel rank: trains on its share of a step's batches, averages gradients
    with the other ranks (podium.tensor._collectives), steps Adam. Rank 0 also publishes the
    weights of every version into its two slots (RL-1), which generators read."""

    def __init__(self, seed: int, lr: float, store: Any, namespace: str) -> None:
        torch.set_num_threads(TORCH_THREADS)
        Communicator.configure(store, namespace=namespace)
        self.index = current_rank().rank
        self.model = make_policy(seed)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.version = 0
        self.slots = WeightSlots(num_params(self.model)) if self.index == 0 else None
        self.crc = self.slots.publish(0, flat_weights(self.model)) if self.slots else 0

    @endpoint
    def setup(self) -> Tuple[int, Optional[List[RDMABuffer]], int]:
        """(global rank for the collectives, the two slots' RDMABuffers on rank 0, the checksum of
        version 0)."""
        bufs = [RDMABuffer(s) for s in self.slots.slots] if self.slots else None
        return Communicator.get().rank, bufs, self.crc

    @endpoint
    def train(self, members: List[int], batches: List[Dict[str, Any]]) -> Dict[str, Any]:
        t0 = time.perf_counter()
        mine = batches[self.index::len(members)]
        prompts = torch.cat([b["prompts"] for b in mine])
        completions = torch.cat([b["completions"] for b in mine])
        logps = torch.cat([b["logps"] for b in mine])
        adv = torch.cat([advantages(b["rewards"], b["group"]) for b in mine])
        loss = grpo_loss(self.model, prompts, completions, logps, adv)
        self.opt.zero_grad()
        loss.backward()
        params = [p for p in self.model.parameters()]
        grads = torch.cat([p.grad.reshape(-1) for p in params])
        Communicator.get().reduce(grads, members=tuple(members), reduction="avg",
                                  scatter=False, inplace=True)
        i = 0
        for p in params:
            p.grad.copy_(grads[i:i + p.numel()].view_as(p))
            i += p.numel()
        self.opt.step()
        self.version += 1
        t1 = time.perf_counter()
        flat = flat_weights(self.model)
        crc = _crc_of(self.version, flat)
        if self.slots is not None:
            published = self.slots.publish(self.version, flat)
            assert published == crc
        return {"loss": float(loss.detach()), "version": self.version, "crc": crc,
                "train_s": t1 - t0, "publish_s": time.perf_counter() - t1}


# --- the loop -------------------------------------------------------------------------------



@dataclasses.dataclass
class Config:
    steps: int = 150
    max_staleness: int = 1  # a step that makes version t+1 trains on samples of version >= t - this
    prompts: int = 8  # prompts per generate call
    group: int = 8  # completions per prompt (GRPO's group)
    batches_per_step: int = 2  # generate calls per train step (one per trainer rank)
    buffer_cap: int = 4  # generation pauses while the buffer holds this many batches
    lr: float = 3e-3
    seed: int = 0
    replicas: int = 2  # generator replicas
    trainers: int = 2  # data-parallel trainer procs


class Run:
    """One run of the loop (``run()``): the components, and what was measured per step."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.steps: List[Dict[str, Any]] = []  # one dict per train step
        self.samples: List[Tuple[int, int, int]] = []  # (version, crc, pid) of every batch
        self.published: Dict[int, int] = {}  # version -> crc the trainer published
        self.trainer_crcs: List[List[int]] = []  # per step, every rank's crc
        self.service: Any = None  # the generator Service, while the run lasts
        self.slots: List[Any] = []  # the trainer's two weight slots (RDMABuffers)
        self.sync_times: List[float] = []  # seconds of every weight sync that read bytes
        self.sync_read_times: List[float] = []  # of those, the reads alone
        self.dropped = 0
        self.startup_s = 0.0


async def _run(cfg: Config, on_step: Any, out: Run) -> None:
    if not 1 <= cfg.batches_per_step <= cfg.buffer_cap or cfg.max_staleness < 0:
        raise ValueError(f"need 1 <= batches_per_step <= buffer_cap and max_staleness >= 0: "
                         f"{cfg}")
    t_start = time.perf_counter()
    host = this_host()
    aux = host.spawn_procs(per_host={"procs": 1})
    trainer_procs = host.spawn_procs(per_host={"procs": cfg.trainers})
    svc = None
    try:
        store = spawn_store()
        trainer = trainer_procs.spawn("rl-trainer", Trainer, cfg.seed, cfg.lr, store,
                                      f"rl-{id(out)}-{time.time_ns()}")
        reward = aux.spawn("rl-reward", Reward)
        buffer = aux.spawn("rl-buffer", ReplayBuffer)
        svc = await Generator.options(procs=1, num_replicas=cfg.replicas,
                                      name="rl-generator").as_service()
        out.service = svc
        setup = [v for _, v in (await trainer.setup.call()).items()]
        members = [r for r, _, _ in setup]
        slots = out.slots = setup[0][1]
        out.published[0] = setup[0][2]
        out.startup_s = time.perf_counter() - t_start

        latest = 0
        stopping = False
        added = asyncio.Event()  # set by every add: the trainer looks again
        taken = asyncio.Event()  # set by every take: paused generation looks again
        in_buffer = 0  # batches in the buffer, as its last answer said
        pending = 0  # generate calls in flight (the cap counts them too)
        generated_tokens = 0
        seeds = iter(range(cfg.seed * 1_000_003, 1 << 62))
        errors: List[BaseException] = []

        async def generate_forever() -> None:
            nonlocal in_buffer, pending, generated_tokens
            try:
                while not stopping:
                    while in_buffer + pending >= cfg.buffer_cap and not stopping:
                        taken.clear()
                        await taken.wait()
                    if stopping:
                        return
                    pending += 1
                    try:
                        want = latest
                        res = await svc.generate.route(want, slots, cfg.prompts, cfg.group,
                                                       next(seeds))
                        res["rewards"] = await reward.score.call_one(res["prompts"],
                                                                     res["completions"])
                        out.samples.append((res["version"], res["crc"], res["pid"]))
                        generated_tokens += res["tokens"]
                        out_sync.append((res["sync_s"], res["sync_bytes"], res["sync_read_s"]))
                        in_buffer = await buffer.add.call_one(res)
                    finally:
                        pending -= 1
                    added.set()
            except BaseException as e:  # the trainer loop raises it
                errors.append(e)
                added.set()

        out_sync: List[Tuple[float, int, float]] = []
        workers = [asyncio.ensure_future(generate_forever()) for _ in range(cfg.replicas)]
        try:
            t_prev, tok_prev = time.perf_counter(), 0
            for t in range(cfg.steps):
                min_version = max(0, t - cfg.max_staleness)
                while True:
                    if errors:
                        raise errors[0]
                    added.clear()
                    took = await buffer.take.call_one(min_version, cfg.batches_per_step)
                    in_buffer, out.dropped = took["size"], took["dropped"]
                    taken.set()  # a failed take leaves fewer than batches_per_step: room
                    batches = took["batches"]
                    if batches is not None:
                        break
                    await added.wait()
                result = [v for _, v in (await trainer.train.call(members, batches)).items()]
                latest = result[0]["version"]
                out.published[latest] = result[0]["crc"]
                out.trainer_crcs.append([r["crc"] for r in result])
                now = time.perf_counter()
                syncs = [s for s, n, _ in out_sync if n]
                out.sync_times.extend(syncs)
                out.sync_read_times.extend(r for _, n, r in out_sync if n)
                out_sync.clear()
                rewards = torch.cat([b["rewards"] for b in batches])
                row = {"step": t + 1, "reward": float(rewards.mean()),
                       "exact": float((rewards == 1).float().mean()),
                       "loss": result[0]["loss"], "time_s": now - t_start,
                       "tokens_per_s": (generated_tokens - tok_prev) / (now - t_prev),
                       "tokens": generated_tokens - tok_prev, "step_s": now - t_prev,
                       "sync_ms": 1e3 * _mean(syncs) if syncs else math.nan,
                       "syncs": len(syncs), "sync_bytes": slots[0].size(),
                       "staleness": max(t - b["version"] for b in batches),
                       "versions": [b["version"] for b in batches],
                       "train_ms": 1e3 * result[0]["train_s"], "dropped": out.dropped}
                out.steps.append(row)
                t_prev, tok_prev = now, generated_tokens
                if on_step is not None:
                    on_step(row, out)
        finally:
            stopping = True
            taken.set()
            for w in workers:
                try:
                    await asyncio.wait_for(w, 60)
                except BaseException:
                    pass
    finally:
        if svc is not None:
            await svc.shutdown()
        trainer_procs.stop().get(timeout=60)
        aux.stop().get(timeout=60)


def run(cfg: Config, on_step: Any = None) -> Run:
    """Runs the loop for ``cfg.steps`` train steps; ``on_step(row, run)`` after each."""
    out = Run(cfg)
    asyncio.run(_run(cfg, on_step, out))
    return out
