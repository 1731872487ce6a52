"""Collectives along mesh dimensions, worker side (docs/collectives.md).

The tensor engine's worker calls ``Communicator.get().reduce(t, members=..., reduction=...,
scatter=..., inplace=...)`` for ``t.reduce(dims, ...)``; the controller computes ``members``
with ``members_along(mesh_view, dims, rank)`` for each rank (or the worker does, from the same
view) and checks the call with ``reduce_meta`` before any command leaves.

How a proc's Communicator is set up (for the engine)::

    store = podium.tensor._collectives.spawn_store()   # controller, once per engine / job
    # on every worker proc, once, before its first reduce:
    Communicator.configure(store, rank=GLOBAL_RANK, namespace=ENGINE_ID, timeout_s=60.0)

``store`` is an ActorMesh of ``CollectiveStore`` (one actor, on the controller's proc): it
pickles into endpoint arguments. ``rank`` is the proc's rank in the root proc mesh (the ranks
that ``members`` are made of). ``namespace`` keeps groups of two engines (two root meshes with
the same ranks) apart in one store. Without ``configure`` the Communicator finds the
controller's singleton store itself (``get_or_spawn_controller``), takes its rank from the
calling actor's proc and its namespace from that proc's root mesh (its first proc's
address); ``timeout_s=None`` takes ``collective_timeout`` of podium's config
(``podium.config.configure(collective_timeout="30s")``) as the controller has it when the
proc first needs it (60 s by default).

  CO-1 members_along(view, dims, rank) are the global ranks of the view that share rank's
    coordinates on every dimension not in dims, in row-major order of the dims (the mesh's
    order), rank included; a pure function of the view's labels, sizes, strides and offset.
  CO-2 reduce_meta raises ValueError for every call the collective would refuse: an unknown
    reduction, scatter whose first dimension is not the group's size (as Monarch's), bitwise
    reductions on non-integer dtypes, avg on integers, min/max/product on complex, inplace with
    scatter or stack. Its shape and dtype are the output's: scatter drops the first dimension
    (stack+scatter keeps the shape), stack adds a first dimension of the group's size.
  CO-3 A process group exists per (backend, namespace, members) and generation, built lazily
    on the first collective of its members and cached: only the members take part (no global
    init_process_group, no torchrun, no environment variables).
  CO-4 Rendezvous goes through the CollectiveStore actor over podium's authenticated control
    plane: no listening port is opened for it. gloo binds its pair connections to loopback when
    every member runs on one host, else to this host's name (or configure(hostname=)).
  CO-5 A collective never hangs: a member that does not arrive (dead, or never called) makes the
    others fail within the timeout (plus a grace of at most 5 s to learn who is missing) with a
    CollectiveError naming the group, the missing ranks where known, and the cause. A member
    that fails reports it in the store and closes its connections, so the others fail within
    about a second instead of at their timeout. The group is dropped; the next collective of the
    same members builds a new one.
  CO-6 A refused call (ValueError) sends nothing and leaves the Communicator serving.
  CO-9 A wait for store keys (rendezvous, torch's Store.get/wait, the check-in of survivors)
    is one call: the store keeps the caller's response port and answers it from the call that
    sets the last missing key, at once when all are set; nobody polls. A wait whose caller's
    bound passed is forgotten, unanswered, the next time the store is called.
"""

from __future__ import annotations

import datetime
import itertools
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from podium._src import config
from podium.actor import Actor, context, endpoint, get_or_spawn_controller

STORE_NAME = "podium.tensor.collectives.store"
_GRACE_S = 5.0  # at most this long, after a failure, to learn which members are missing
_CHECK_AFTER_S = 0.5  # a collective still running this long asks the store for failures...
_CHECK_EVERY_S = 0.2  # ... this often

REDUCTIONS = ("sum", "avg", "product", "min", "max", "stack", "band", "bor", "bxor")
_BITWISE = ("band", "bor", "bxor")


class PeerFailed(RuntimeError):
    """Another member reported that the collective failed there."""


