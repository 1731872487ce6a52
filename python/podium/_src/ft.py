"""Fault-tolerant data-parallel training that keeps going (docs/fault_tolerance.md).

R replica groups, each a proc mesh of P procs (its own gloo group for the intra-group
all-reduce), train one model data-parallel. The controller keeps a per-step quorum: each step it
asks the live groups for their gradient, averages the gradients that arrived, and commits the
step to the groups that contributed. A group that fails (its proc killed, segfaulted, exited,
its host cut off) is dropped from the step it failed in; the others finish that step and keep
training; a replacement group is spawned in the background, reads the current weights and the
optimizer state of a healthy group over the data plane (RDMABuffer) and joins the quorum at a
step boundary. ``examples/ft/train.py`` is the command line; ``podium bench ft`` measures it.

  FT-1 Every step is committed exactly once, in order: the controller's step log has one entry
    per step 0..N-1, and a group applies step k's update only when its own next step is k, so
    an update is never applied twice nor skipped by a group that stays in the quorum.
  FT-2 A step's update is the mean of the gradients of the groups in its quorum (the groups
    whose gradient arrived), each the mean over its slot's batch: a step with Q < R groups is
    scaled by 1/Q, and replaying the step log in one process gives the same weights.
  FT-3 A group that fails during a step (a SupervisionError, a CollectiveError, or no answer
    within step_timeout_s) is dropped from that step's quorum, never waited for again, its
    procs stopped, and a replacement for its slot spawned on a background thread.
  FT-4 A replacement joins the quorum at the start of a step k, with the weights and the
    optimizer state of step k of a live group: it reads them over the data plane from that
    group's stage (copied there by its commit of k-1; commits stage while a slot is missing)
    while the live groups compute k, computes k from them, and counts in k's quorum only if
    the digest of what it read equals the digest of the donor's stage. Every member of a
    quorum holds identical weights and optimizer state.
  FT-5 Data is a function of (seed, step, slot, proc rank) alone, so a run with faults sees the
    fault-free run's batches, less those of the groups missing from a step.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import select
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

import podium.actor
from podium._core import mesh as _mesh
from podium.actor import Actor, current_rank, endpoint, this_host
from podium.rdma import RDMABuffer, get_rdma_backend
from podium.tensor._collectives import Communicator

FAULT_KINDS = ("sigkill", "segfault", "exit")
IN_FEATURES = 64
HIDDEN = 256
OUT_FEATURES = 8
BATCH_PER_PROC = 32
LR = 3e-3
# Procs of a replacement group fork from podium's zygote with these modules imported, and
# importing this module runs one step of the model (_warm): a replacement then starts in tens
# of milliseconds instead of seconds (docs/fault_tolerance.md).
ZYGOTE_PRELOAD = ("torch", "podium._src.ft")
# A replacement reads each live group's state once while it starts (FTWorker.ready) when the
# state is at most this large: a read of 4 MiB costs about what a link's first use does.
PRE_READ_BYTES = 4 << 20



# --- model, data, optimizer (the same in every group and in the reference) -------------------


def make_model(seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(),
                          nn.Linear(HIDDEN, OUT_FEATURES))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 / p.shape[-1] ** 0.5))
    return model


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=LR)


def batch(seed: int, step: int, slot: int, rank: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """The rows of proc ``rank`` of the group in ``slot`` at ``step`` (FT-5)."""
    tg = torch.Generator().manual_seed(seed + 1_000_003)
    w = torch.randn(IN_FEATURES, OUT_FEATURES, generator=tg) / IN_FEATURES ** 0.5
    g = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 131 + slot) * 17 + rank)
    x = torch.randn(BATCH_PER_PROC, IN_FEATURES, generator=g)
    y = torch.sin(2.0 * (x @ w)) + 0.05 * torch.randn(BATCH_PER_PROC, OUT_FEATURES, generator=g)
    return x, y


def gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, float]:
    """The flat gradient of the batch's mean loss, and the loss."""
    model.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]), loss.item()


