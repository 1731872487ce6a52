"""The controller's side of one root proc mesh: its workers, its mesh views, the command
batch, and the ids of remote values.

  TE-3 Commands are batched in the controller and sent only at a sync point (a fetch,
    leaving ``activate()``, leaving ``coalescing()``) or when the batch is full: each run of
    consecutive commands for one mesh view travels as ONE broadcast to that view's workers
    (the C++ cast tree fans it out), whatever the number of ranks.
  TE-5 A handle freed in the controller (garbage collected) adds a delete command for its id
    to the batch: the workers drop their values, nothing stays behind.
"""

from __future__ import annotations

import pickle
import uuid
import weakref
from typing import Any, Dict, List, Optional, Tuple

import cloudpickle

from podium._core import mesh as _cm
from podium._src.actor_mesh import ActorMesh
from podium._src.proc_mesh import ProcMesh

from podium.tensor._worker import Mailbox, TensorWorker, coordinates

# A batch is sent when it holds this many commands (TE-3); sync points send it earlier.
BATCH_LIMIT = 2048

SPAWN_TIMEOUT_S = 120.0  # bound on waiting for the engine's actors to start

# coalescing() depth (TE-12): no batch is sent at the limit while it is above 0.
hold = [0]


def _row_major(sizes: List[int]) -> List[int]:
    strides, n = [], 1
    for s in reversed(sizes):
        strides.append(n)
        n *= s
    return list(reversed(strides))


class View:
    """A view of the root mesh (the whole, or after slice/rename/split/flatten) on which tensors
    live. One object per distinct region of a client, so ``is`` compares meshes."""

    __slots__ = ("client", "proc_mesh", "labels", "sizes", "region", "_workers", "__weakref__")

    def __init__(self, client: "Client", proc_mesh: ProcMesh, region: tuple) -> None:
        self.client = client
        self.proc_mesh = proc_mesh
        self.region = region  # (labels, offset, sizes, strides) in root ranks
        self.labels: Tuple[str, ...] = tuple(region[0])
        self.sizes: Tuple[int, ...] = tuple(region[2])
        self._workers: Optional[ActorMesh[Any]] = None

    @property
    def workers(self) -> ActorMesh[Any]:
        """The TensorWorkers of this view's procs, as an ActorMesh of this view's shape."""
        if self._workers is None:
            c = self.client
            if tuple(self.region[0]) == tuple(c.root_region[0]) and list(self.region[1:]) == list(
                    c.root_region[1:]):
                self._workers = c.workers
            else:
                st = c.workers_state
                core = _cm.ActorMesh.from_state(st[0], st[1], st[2], st[3], st[4],
                                                self.region, st[6])
                self._workers = ActorMesh(TensorWorker, core, self.proc_mesh)
        return self._workers

    def base_ranks(self) -> List[int]:
        return list(self.proc_mesh._region.base_ranks())

    def root_rank(self, coords: Dict[str, int]) -> int:
        labels, offset, sizes, strides = self.region
        r = offset
        for i, label in enumerate(labels):
            c = coords[label]
            if not 0 <= c < sizes[i]:
                raise IndexError(f"coordinate {label}={c} is outside 0..{sizes[i] - 1}")
            r += c * strides[i]
        return r

    def coords_of(self, root_rank: int) -> Dict[str, int]:
        return coordinates(root_rank, self.region)

    def __repr__(self) -> str:
        return "Mesh(" + ", ".join(f"{k}={v}" for k, v in zip(self.labels, self.sizes)) + ")"