class CollectiveError(RuntimeError):
    """A collective that failed on this member: names the group, this rank, the missing ranks
    where known, and the cause."""

    def __init__(self, message: str, group: Tuple[int, ...], rank: int,
                 missing: Optional[List[int]] = None) -> None:
        super().__init__(message)
        self.group = group
        self.rank = rank
        self.missing = missing

    def __reduce__(self):
        return (CollectiveError, (str(self), self.group, self.rank, self.missing))


# --- pure functions --------------------------------------------------------------------------


def _layout(shape: Any) -> Tuple[List[str], List[int], List[int], int]:
    """(labels, sizes, strides, offset) of a mesh, a C++ Region, or an object with those
    attributes."""
    region = getattr(shape, "_region", None)
    if region is None and hasattr(shape, "extent") and hasattr(shape, "strides"):
        region = shape
    if region is not None:
        e = region.extent
        return list(e.labels), list(e.sizes), list(region.strides), int(region.offset)
    labels = list(shape.labels)
    sizes = [int(s) for s in shape.sizes]
    strides = [int(s) for s in shape.strides]
    return labels, sizes, strides, int(getattr(shape, "offset", 0))


def _coords_of(rank: int, sizes: List[int], strides: List[int], offset: int
               ) -> Optional[List[int]]:
    """The coordinates of global ``rank`` in the view, None when it is not in it."""
    rem = rank - offset
    order = sorted(range(len(sizes)), key=lambda i: -strides[i])
    coords = [0] * len(sizes)
    for i in order:
        if sizes[i] > 1 and strides[i] > 0:
            coords[i] = min(max(rem // strides[i], 0), sizes[i] - 1)
            rem -= coords[i] * strides[i]
    if rem == 0:
        return coords
    # Strides that do not nest (not made by split/slice/rename of a row-major mesh): search.
    for c in itertools.product(*[range(s) for s in sizes]):
        if offset + sum(a * b for a, b in zip(c, strides)) == rank:
            return list(c)
    return None


def members_along(shape: Any, dims: "str | Sequence[str]", rank: int) -> Tuple[int, ...]:
    """The global ranks of ``shape`` (a mesh view) that reduce together with ``rank`` along
    ``dims`` (CO-1). ``dims`` empty: every dimension. KeyError for a dimension the view does
    not have, ValueError for a repeated one or a rank outside the view."""
    labels, sizes, strides, offset = _layout(shape)
    if isinstance(dims, str):
        dims = (dims,)
    dims = tuple(dims)
    if not dims:
        dims = tuple(labels)
    for d in dims:
        if d not in labels:
            raise KeyError(f"dim {d!r} not found in the mesh's dimensions {labels}")
    if len(set(dims)) != len(dims):
        raise ValueError(f"reducing the same dimension twice: {dims}")
    coords = _coords_of(int(rank), sizes, strides, offset)
    if coords is None:
        raise ValueError(f"rank {rank} is not in the mesh {dict(zip(labels, sizes))} "
                         f"(offset {offset}, strides {strides})")
    axes = [i for i, l in enumerate(labels) if l in dims]  # the mesh's order
    out = []
    for c in itertools.product(*[range(sizes[i]) for i in axes]):
        point = list(coords)
        for i, v in zip(axes, c):
            point[i] = v
        out.append(offset + sum(a * b for a, b in zip(point, strides)))
    return tuple(out)


def reduce_meta(shape: Sequence[int], dtype: Any, group_size: int, reduction: str,
                scatter: bool, inplace: bool = False, to_one: bool = False
                ) -> Tuple[tuple, Any]:
    """The output (shape, dtype) of reducing a tensor of ``shape`` and ``dtype`` over a group
    of ``group_size`` (``to_one``: to one member, Communicator.reduce's ``root``); ValueError
    for what the collective would refuse (CO-2)."""

    shape = tuple(int(s) for s in shape)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction!r} not supported, reductions are {REDUCTIONS}")
    if group_size < 1:
        raise ValueError(f"a group has at least one member, not {group_size}")
    if reduction in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"reduction {reduction!r} takes integer or bool tensors, not {dtype}")
    if reduction == "avg" and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"reduction 'avg' takes floating point tensors, not {dtype}")
    if reduction in ("min", "max", "product") and dtype.is_complex:
        raise ValueError(f"reduction {reduction!r} does not take complex tensors ({dtype})")
    if inplace and (scatter or reduction == "stack"):
        raise ValueError(f"reduction {reduction!r} with scatter={scatter} is not valid in place: "
                         f"the output size does not match the input size")
    if scatter and to_one:
        raise ValueError("scatter=True gives each member a part: it cannot reduce to one rank")
    if scatter:
        if not shape or shape[0] != group_size:
            raise ValueError(f"when scattering results the outermost dimension of a tensor of "
                             f"sizes {list(shape)} must match the group's size ({group_size})")
        return (shape if reduction == "stack" else shape[1:]), dtype
    if reduction == "stack":
        return (group_size,) + shape, dtype
    if dtype == torch.bool and reduction in ("sum", "product"):
        return shape, torch.int64  # as torch's own sum of bools
    return shape, dtype