def apply(model: nn.Module, opt: torch.optim.Optimizer, flat_grad: torch.Tensor) -> None:
    off = 0
    for p in model.parameters():
        n = p.numel()
        p.grad = flat_grad[off:off + n].view_as(p).clone()
        off += n
    opt.step()


def _warm() -> None:
    """One step of a scratch model, at import: the first Adam imports some 800 modules (3 s
    here), and a process's first backward and optimizer step cost several times a later one
    (a forked proc's first step of the model: 6 ms without this, 3 ms with). Imported in the
    zygote (ZYGOTE_PRELOAD), this is done once for every proc forked from it. On one thread: a pool of intra-op threads started before a fork leaves
    the forked procs waiting on threads they do not have at their first parallel op.

    In a build of torch with GPU support only the optimizer is made (its imports are most of
    the cost): there a backward starts autograd's device threads and an optimizer step
    initializes CUDA (Adam checks for graph capture), and a proc forked from a process that
    did either cannot train ("Unable to handle autograd's threading in combination with
    fork-based multiprocessing", "CUDA error: initialization error")."""
    gpu_build = torch.version.cuda is not None or torch.version.hip is not None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = nn.Linear(1, 1)
        opt = make_optimizer(model)
        if gpu_build:
            return
        F.mse_loss(model(torch.zeros(1, 1)), torch.zeros(1, 1)).backward()
        opt.step()
    finally:
        torch.set_num_threads(threads)


_warm()


def flat_state(model: nn.Module, opt: torch.optim.Optimizer) -> Tuple[torch.Tensor, list]:
    """Weights and optimizer state as one float32 tensor, and its layout."""
    parts, layout = [], []
    params = list(model.parameters())
    for i, p in enumerate(params):
        parts.append(p.detach().reshape(-1).float())
        layout.append(("p", i, "", tuple(p.shape)))
    for i, p in enumerate(params):
        for key in sorted(opt.state.get(p, {})):
            v = opt.state[p][key]
            t = v if torch.is_tensor(v) else torch.tensor(float(v))
            parts.append(t.detach().reshape(-1).float())
            layout.append(("s", i, key, tuple(t.shape)))
    return torch.cat(parts).contiguous(), layout


def load_flat_state(model: nn.Module, opt: torch.optim.Optimizer, flat: torch.Tensor,
                    layout: list) -> None:
    params = list(model.parameters())
    off = 0
    with torch.no_grad():
        for kind, i, key, shape in layout:
            n = 1
            for s in shape:
                n *= s
            t = flat[off:off + n].view(shape).clone()
            off += n
            if kind == "p":
                params[i].copy_(t)
            else:
                opt.state[params[i]][key] = t
    if off != flat.numel():
        raise ValueError(f"state of {flat.numel()} floats does not match its layout ({off})")


def digest_of(flat: torch.Tensor, step: int) -> str:
    return hashlib.sha256(flat.numpy().tobytes() + str(step).encode()).hexdigest()


def reference(seed: int, log: Sequence["StepRecord"]) -> Dict[str, torch.Tensor]:
    """Replays a step log in one process (FT-2): each step's update is the mean of the
    gradients of its quorum's slots. The final weights and optimizer state (flat), for
    comparison with a group's."""
    model = make_model(seed)
    opt = make_optimizer(model)
    for rec in log:
        grads = []
        for slot in rec.quorum:
            g = []
            for rank in range(rec.procs):
                gr, _ = gradient(model, *batch(seed, rec.step, slot, rank))
                g.append(gr)
            grads.append(torch.stack(g).mean(0) if len(g) > 1 else g[0])
        apply(model, opt, torch.stack(grads).sum(0) / len(grads))
    return {"flat": flat_state(model, opt)[0]}


# --- the group's actor -------------------------------------------------------------------------