class Client:
    """One per root proc mesh that was activated: the workers and the batch (TE-3)."""

    def __init__(self, proc_mesh: ProcMesh) -> None:
        st = proc_mesh._core.state()
        labels, sizes = list(st[0]), list(st[1])
        self.root_region = (labels, 0, sizes, _row_major(sizes))
        region = proc_mesh._region.__getstate__()
        if tuple(region[0]) == tuple(labels) and list(region[1:]) == list(self.root_region[1:]):
            root = proc_mesh
        else:
            core = _cm.ProcMesh.from_state(labels, sizes, st[2], self.root_region, st[4])
            root = ProcMesh(core, proc_mesh._shared)
        self.root = root
        self.workers: ActorMesh[Any] = root.spawn("podium_tensor_engine", TensorWorker)
        self.mailboxes: ActorMesh[Any] = root.spawn("podium_tensor_mailbox", Mailbox)
        self.workers_state = self.workers._core.state()
        self.next_id = 1
        self.runs: List[Tuple[View, List[tuple]]] = []
        self.cur_view: Optional[View] = None
        self.cur: List[tuple] = []
        self.pending = 0
        self.deleted: List[Tuple[View, int]] = []
        self.views: Dict[tuple, View] = {}
        self.stream = "main"
        self.sent_batches = 0  # broadcasts made (tests of TE-3)
        self.closed = False
        self._mailboxes_ready = False
        self.root_view = self.view(root)
        self.append(self.root_view, ("peers", self.mailboxes))
        # Actors of these procs read the workers' values through this token (TE-20).
        self.token = uuid.uuid4().hex
        self.marks = 0
        self.append(self.root_view, ("register", self.token))

    def mailboxes_ready(self) -> None:
        """Waits (once) until every Mailbox actor of the root mesh is up (to_mesh)."""
        if not self._mailboxes_ready:
            self.mailboxes.initialized.get(timeout=SPAWN_TIMEOUT_S)
            self._mailboxes_ready = True

    def view(self, proc_mesh: ProcMesh) -> View:
        region = proc_mesh._region.__getstate__()
        key = (tuple(region[0]), region[1], tuple(region[2]), tuple(region[3]))
        v = self.views.get(key)
        if v is None:
            v = self.views[key] = View(self, proc_mesh, region)
        return v

    def new_id(self) -> int:
        rid = self.next_id
        self.next_id = rid + 1
        return rid

    def append(self, view: View, cmd: tuple) -> None:
        if view is not self.cur_view:
            self.cur = []
            self.cur_view = view
            self.runs.append((view, self.cur))
        self.cur.append(cmd)
        self.pending += 1
        if self.pending >= BATCH_LIMIT and not hold[0]:
            self.flush()

    def mark(self) -> int:
        """Sends the batch, ending with a mark every worker records once it has run what
        came before (TE-20); returns the mark's number."""
        self.marks += 1
        self.append(self.root_view, ("mark", self.marks))
        self.flush()
        return self.marks

    def set_stream(self, name: str) -> None:
        """Every worker switches to stream `name` before the next command."""
        if name != self.stream:
            self.stream = name
            self.append(self.root_view, ("stream", name))

    def freed(self, view: View, rid: int) -> None:
        """A handle of `view` was garbage collected (TE-5); may run in any thread."""
        if not self.closed:
            self.deleted.append((view, rid))

    def _drain_deletes(self) -> None:
        # At the end of the batch: a freed handle's id appears in no later command (TE-5).
        deleted, self.deleted = self.deleted, []
        by_view: Dict[View, List[int]] = {}
        for view, rid in deleted:
            by_view.setdefault(view, []).append(rid)
        for view, ids in by_view.items():
            if view is not self.cur_view:
                self.cur = []
                self.cur_view = view
                self.runs.append((view, self.cur))
            self.cur.append(("del", ids))
            self.pending += 1

    def flush(self) -> None:
        """Sends the batch: one broadcast per run of one view (TE-3)."""
        if self.deleted:
            self._drain_deletes()
        runs, self.runs = self.runs, []
        self.cur_view, self.cur, self.pending = None, [], 0
        for view, cmds in runs:
            try:
                payload = pickle.dumps(cmds, protocol=5)
            except Exception:  # a function defined in __main__, a lambda: by value
                payload = cloudpickle.dumps(cmds, protocol=5)
            view.workers.execute.broadcast(payload)
            self.sent_batches += 1


_CLIENTS: "weakref.WeakKeyDictionary[Any, Client]" = weakref.WeakKeyDictionary()


def client_of(proc_mesh: ProcMesh) -> Client:
    """The client of the procs of `proc_mesh` (any view of them), made at first use."""
    c = _CLIENTS.get(proc_mesh._shared)
    if c is None:
        c = _CLIENTS[proc_mesh._shared] = Client(proc_mesh)
    return c


def view_of(proc_mesh: ProcMesh) -> View:
    return client_of(proc_mesh).view(proc_mesh)


def all_clients() -> List[Client]:
    return list(_CLIENTS.values())