# --- the store -------------------------------------------------------------------------------


class CollectiveStore(Actor):
    """The rendezvous key-value store of the collectives: one actor, on the controller's proc.
    It never blocks: a wait for keys not all set yet keeps the caller's response port and is
    answered by the call that sets the last of them (CO-9)."""

    def __init__(self) -> None:
        self._data: Dict[str, bytes] = {}
        # CO-9: the waits not answered yet: (keys, response port, monotonic deadline).
        self._waits: List[Tuple[List[str], Any, float]] = []

    def _answer_waits(self) -> None:
        """Answers every wait whose keys are all set now; forgets those past their deadline
        (their callers stopped waiting, TimeoutError)."""
        if not self._waits:
            return
        now = time.monotonic()
        left = []
        for keys, port, deadline in self._waits:
            if all(k in self._data for k in keys):
                port.send([self._data[k] for k in keys])
            elif now < deadline:
                left.append((keys, port, deadline))
        self._waits = left

    @endpoint(explicit_response_port=True)
    def wait_values(self, port: Any, keys: List[str], limit_s: float) -> None:
        """CO-9: answers with the values of every key once all are set: at once when they
        are, else from the call that sets the last one. The caller bounds its wait by
        ``limit_s``; a wait older than that is forgotten unanswered."""
        self._waits.append((list(keys), port, time.monotonic() + float(limit_s)))
        self._answer_waits()

    @endpoint
    def timeout(self) -> float:
        """podium config's collective_timeout, now (the store runs in the controller)."""

        return float(config.collective_timeout_s)

    @endpoint
    def set(self, key: str, value: bytes) -> None:
        self._data[key] = bytes(value)
        self._answer_waits()

    @endpoint
    def multi_set(self, keys: List[str], values: List[bytes]) -> None:
        for k, v in zip(keys, values):
            self._data[k] = bytes(v)
        self._answer_waits()

    @endpoint
    def get(self, keys: List[str]) -> Optional[List[bytes]]:
        """The values of every key, or None while one is missing."""
        if all(k in self._data for k in keys):
            return [self._data[k] for k in keys]
        return None

    @endpoint
    def present(self, keys: List[str]) -> List[bool]:
        return [k in self._data for k in keys]

    @endpoint
    def add(self, key: str, amount: int) -> int:
        value = int(self._data.get(key, b"0")) + int(amount)
        self._data[key] = str(value).encode()
        self._answer_waits()
        return value

    @endpoint
    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        current = self._data.get(key)
        if (current is None and not expected) or current == bytes(expected):
            self._data[key] = bytes(desired)
            self._answer_waits()
            return bytes(desired)
        return current if current is not None else bytes(expected)

    @endpoint
    def delete(self, key: str) -> bool:
        return self._data.pop(key, None) is not None

    @endpoint
    def num_keys(self) -> int:
        return len(self._data)


def spawn_store() -> Any:
    """The controller's singleton CollectiveStore (spawned by the first caller, from the
    controller or any actor): an ActorMesh that pickles into endpoint arguments."""

    return get_or_spawn_controller(STORE_NAME, CollectiveStore).get(timeout=60)


_STORE_CLASS: Optional[type] = None


def _torch_store_class() -> type:
    global _STORE_CLASS
    if _STORE_CLASS is None:
        _STORE_CLASS = _make_torch_store_class()
    return _STORE_CLASS