def inject_fault(kind: str) -> None:
    """Ends this proc the way ``kind`` says (the fault injector)."""
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "segfault":
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    elif kind == "exit":
        os._exit(3)
    raise ValueError(f"unknown fault kind {kind!r}; kinds are {FAULT_KINDS}")


class FTWorker(Actor):
    """One proc of a replica group: its model, its optimizer, its step."""

    def __init__(self, slot: int, generation: int, procs: int, seed: int) -> None:
        torch.set_num_threads(1)
        self.slot, self.generation, self.procs, self.seed = slot, generation, procs, seed
        self.rank = current_rank().rank
        self.model = make_model(seed)
        self.opt = make_optimizer(self.model)
        self.step = 0
        self.applied: List[int] = []
        self._share: Optional[Tuple[torch.Tensor, RDMABuffer]] = None
        # Shares replaced and their drops in flight: a drop resolves once its readers have
        # confirmed the revocation of their leases, or once those ended (docs/data.md,
        # "Leases"), and the tensor stays alive until then.
        self._retired: List[Tuple[torch.Tensor, RDMABuffer, Any]] = []
        self._flat_grad = None
        self._warm_up()

    def _warm_up(self) -> None:
        """A process's first calls cost more than its later ones: the data plane starts on
        first use (a UCX context and worker, about 10 ms on 2 CPUs), torch's first backward
        and optimizer step, a first registration. A replacement makes them here, while it is
        spawned off the survivors' path, not in the step it joins, which every live group
        waits for (on 2 CPUs they took 10 to 20 ms of that step). On a scratch model: this
        group's own state is untouched."""
        get_rdma_backend()
        model = make_model(self.seed)
        opt = make_optimizer(model)
        apply(model, opt, gradient(model, *batch(self.seed, 0, self.slot, self.rank))[0])
        flat, layout = flat_state(model, opt)
        load_flat_state(model, opt, flat, layout)
        digest_of(flat, 0)
        # FT-4: the state a replacement reads, kept at this group's current step by the
        # commits made while a slot is missing (commit(stage=True)); registered once, here.
        self._layout = layout
        self._stage = torch.zeros_like(flat)
        self._stage_buf = RDMABuffer(self._stage.view(torch.uint8))
        self._staged: Optional[int] = None  # the step whose state _stage holds

    @endpoint
    def ready(self, donors: Sequence[RDMABuffer] = ()) -> Tuple[int, RDMABuffer]:
        """Its pid and its stage. ``donors``, the live groups' stages, are each read once
        here, so that the links to their procs are made before the step this group joins
        (1 to 3 ms of that step on 2 CPUs), where a state is small enough for a read to cost
        less than that (at most PRE_READ_BYTES). A donor that ended meanwhile is skipped:
        this read is only a warm-up, and the read of the step it joins is checked (FT-4)."""
        scratch = torch.empty_like(self._stage)
        for buf in donors if scratch.numel() * 4 <= PRE_READ_BYTES else ():
            try:
                buf.read_into(scratch.view(torch.uint8), timeout=5).get(timeout=5)
            except Exception:
                continue
        return os.getpid(), self._stage_buf

    @endpoint
    def compute(self, step: int, fault: Optional[str] = None, digest: bool = False
                ) -> Optional[tuple]:
        """The group's gradient of ``step`` and its loss (rank 0 returns them, the others
        None); with ``digest``, the digest of its stage as well (None unless the stage holds
        this step's state): a replacement's read of it is checked against that (FT-4)."""
        if step != self.step:
            raise RuntimeError(f"group {self.slot}.{self.generation} rank {self.rank} is at step "
                               f"{self.step}, asked to compute step {step}")
        if fault is not None and self.rank == 0:
            inject_fault(fault)
        g, loss = gradient(self.model, *batch(self.seed, step, self.slot, self.rank))
        if self.procs > 1:  # the intra-group all-reduce, the group's own gloo group
            comm = Communicator.get()
            both = torch.cat([g, torch.tensor([loss])])
            comm.reduce(both, members=tuple(range(self.procs)), reduction="avg",
                        scatter=False, inplace=True)
            g, loss = both[:-1], float(both[-1])
        if self.rank != 0:
            return None
        if digest:
            return g, loss, digest_of(self._stage, step) if self._staged == step else None
        return g, loss

    @endpoint
    def commit(self, step: int, mean_grad: torch.Tensor, stage: bool = False) -> int:
        """Applies step ``step``'s update once (FT-1); a repeated commit is refused. With
        ``stage``, rank 0 then copies the new state into its stage (FT-4)."""
        if step != self.step:
            raise RuntimeError(f"group {self.slot}.{self.generation} rank {self.rank} is at step "
                               f"{self.step}: refusing to apply step {step} (applied: "
                               f"{self.applied[-3:]})")
        apply(self.model, self.opt, mean_grad)
        self.applied.append(step)
        self.step += 1
        if stage and self.rank == 0:
            self._stage.copy_(flat_state(self.model, self.opt)[0])
            self._staged = self.step
        return self.step

    @endpoint
    def share_state(self) -> Tuple[RDMABuffer, list, int, str]:
        """Weights and optimizer state in a registered buffer, for a replacement to read."""
        flat, layout = flat_state(self.model, self.opt)
        self._retired = [r for r in self._retired if not r[2].done()]
        if self._share is not None:
            old, buf = self._share
            self._retired.append((old, buf, buf.drop()))
        self._share = (flat, RDMABuffer(flat.view(torch.uint8)))
        return self._share[1], layout, self.step, digest_of(flat, self.step)

    @endpoint
    def load_state(self, buf: RDMABuffer, layout: Optional[list], step: int) -> str:
        """Reads a donor's state (of ``step``; laid out as ``layout``, or as every group's
        after a step when None) over the data plane and takes it as its own (FT-4)."""
        n = buf.size() // 4
        flat = torch.empty(n, dtype=torch.float32)
        buf.read_into(flat.view(torch.uint8), timeout=60).get(timeout=60)
        load_flat_state(self.model, self.opt, flat, self._layout if layout is None else layout)
        self.step = step
        return self.digest_now()

    def digest_now(self) -> str:
        return digest_of(flat_state(self.model, self.opt)[0], self.step)

    @endpoint
    def digest(self) -> str:
        return self.digest_now()

    @endpoint
    def state(self) -> torch.Tensor:
        return flat_state(self.model, self.opt)[0]

    @endpoint
    def info(self) -> Dict[str, Any]:
        return {"pid": os.getpid(), "step": self.step, "applied": list(self.applied),
                "slot": self.slot, "generation": self.generation, "rank": self.rank}