def _make_torch_store_class() -> type:

    class PodiumStore(dist.Store):
        """A torch.distributed Store whose keys live in a CollectiveStore actor (CO-4)."""

        def __init__(self, actor: Any, timeout_s: float) -> None:
            super().__init__()
            self._actor = actor
            self._timeout_s = timeout_s

        def _call(self, method: str, *args: Any) -> Any:
            return getattr(self._actor, method).call_one(*args).get(timeout=self._timeout_s)

        def set(self, key: str, value: Any) -> None:
            self._call("set", key, _bytes(value))

        def multi_set(self, keys: List[str], values: List[Any]) -> None:
            self._call("multi_set", list(keys), [_bytes(v) for v in values])

        def get(self, key: str) -> bytes:
            return self._wait_values([key])[0]

        def multi_get(self, keys: List[str]) -> List[bytes]:
            return self._wait_values(list(keys))

        def wait(self, keys: List[str], timeout: Any = None) -> None:
            self._wait_values(list(keys), timeout)

        def check(self, keys: List[str]) -> bool:
            return all(self._call("present", list(keys)))

        def add(self, key: str, amount: int) -> int:
            return self._call("add", key, int(amount))

        def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
            return self._call("compare_set", key, _bytes(expected), _bytes(desired))

        def delete_key(self, key: str) -> bool:
            return self._call("delete", key)

        def num_keys(self) -> int:
            return self._call("num_keys")

        def _wait_values(self, keys: List[str], timeout: Any = None) -> List[bytes]:
            limit = self._timeout_s
            if isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0:
                limit = min(limit, timeout.total_seconds())
            return wait_values(self._actor, keys, limit)

    return PodiumStore


def _bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def wait_values(actor: Any, keys: List[str], limit_s: float) -> List[bytes]:
    """The values of ``keys`` once all are in the store (CO-9: the store answers when the last
    one is set); TimeoutError after ``limit_s``."""
    try:
        return actor.wait_values.call_one(list(keys), limit_s).get(timeout=limit_s)
    except TimeoutError:
        raise TimeoutError(f"rendezvous: keys {keys} not set within {limit_s:g} s") from None


# --- the communicator ------------------------------------------------------------------------


def _default_namespace() -> str:
    """The address of the first proc of the calling actor's root proc mesh: one per root
    mesh, the same on all its procs."""

    try:
        state = context().actor_instance.proc_mesh.__reduce__()[1][0]
        return str(state[2][0][0])
    except Exception:
        return ""


class _Group:
    __slots__ = ("pg", "name", "prefix", "members", "size", "index", "seq", "backend", "store")

    def __init__(self, pg: Any, name: str, prefix: str, members: Tuple[int, ...], index: int,
                 backend: str) -> None:
        self.pg = pg
        self.name = name
        self.prefix = prefix
        self.members = members
        self.size = len(members)
        self.index = index
        self.seq = 0
        self.backend = backend
        self.store: Any = None


class Communicator:
    """One per worker proc (``Communicator.get()``): runs collectives over process groups
    it builds per member tuple (CO-3). Calls of one group come from one thread at a time, in
    the same order on every member; different groups may run on different threads. The
    default rank and namespace come from the calling actor's context: a caller on a thread of
    its own (a stream's) configures ``rank`` and ``namespace`` first."""

    _instance: Optional["Communicator"] = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self._store_actor: Any = None
        self._rank: Optional[int] = None
        self._namespace: Optional[str] = None
        self._timeout_s: Optional[float] = None
        self._hostname: Optional[str] = None
        self._groups: Dict[Tuple[str, Tuple[int, ...]], _Group] = {}
        self._generation: Dict[Tuple[str, Tuple[int, ...]], int] = {}
        self._building: Dict[Tuple[str, Tuple[int, ...]], threading.Lock] = {}
        self._mutex = threading.RLock()

    @classmethod
    def get(cls) -> "Communicator":
        with cls._lock:
            if cls._instance is None:
                cls._instance = Communicator()
            return cls._instance

    @classmethod
    def configure(cls, store: Any = None, *, rank: Optional[int] = None, namespace: Optional[str] = None,
                  timeout_s: Optional[float] = None, hostname: Optional[str] = None
                  ) -> "Communicator":
        """Sets this proc's store (a CollectiveStore ActorMesh), global rank, namespace,
        timeout and gloo hostname; each None keeps its default (see the module docstring).
        Groups built before keep their settings."""
        c = cls.get()
        with c._mutex:
            if store is not None:
                c._store_actor = store
            if rank is not None:
                c._rank = int(rank)
            if namespace is not None:
                c._namespace = str(namespace)
            if timeout_s is not None:
                if timeout_s <= 0:
                    raise ValueError(f"timeout_s must be positive, not {timeout_s}")
                c._timeout_s = float(timeout_s)
            if hostname is not None:
                c._hostname = hostname
        return c

    # -- settings, lazily ----------------------------------------------------------------------

    @property
    def rank(self) -> int:
        if self._rank is None:

            proc = context().actor_instance.proc
            self._rank = int(proc._region.offset)
        return self._rank

    def _store(self) -> Any:
        if self._store_actor is None:
            self._store_actor = spawn_store()
        return self._store_actor

    @property
    def namespace(self) -> str:
        if self._namespace is None:
            self._namespace = _default_namespace()
        return self._namespace

    @property
    def timeout_s(self) -> float:
        if self._timeout_s is None:
            self._timeout_s = float(self._store().timeout.call_one().get(timeout=60))
        return self._timeout_s

    # -- the collective ------------------------------------------------------------------------

    def reduce(self, t: Any, *, members: Tuple[int, ...], reduction: str, scatter: bool,
               inplace: bool, root: Optional[int] = None) -> Any:
        """Reduces ``t`` over ``members`` (global ranks, this proc's among them, the same on
        every member); returns the result, or ``t`` written over when ``inplace``.

        ``root`` (a member's global rank; for ``t.reduce(..., mesh=one_rank)``): only that
        member gets the result (a reduce, or a gather for ``stack``); the others get None
        (``t`` unchanged when ``inplace``)."""
        members = tuple(int(m) for m in members)
        if len(set(members)) != len(members):
            raise ValueError(f"members {members} repeat a rank")
        rank = self.rank
        if rank not in members:
            raise ValueError(f"this proc (rank {rank}) is not in the group {members}")
        if root is not None and int(root) not in members:
            raise ValueError(f"root {root} is not in the group {members}")
        out_shape, out_dtype = reduce_meta(tuple(t.shape), t.dtype, len(members), reduction,
                                           scatter, inplace, to_one=root is not None)
        if len(members) == 1:
            result = _local(t, reduction, scatter)
        else:
            group = self._group(members, "nccl" if t.device.type == "cuda" else "gloo")
            root_index = None if root is None else members.index(int(root))
            try:
                result = _run(group, t, reduction, scatter, inplace, root_index,
                              self._waiter(group))
                group.seq += 1
            except Exception as e:
                raise self._failed(group, e) from e
            if result is None:  # not the root
                return t if inplace else None
        result = result.to(out_dtype) if result.dtype != out_dtype else result
        assert tuple(result.shape) == tuple(out_shape), (result.shape, out_shape)
        if inplace:
            if result is not t:
                t.copy_(result)
            return t
        return result

    def _group(self, members: Tuple[int, ...], backend: str) -> _Group:
        """The cached group of ``members``, built on first use. Building one waits for the
        other members, so only callers of the same group wait for it: one lock per group
        (two streams building two groups in opposite orders on two procs cannot deadlock)."""
        key = (backend, members)
        with self._mutex:
            group = self._groups.get(key)
            if group is not None:
                return group
            building = self._building.setdefault(key, threading.Lock())
        with building:
            with self._mutex:
                group = self._groups.get(key)
                gen = self._generation.get(key, 0)
            if group is None:
                group = self._make_group(members, backend, gen)
                with self._mutex:
                    self._groups[key] = group
            return group

    def _make_group(self, members: Tuple[int, ...], backend: str, gen: int) -> _Group:
        name = f"{backend}{list(members)}#{gen}"
        prefix = f"{self.namespace}/{backend}/{'.'.join(map(str, members))}/{gen}"
        index = members.index(self.rank)
        store = self._store()
        timeout = self.timeout_s
        # Who is here (and on which host) before gloo starts: a member that never comes is
        # named (CO-5); one host for all binds gloo to loopback (CO-4).
        host = socket.gethostname()
        store.set.call_one(f"{prefix}/joined/{self.rank}", host.encode()).get(timeout=timeout)
        keys = [f"{prefix}/joined/{m}" for m in members]
        try:
            hosts = wait_values(store, keys, timeout)
        except TimeoutError:
            missing = self._missing(store, prefix + "/joined", members, 0.0)
            raise CollectiveError(
                f"collective group {name}: rank {self.rank} waited {timeout:g} s for ranks "
                f"{missing} to join (dead, or not calling this collective)", members,
                self.rank, missing) from None
        # The Python store must outlive the group: torch holds only its C++ half, and finds
        # its methods through the Python object (the group keeps it).
        tstore = _torch_store_class()(store, timeout)
        pstore = dist.PrefixStore(prefix + "/pg/", tstore)
        td = datetime.timedelta(seconds=timeout)
        try:
            if backend == "nccl":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = td
                pg = dist.ProcessGroupNCCL(pstore, index, len(members), opts)
            else:
                if self._hostname is not None:
                    bind = self._hostname
                elif all(h == host.encode() for h in hosts):
                    bind = "127.0.0.1"
                else:
                    bind = host
                opts = dist.ProcessGroupGloo._Options()
                opts._timeout = td
                opts._devices = [dist.ProcessGroupGloo.create_device(hostname=bind)]
                pg = dist.ProcessGroupGloo(pstore, index, len(members), opts)
        except Exception as e:
            raise CollectiveError(f"collective group {name}: rank {self.rank} could not "
                                  f"connect: {e}", members, self.rank) from e
        group = _Group(pg, name, prefix, members, index, backend)
        group.store = tstore
        return group

    def _waiter(self, group: _Group) -> Any:
        """wait(work): returns when the work is done, raises its error; raises TimeoutError
        after the timeout, or PeerFailed as soon as another member reported a failure of this
        call (CO-5: the members whose connections did not break learn it from the store)."""
        timeout = self.timeout_s

        def wait(work: Any) -> None:
            if group.backend != "gloo":
                # NCCL: wait() orders the current stream after the collective; a stuck
                # collective is NCCL's watchdog's (the group's timeout), not the CPU's.
                work.wait()
                return
            deadline = time.monotonic() + timeout
            piece = _CHECK_AFTER_S
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"not done within {timeout:g} s")
                try:
                    work.wait(datetime.timedelta(seconds=min(piece, left)))
                    return
                except RuntimeError as e:
                    if "timed out" not in str(e):
                        raise
                failed = self._reported_failed(group)
                if failed:
                    raise PeerFailed(f"ranks {failed} reported that this call failed")
                piece = _CHECK_EVERY_S

        return wait

    def _reported_failed(self, group: _Group) -> List[int]:
        prefix = f"{group.prefix}/failed/{group.seq}"
        try:
            present = self._store().present.call_one(
                [f"{prefix}/{m}" for m in group.members]).get(timeout=10)
        except Exception:
            return []
        return [m for m, p in zip(group.members, present) if p]

    def _missing(self, store: Any, prefix: str, members: Tuple[int, ...], grace: float
                 ) -> Optional[List[int]]:
        """The members whose ``prefix/RANK`` key is not in the store after ``grace`` s (None
        when the store cannot be asked)."""
        keys = [f"{prefix}/{m}" for m in members]
        if grace > 0:
            try:
                wait_values(store, keys, grace)  # CO-9: answered once all checked in
                return []
            except TimeoutError:
                pass
            except Exception:
                return None
        try:
            present = store.present.call_one(keys).get(timeout=10)
        except Exception:
            return None
        return [m for m, p in zip(members, present) if not p]

    def _failed(self, group: _Group, e: BaseException) -> CollectiveError:
        """Drops the group (the next call of these members builds a new one) and names who is
        missing: survivors check in under the call's sequence number (CO-5)."""
        with self._mutex:
            key = (group.backend, group.members)
            if self._groups.get(key) is group:
                del self._groups[key]
                self._generation[key] = self._generation.get(key, 0) + 1
        store = self._store()
        prefix = f"{group.prefix}/failed/{group.seq}"
        missing: Optional[List[int]] = None
        try:
            store.set.call_one(f"{prefix}/{self.rank}", b"1").get(timeout=10)
        except Exception:
            store = None
        try:  # closes this member's connections: the others' calls fail now, not at timeout
            group.pg.abort()
        except Exception:
            pass
        if store is not None:
            missing = self._missing(store, prefix, group.members, min(_GRACE_S, self.timeout_s))
        if missing:
            known = f"ranks {missing} did not take part (dead, or not calling it)"
        elif missing == []:
            known = "every member took part and failed"
        else:
            known = "the missing ranks are not known"
        return CollectiveError(f"collective #{group.seq} over group {group.name} failed on rank "
                               f"{self.rank}: {known}: {type(e).__name__}: {e}",
                               group.members, self.rank, missing)