# --- the controller ----------------------------------------------------------------------------


@dataclass
class StepRecord:
    step: int
    quorum: List[int]
    loss: float
    t: float
    procs: int = 1


@dataclass
class FaultRecord:
    step: int
    slot: int
    kind: str
    t_fault: float
    t_next_step: Optional[float] = None  # the survivors' commit of the step it hit
    t_rejoin: Optional[float] = None
    detected: str = ""


@dataclass
class Group:
    slot: int
    generation: int
    procs: Any
    actors: Any
    pid: int = 0
    ranks: List[Any] = field(default_factory=list)  # the actor of each proc, by rank
    stage: Any = None  # rank 0's stage (an RDMABuffer), what a replacement reads (FT-4)
    staged: Optional[int] = None  # the step whose state its stage holds, if current


def parse_inject(spec: Optional[str]) -> Tuple[int, List[str]]:
    """``every=K kinds=a,b`` (or ``every=K,kinds=a,b``) -> (K, kinds); K=0 means no faults."""
    if not spec:
        return 0, []
    every, kinds = 0, list(FAULT_KINDS)
    for part in spec.replace(" ", ";").split(";"):
        if not part:
            continue
        key, _, value = part.partition("=")
        if key == "every":
            every = int(value)
        elif key == "kinds":
            kinds = [k for k in value.split(",") if k]
        else:
            raise ValueError(f"--inject takes every=K kinds=a,b; not {part!r}")
    bad = [k for k in kinds if k not in FAULT_KINDS]
    if every < 1 or not kinds or bad:
        raise ValueError(f"--inject needs every=K (K >= 1) and kinds among {FAULT_KINDS}; "
                         f"got every={every}, kinds={kinds}")
    return every, kinds