_OPS = {"sum": "SUM", "avg": "SUM", "product": "PRODUCT", "min": "MIN", "max": "MAX",
        "band": "BAND", "bor": "BOR", "bxor": "BXOR"}


def _local(t: Any, reduction: str, scatter: bool) -> Any:
    """A group of one: the result without any communication."""
    if reduction == "stack":
        return t.clone() if scatter else t.unsqueeze(0).clone()
    out = t.clone()
    return out[0] if scatter else out


def _run(group: _Group, t: Any, reduction: str, scatter: bool, inplace: bool,
         root: Optional[int], wait: Any) -> Any:
    """The collective; ``root`` (an index in the group): only it gets a result (others
    None)."""
    pg, n = group.pg, group.size
    x = t.contiguous()
    if reduction == "stack":
        if root is not None:  # gather to one member
            opts = dist.GatherOptions()
            opts.rootRank = root
            parts = [torch.empty_like(x) for _ in range(n)] if group.index == root else []
            wait(pg.gather([parts] if parts else [], [x], opts))
            return torch.stack(parts) if parts else None
        if scatter:  # all-to-all: row j goes to member j, row i arrives from member i
            flat = torch.empty_like(x.reshape(-1))
            wait(pg.alltoall_base(flat, x.reshape(-1), [], []))
            return flat.view(x.shape)
        # a flat buffer: gloo's all-gather concatenates along the first dimension
        flat = torch.empty(n * x.numel(), dtype=x.dtype, device=x.device)
        wait(pg._allgather_base(flat, x.reshape(-1)))
        return flat.view((n,) + tuple(x.shape))
    if x.dtype == torch.bool and reduction in ("sum", "product"):
        x = x.to(torch.int64)
    op = getattr(dist.ReduceOp, _OPS[reduction])
    if root is not None:  # reduce to one member; the others' buffers are scratch
        buf = x if (x is not t or (inplace and group.index == root)) else x.clone()
        opts = dist.ReduceOptions()
        opts.rootRank = root
        opts.reduceOp = op
        wait(pg.reduce([buf], opts))
        if group.index != root:
            return None
        return buf.div_(n) if reduction == "avg" else buf
    if scatter and group.backend == "gloo":
        # gloo's reduce-scatter runs inside wait() and ignores wait's timeout, so it could
        # not be bounded (CO-5): all-reduce, then keep this member's row.
        full = x.clone() if x is t else x
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        wait(pg.allreduce([full], opts))
        out = full[group.index].clone()
    elif scatter:
        out = torch.empty(tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = op
        wait(pg._reduce_scatter_base(out.view(-1), x.reshape(-1), opts))
    else:
        # in place on a contiguous input: reduce t itself (no copy, as DDP's gradients want)
        out = x.clone() if (x is t and not inplace) else x
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        wait(pg.allreduce([out], opts))
    if reduction == "avg":
        out.div_(n)
    return out


__all__ = ["Communicator", "CollectiveError", "CollectiveStore", "members_along",
           "reduce_meta", "spawn_store", "REDUCTIONS"]