def _cause(e: BaseException) -> str:
    """What a drop's log line says of `e`: a SupervisionError's cause ("its proc (pid N) was
    killed by signal SIGKILL (9)"), not its message, which names the call and the actor first
    and would be cut before the cause; its first line, at most 200 characters; for an
    ActorError, followed by what the remote call raised, said the same way."""
    text = getattr(e, "cause", None) or str(e) or repr(e)
    first = (text.splitlines() or [repr(e)])[0][:200]
    inner = getattr(e, "exception", None)  # an ActorError's: what the remote call raised
    if isinstance(inner, BaseException) and inner is not e:
        first += f": {type(inner).__name__}: {_cause(inner)}"
    return first


def local_groups(procs: int) -> Callable[[int, int], Any]:
    """Each group's proc mesh on this host."""
    return lambda slot, generation: this_host().spawn_procs(per_host={"gpus": procs})


class Trainer:
    """The controller's side: the quorum, the step log, faults, replacements."""

    def __init__(self, groups: int = 3, procs: int = 1, seed: int = 0,
                 step_timeout_s: float = 3.0, spawn_procs: Optional[Callable] = None,
                 inject: Optional[str] = None, log: Callable[[str], None] = print,
                 wait_s: float = 60.0) -> None:
        if groups < 1 or procs < 1:
            raise ValueError(f"groups and procs must be >= 1 (got {groups}, {procs})")
        self.R, self.P, self.seed = groups, procs, seed
        self.step_timeout_s, self.wait_s = step_timeout_s, wait_s
        self.spawn_procs = spawn_procs or local_groups(procs)
        self.every, self.kinds = parse_inject(inject)
        self.log = log
        self.live: Dict[int, Group] = {}
        self.steps: List[StepRecord] = []
        self.faults: List[FaultRecord] = []
        self.rejoins: List[Tuple[int, int, int, float]] = []  # (slot, generation, step, t)
        self.failures: List[Any] = []
        self.drops: List[Tuple[float, int, int, str]] = []  # (t, slot, generation, why)
        self._ready: List[Group] = []
        self._lock = threading.Lock()
        self._ready_cv = threading.Condition(self._lock)  # a replacement is ready
        self._threads: List[threading.Thread] = []
        self._jobs: List[Tuple[Callable[[], None], int]] = []
        self._gens = {s: 0 for s in range(groups)}
        self._victim = 0
        self._doomed: Dict[int, FaultRecord] = {}
        self.step = 0
        podium.actor.unhandled_fault_hook = self.failures.append  # handled here (FT-3)
        preload = [m for m in os.environ.get("PODIUM_ZYGOTE_PRELOAD", "").split(",") if m]
        os.environ["PODIUM_ZYGOTE_PRELOAD"] = ",".join(
            preload + [m for m in ZYGOTE_PRELOAD if m not in preload])  # read at first spawn

    # groups

    def _spawn(self, slot: int, generation: int) -> Group:
        procs = self.spawn_procs(slot, generation)
        actors = procs.spawn(f"ft_{slot}_{generation}", FTWorker, slot, generation, self.P,
                             self.seed)
        donors = [g.stage for g in list(self.live.values()) if g.stage is not None]
        pid, stage = list(actors.ready.call(donors).get(timeout=self.wait_s).values())[0]
        return Group(slot, generation, procs, actors, pid,
                     [actors.slice(gpus=r) for r in range(self.P)], stage)

    def start(self) -> None:
        out: Dict[int, Group] = {}
        errors: List[BaseException] = []

        def one(slot: int) -> None:
            try:
                out[slot] = self._spawn(slot, 0)
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=one, args=(s,)) for s in range(self.R)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.wait_s * 2)
        if errors or len(out) != self.R:
            raise RuntimeError(f"starting {self.R} groups failed: {errors}")
        self.live = out

    def _drop(self, g: Group, why: str, replace: bool = True) -> None:
        """FT-3: out of the quorum now; its procs stopped and a replacement made off-thread."""
        if self.live.get(g.slot) is g:
            del self.live[g.slot]
        self.drops.append((time.monotonic(), g.slot, g.generation, why))
        self.log(f"step {self.step}: group {g.slot} (generation {g.generation}, pid {g.pid}) "
                 f"dropped: {why}")

        def stop_it() -> None:
            try:
                g.procs.stop().get(timeout=10)
            except Exception:
                pass  # what is left of it is gone or unreachable; the runtime reaps it

        def replace_it() -> None:
            self._gens[g.slot] += 1
            try:
                new = self._spawn(g.slot, self._gens[g.slot])
            except Exception as e:
                self.log(f"replacing group {g.slot} failed: {e}")
                return
            with self._lock:
                self._ready.append(new)
                self._ready_cv.notify_all()

        # Started once the step is committed: forking procs now would slow the survivors'
        # step on a machine with few cores.
        self._jobs.extend((job, g.slot) for job in [stop_it] + ([replace_it] if replace else []))

    def _start_jobs(self) -> None:
        jobs, self._jobs = self._jobs, []
        for job, slot in jobs:
            t = threading.Thread(target=job, daemon=True, name=f"ft-{job.__name__}-{slot}")
            t.start()
            self._threads.append(t)

    def _take_ready(self) -> List[Group]:
        with self._lock:
            ready, self._ready = self._ready, []
        return ready

    def _put_back(self, groups: List[Group]) -> None:
        with self._lock:
            self._ready[:0] = groups

    def _shared_state(self) -> Optional[tuple]:
        """A live group's state, shared for replacements to read: (donor, buf, layout, step,
        digest), the live groups asked in turn; None when none could share."""
        for donor in list(self.live.values()):
            try:
                return (donor,) + tuple(donor.ranks[0].share_state.call_one().get(
                    timeout=self.wait_s))
            except Exception as e:
                self.log(f"step {self.step}: group {donor.slot} could not share its state: "
                         f"{type(e).__name__}: {_cause(e)}")
        return None

    def _joined(self, new: Group, got: Any, donor: Group, want: str) -> None:
        """FT-4: ``new`` read ``donor``'s state (its digests ``got``) and is live from now."""
        digests = set(got.values())
        if digests != {want}:
            raise RuntimeError(f"replacement {new.slot}.{new.generation} read state "
                               f"{digests} from group {donor.slot}, which has {want}")
        now = time.monotonic()
        self.live[new.slot] = new
        self.rejoins.append((new.slot, new.generation, self.step, now))
        for f in self.faults:
            if f.slot == new.slot and f.t_rejoin is None:
                f.t_rejoin = now
        self.log(f"step {self.step}: group {new.slot} (generation {new.generation}, pid "
                 f"{new.pid}) rejoined with the state of step {self.step}")

    def _admit(self) -> None:
        """FT-4 between steps (wait_rejoined): replacements read a live group's state and
        join. Within a run, run_step admits them while the live groups compute."""
        ready = self._take_ready()
        state = self._shared_state() if ready else None
        for new in ready:
            if state is None:
                self._drop(new, "could not fetch a live group's state")
                self._start_jobs()
                continue
            donor, buf, layout, step, want = state
            try:
                got = new.actors.load_state.call(buf, layout, step).get(timeout=self.wait_s)
            except Exception as e:
                self._drop(new, f"could not read group {donor.slot}'s state: "
                                f"{type(e).__name__}: {_cause(e)}")
                self._start_jobs()
                continue
            self._joined(new, got, donor, want)

    # steps

    def _fault_for(self, step: int) -> Optional[Tuple[int, str]]:
        """Every ``every`` steps, and only with every group live (else at the first step
        after the quorum is full again): one fault, the kinds in turn, the groups in turn."""
        if not self.every or step == 0 or len(self.live) < self.R or self.R < 2:
            return None
        last = self.faults[-1].step if self.faults else 0
        if step - last < self.every:
            return None
        slots = sorted(self.live)
        slot = slots[self._victim % len(slots)]
        kind = self.kinds[len(self.faults) % len(self.kinds)]
        self._victim += 1
        return slot, kind

    def _gather(self, pending: Dict[int, Tuple[Group, List[Any]]], deadline: float
                ) -> Dict[int, Tuple[torch.Tensor, float]]:
        """Each group's gradient (its last call: rank 0's compute), as its calls answer; a
        group with a failed call, or not done by ``deadline``, is dropped (FT-3). A joining
        group's calls start with its state's read, so that a failed read is the cause named."""
        grads: Dict[int, Tuple[torch.Tensor, float]] = {}
        # Woken by the calls' completions (an eventfd the C++ futures write), not by a poll.
        notifier = _mesh.Notifier()
        for _g, futs in pending.values():
            for f in futs:
                f._core.notify(notifier, 0)
        while pending:
            progressed = False
            for slot, (g, futs) in list(pending.items()):
                # Whether all are done is read first: a future may fail between two looks, so
                # the failure check runs after it (a failure found then drops the group).
                all_done = all(f.done() for f in futs)
                failed = next((f for f in futs if f.done() and f.exception(0) is not None), None)
                if failed is not None:
                    e = failed.exception(0)
                    self._drop(g, f"{type(e).__name__}: {_cause(e)}")
                elif all_done:
                    grads[slot] = futs[-1].get(0)
                else:
                    continue
                del pending[slot]
                progressed = True
            if pending and not progressed:
                left = deadline - time.monotonic()
                if left <= 0:
                    for g, _ in pending.values():
                        self._drop(g, f"no gradient within {self.step_timeout_s} s")
                    break
                select.select([notifier.fileno()], [], [], left)
                notifier.drain()
        return grads

    def run_step(self) -> StepRecord:
        step = self.step
        if not self.live:
            raise RuntimeError(f"step {step}: no live group left (every group failed)")
        # FT-4: replacements ready now join this step, reading the stage of a live group that
        # holds this step's state (staged by its last commit) while the live groups compute:
        # the step waits for that read, not for a round trip to the donor before it starts.
        joining = self._take_ready()
        donor = next((g for g in self.live.values() if g.staged == step), None)
        if joining and donor is None:  # no stage holds this step yet: the next step's will
            self._put_back(joining)
            joining = []
        fault = self._fault_for(step)
        pending: Dict[int, Tuple[Group, List[Any]]] = {}
        for slot, g in sorted(self.live.items()):
            kind = fault[1] if fault and fault[0] == slot else None
            if kind:
                self.faults.append(FaultRecord(step, slot, kind, time.monotonic()))
                self.log(f"step {step}: injecting {kind} into group {slot} (pid {g.pid})")
            # One call per proc: a proc's death fails its own call at once, while the group's
            # other procs may still wait in their all-reduce (FT-3). Rank 0's call is last: its
            # answer is the gradient.
            ask = bool(joining) and g is donor
            pending[slot] = (g, [r.compute.call_one(step, kind, ask) for r in reversed(g.ranks)])
        loads: Dict[int, Tuple[Group, Any]] = {}
        for new in joining:
            load = new.actors.load_state.call(donor.stage, None, step)
            loads[new.slot] = (new, load)
            pending[new.slot] = (new, [load] + [r.compute.call_one(step)
                                                for r in reversed(new.ranks)])
        grads = self._gather(pending, time.monotonic() + self.step_timeout_s)
        want = grads[donor.slot][2] if loads and donor.slot in grads else None
        for slot, (new, load) in loads.items():
            if slot not in grads:  # its read or its compute failed: dropped by _gather
                continue
            if want is None:  # the donor's state cannot be checked: a later step's will
                del grads[slot]
                self._put_back([new])
                continue
            self._joined(new, load.get(0), donor, want)
        if not grads:
            self._start_jobs()  # stops what is left of them
            raise RuntimeError(f"step {step}: no group returned its gradient")
        quorum = sorted(grads)
        mean = torch.stack([grads[s][0] for s in quorum]).sum(0) / len(quorum)  # FT-2
        stage = len(self.live) < self.R  # a replacement may join the next step (FT-4)
        commits = {s: (self.live[s], self.live[s].actors.commit.call(step, mean, stage))
                   for s in quorum}
        for slot, (g, fut) in commits.items():
            try:
                fut.get(timeout=max(self.step_timeout_s, 1.0))
                g.staged = step + 1 if stage else None
            except Exception as e:
                self._drop(g, f"commit failed: {type(e).__name__}: {_cause(e)}")
        now = time.monotonic()
        rec = StepRecord(step, quorum, sum(grads[s][1] for s in quorum) / len(quorum), now,
                         self.P)
        self.steps.append(rec)  # FT-1: once, in order
        self.step += 1
        for f in self.faults:
            if f.t_next_step is None:
                f.t_next_step = now
        self._start_jobs()
        return rec

    def run(self, steps: int, progress_every: int = 1) -> List[StepRecord]:
        t0 = time.monotonic()
        last: List[int] = []
        for _ in range(steps):
            rec = self.run_step()
            changed, last = rec.quorum != last, rec.quorum
            if progress_every and (rec.step % progress_every == 0 or changed):
                self.log(f"step {rec.step:4d}  loss {rec.loss:.5f}  quorum {rec.quorum}  "
                         f"{rec.step + 1} steps in {time.monotonic() - t0:.2f} s")
        return self.steps

    def wait_rejoined(self, timeout_s: float = 60.0) -> None:
        """Waits (bounded) until every slot is live again, admitting replacements."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._admit()
            if len(self.live) >= self.R:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"only groups {sorted(self.live)} of {self.R} live after "
                                   f"{timeout_s} s")
            with self._lock:  # woken when a replacement is ready to be admitted
                if not self._ready:
                    self._ready_cv.wait(left)

    def full_restart(self) -> float:
        """The reference: stop every group, spawn them all again, reload the last state from
        the controller's copy. Seconds it took."""
        t0 = time.monotonic()
        donor = next(iter(self.live.values()))
        buf, layout, step, want = donor.ranks[0].share_state.call_one().get(
            timeout=self.wait_s)
        saved = torch.empty(buf.size() // 4, dtype=torch.float32)
        buf.read_into(saved.view(torch.uint8)).get(timeout=self.wait_s)
        for g in list(self.live.values()):
            g.procs.stop().get(timeout=self.wait_s)
        self.live = {}
        self.start()
        mine = RDMABuffer(saved.view(torch.uint8))
        try:
            for g in self.live.values():
                got = set(g.actors.load_state.call(mine, layout, step).get(
                    timeout=self.wait_s).values())
                if got != {want}:
                    raise RuntimeError(f"full restart: group {g.slot} loaded {got}, not {want}")
        finally:
            mine.drop().get(timeout=self.wait_s)
        return time.monotonic() - t0

    def stop(self) -> None:
        self._start_jobs()
        for t in self._threads:
            t.join(self.wait_s)
        with self._lock:
            extra, self._ready = self._ready, []
        for g in list(self.live.values()) + extra:
            try:
                g.procs.stop().get(timeout=self.wait_s)
            except Exception as e:
                self.log(f"stopping group {g.slot}: {e}")
        self.live = {}

    def summary(self) -> Dict[str, Any]:
        return {"steps": [vars(s) for s in self.steps], "faults": [vars(f) for f in self.faults],
                "rejoins": self.rejoins}
