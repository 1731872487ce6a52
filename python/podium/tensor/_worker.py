"""The worker side of the tensor engine: one ``TensorWorker`` actor per proc of a root mesh.

It holds the proc's values, ``ref id -> torch.Tensor`` (or a ``Failure``), and runs the
commands the controller sends, in the order it sends them (docs/tensor.md):

  TE-1 A worker runs the commands of one controller in the order the controller issued
    them, batch after batch: a command sees every effect of the commands issued before it.
  TE-2 A command that raises stores a ``Failure`` (rank, host, the error, its traceback) in
    place of each of its outputs and of each tensor it mutates; a command that reads a
    failed value fails the same way, carrying the first failure; the worker lives on, and the
    next commands run.
  TE-9 A worker proc that dies fails every fetch of its values with SupervisionError, within
    supervision's bounds (no hang); the other procs of the mesh still answer.
"""

from __future__ import annotations

import importlib
import os
import pickle
import socket
import threading
import traceback
from typing import Any, Dict, List, Optional, Tuple

import torch

from podium._src.context import current_rank
from podium._src.errors import ActorError
from podium._src.endpoint import Actor, endpoint
from podium._src.rdma import RDMABuffer


class Ref:
    """A handle's place in a command: the worker reads ``values[id]``."""

    __slots__ = ("id",)

    def __init__(self, id: int) -> None:
        self.id = id

    def __reduce__(self):
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id})"


class Failure:
    """A value that could not be computed: where and why (TE-2)."""

    __slots__ = ("rank", "host", "what", "remote_traceback", "exception")

    def __init__(self, rank: int, host: str, what: str, remote_traceback: str,
                 exception: Optional[BaseException]) -> None:
        self.rank = rank
        self.host = host
        self.what = what
        self.remote_traceback = remote_traceback
        self.exception = exception

    def __reduce__(self):
        return (Failure, (self.rank, self.host, self.what, self.remote_traceback,
                          self.exception))


class RemoteException(ActorError):
    """A command failed on a worker (Monarch's ``monarch.common.invocation.RemoteException``):
    ``.exception`` is the original error (when it could travel), ``.rank`` and ``.host`` say
    where, and the message carries the remote traceback. The workers live on."""

    def __init__(self, failure: Failure,
                 message: str = "A remote function has failed asynchronously.") -> None:
        text = (f"{message}\nrank {failure.rank} on host {failure.host}: {failure.what}\n"
                f"Traceback of where the remote function failed on worker (most recent call "
                f"last):\n{failure.remote_traceback}")
        exc = failure.exception if failure.exception is not None else RuntimeError(failure.what)
        super().__init__(exc, text, failure.remote_traceback)
        self.rank = failure.rank
        self.host = failure.host

    def __str__(self) -> str:
        return self.message


class _Poisoned(Exception):
    """An input of a command is a Failure: its outputs carry that Failure."""

    def __init__(self, failure: Failure) -> None:
        self.failure = failure


_OPS: Dict[str, Any] = {}
_BY_VALUE: Dict[bytes, Any] = {}


def resolve_op(name: str) -> Any:
    """``"aten::add.Tensor"`` -> torch.ops.aten.add.Tensor (cached)."""
    op = _OPS.get(name)
    if op is None:
        ns, rest = name.split("::", 1)
        base, _, overload = rest.partition(".")
        op = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
        _OPS[name] = op
    return op


def resolve_function(path: str) -> Any:
    """``"pkg.mod.fn"``, ``"pkg.mod.Cls.fn"`` or ``"pkg.mod:Cls.fn"`` -> the function (the
    longest importable prefix is the module)."""
    if ":" in path:
        module, qual = path.split(":", 1)
        parts = [module, *qual.split(".")]
        obj: Any = importlib.import_module(module)
        for part in parts[1:]:
            obj = getattr(obj, part)
        return obj
    names = path.split(".")
    for cut in range(len(names) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(names[:cut]))
        except ModuleNotFoundError:
            continue
        for part in names[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ValueError(f"cannot import a function from {path!r}")


def coordinates(rank: int, region: tuple) -> Dict[str, int]:
    """The coordinates of root rank ``rank`` in a region state (labels, offset, sizes, strides)."""
    labels, offset, sizes, strides = region
    pos = rank - offset
    coords: Dict[str, int] = {}
    for i in sorted(range(len(labels)), key=lambda i: -strides[i]):
        c = pos // strides[i] if strides[i] else 0
        coords[labels[i]] = c
        pos -= c * strides[i]
    return coords


class TensorWorker(Actor):
    """One per proc of the mesh a controller activated first; see the module docstring."""

    _podium_internal = True  # it ends with its procs; a dead proc fails fetches (TE-9)

    def __init__(self) -> None:
        self.values: Dict[int, Any] = {}
        self.rank = current_rank().rank
        self.host = socket.gethostname()
        self.streams: Dict[str, Any] = {}
        self.stream_ctx: Any = None
        self.peers: Any = None
        self.token: Optional[str] = None
        self.mark = 0  # the last mark command run (TE-20)
        self.rref_specs: Dict[int, Tuple[bool, Any]] = {}  # first id -> this proc's result

    # --- commands ---------------------------------------------------------------------------
    @endpoint
    def execute(self, payload: bytes) -> None:
        values = self.values
        for cmd in pickle.loads(payload):
            try:
                if cmd[0] == "op":  # the hot path, inline: flat arguments, tensor results
                    _, name, out_ids, args, kwargs, _mutated = cmd
                    op = _OPS.get(name) or resolve_op(name)
                    flat_args = []
                    for a in args:
                        if type(a) is Ref:
                            a = values[a.id]
                            if type(a) is Failure:
                                raise _Poisoned(a)
                        elif type(a) is list or type(a) is tuple:
                            a = self._resolve(a)
                        flat_args.append(a)
                    out = op(*flat_args, **self._resolve(kwargs)) if kwargs else op(*flat_args)
                    if type(out) is torch.Tensor and len(out_ids) == 1:
                        values[out_ids[0]] = out
                    else:
                        self._store(out_ids, out)
                else:
                    getattr(self, "_c_" + cmd[0])(*cmd[1:])
            except _Poisoned as p:
                self._poison(cmd, p.failure)
            except Exception as e:  # the user's op or function raised: its outputs fail (TE-2)
                self._poison(cmd, self._failure(cmd, e))

    def _failure(self, cmd: tuple, e: BaseException) -> Failure:
        try:
            pickle.dumps(e)
            exc: Optional[BaseException] = e
        except Exception:
            exc = None
        what = f"{type(e).__name__}: {e}"
        return Failure(self.rank, self.host, f"{cmd[0]} {_name(cmd)} failed: {what}",
                       "".join(traceback.format_exception(type(e), e, e.__traceback__)), exc)

    def _poison(self, cmd: tuple, failure: Failure) -> None:
        for rid in _outputs(cmd):
            self.values[rid] = failure

    def _get(self, ref: Ref) -> Any:
        v = self.values[ref.id]
        if type(v) is Failure:
            raise _Poisoned(v)
        return v

    def _resolve(self, x: Any) -> Any:
        t = type(x)
        if t is Ref:
            return self._get(x)
        if t is list or t is tuple:
            return t(self._resolve(v) for v in x)
        if t is dict:
            return {k: self._resolve(v) for k, v in x.items()}
        return x

    def _store(self, out_ids: List[int], result: Any) -> None:
        flat: List[Any] = []
        _flatten(result, flat)
        for rid, value in zip(out_ids, flat):
            self.values[rid] = value

    def _c_op(self, name: str, out_ids: List[int], args: tuple, kwargs: dict,
              mutated: List[int]) -> None:
        op = resolve_op(name)
        self._store(out_ids, op(*self._resolve(args), **self._resolve(kwargs)))

    def _c_call(self, fn: Any, out_ids: List[int], args: tuple, kwargs: dict) -> None:
        self._store(out_ids, _function(fn)(*self._resolve(args), **self._resolve(kwargs)))

    def _c_lift(self, out_id: int, value: Any) -> None:
        self.values[out_id] = value

    def _c_rank(self, out_id: int, region: tuple, dims: List[str]) -> None:
        coords = coordinates(self.rank, region)
        labels, _, sizes, _ = region
        r = 0
        for d in dims:
            r = r * sizes[labels.index(d)] + coords[d]
        self.values[out_id] = torch.full((), r, dtype=torch.long)

    def _c_alias(self, out_id: int, src: Ref, src_stream: str = "main",
                 dst_stream: str = "main") -> None:
        """A borrow (TE-11): the same value, used on `dst_stream` after what `src_stream` has
        queued so far (on GPU; one order on CPU)."""
        self._wait(dst_stream, src_stream)
        self.values[out_id] = self._get(src)

    def _c_wait(self, waiter: str, waited: str) -> None:
        """A dropped borrow: `waiter` (the owner's stream) runs after `waited`'s work so far."""
        self._wait(waiter, waited)

    def _wait(self, waiter: str, waited: str) -> None:
        if waiter != waited and torch.cuda.is_available():
            self._cuda_stream(waiter).wait_stream(self._cuda_stream(waited))

    def _cuda_stream(self, name: str) -> Any:
        if name == "main":
            return torch.cuda.default_stream()
        s = self.streams.get(name)
        if s is None:
            s = self.streams[name] = torch.cuda.Stream()
        return s

    def _c_del(self, ids: List[int]) -> None:
        for rid in ids:
            self.values.pop(rid, None)

    def _c_stream(self, name: str) -> None:
        # CUDA work of a stream runs on a torch.cuda.Stream of that name; on CPU one order.
        if self.stream_ctx is not None:
            self.stream_ctx.__exit__(None, None, None)
            self.stream_ctx = None
        if name != "main" and torch.cuda.is_available():
            self.stream_ctx = torch.cuda.stream(self._cuda_stream(name))
            self.stream_ctx.__enter__()

    # --- actors (TE-19, TE-20) ----------------------------------------------------------------
    def _c_register(self, token: str) -> None:
        self.token = token
        with _LOCAL_CV:
            _LOCAL[token] = self

    def _c_mark(self, seq: int) -> None:
        with _LOCAL_CV:
            self.mark = seq
            _LOCAL_CV.notify_all()

    def _c_actor(self, mesh: Any, name: str, out_ids: List[int], args: tuple, kwargs: dict,
                 region: tuple, report: Optional[int]) -> None:
        """Calls this proc's actor of `mesh` (endpoint.rref, TE-19) and keeps its result.
        Handles among the arguments travel as references to this worker's values, read by
        the actor while this command waits (TE-20)."""
        try:
            for ref in _refs((args, kwargs)):
                self._get(ref)  # a failed input fails the call here (TE-2)
            local = _as_local(self.token, (args, kwargs))
            actor = mesh.slice(**coordinates(self.rank, region)) if region[0] else mesh
            out = getattr(actor, name).call_one(*local[0], **local[1]).get(
                timeout=ACTOR_CALL_TIMEOUT_S)
            flat: List[Any] = []
            _flatten(out, flat)
            if len(flat) > len(out_ids):
                raise ValueError(f"{name} returned {len(flat)} tensors; rref takes at most "
                                 f"{len(out_ids)}")
            self._store(out_ids, out)
        except _Poisoned as p:
            if report == self.rank:
                self.rref_specs[out_ids[0]] = (False, p.failure)
            raise
        except Exception as e:
            if report == self.rank:
                self.rref_specs[out_ids[0]] = (False, self._failure(("actor", name), e))
            raise
        if report == self.rank:
            keys: List[tuple] = []
            self.rref_specs[out_ids[0]] = (True, (_structure(out, keys), keys))

    @endpoint
    def reached(self) -> int:
        """The last mark run: a message that follows the batch that carried it (TE-20)."""
        return self.mark

    @endpoint
    def rref_spec(self, first_id: int) -> Tuple[bool, Any]:
        """The structure and metadata of the result of the rref whose outputs start at
        `first_id` on this proc, or its Failure (TE-19)."""
        return self.rref_specs.pop(first_id)

    def _c_collective(self, fn: Any, out_ids: List[int], args: tuple) -> None:
        self._store(out_ids, fn(self, *self._resolve(args)))

    # --- fetching ---------------------------------------------------------------------------
    @endpoint
    def probe(self, payload: bytes) -> Tuple[bool, Any]:
        """Runs a remote function on this proc's values WITHOUT keeping its result, and returns
        the result's structure and metadata (remote(propagate="inspect"), TE-13); or the
        Failure."""
        fn, args, kwargs = pickle.loads(payload)
        try:
            out = _function(fn)(*self._resolve(args), **self._resolve(kwargs))
        except _Poisoned as p:
            return False, p.failure
        except Exception as e:
            return False, self._failure(("call", fn), e)
        keys: List[tuple] = []
        return True, (_structure(out, keys), keys)

    @endpoint
    def fetch(self, ids: List[int]) -> List[Tuple[bool, Any]]:
        """Each value on CPU, or its Failure (TE-4)."""
        out: List[Tuple[bool, Any]] = []
        for rid in ids:
            v = self.values.get(rid)
            if type(v) is Failure:
                out.append((False, v))
            elif v is None:
                out.append((False, Failure(self.rank, self.host, f"no value {rid} here", "",
                                           None)))
            else:
                out.append((True, v.detach().to("cpu", copy=True)))
        return out

    @endpoint
    def count(self) -> int:
        """How many values this worker holds (tests of freeing, TE-5)."""
        return len(self.values)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    # --- moving between meshes (to_mesh, TE-16) ------------------------------------------------
    def _c_peers(self, peers: Any) -> None:
        self.peers = peers  # the Mailbox actors of the root mesh

    def _c_send(self, src: Ref, key: int, src_region: tuple, dst_region: tuple,
                large: int, dest_peers: Any = None) -> None:
        """Sends this proc's value to each proc of dst_region whose coordinates match ours on
        the dimensions both have (every proc along the others: a broadcast). `dest_peers`:
        the Mailboxes of the destination's root mesh when it is another one."""
        peers = self.peers if dest_peers is None else dest_peers
        mine = coordinates(self.rank, src_region)
        v = self.values.get(src.id)
        for dest in _matching(mine, dst_region):
            if type(v) is Failure or v is None:
                msg: Any = v if v is not None else Failure(
                    self.rank, self.host, f"to_mesh: no value {src.id} here", "", None)
            else:
                value = v.detach()
                if value.numel() * value.element_size() >= large and value.device.type == "cpu":
                    flat = value.contiguous().view(-1).view(torch.uint8)
                    buf = RDMABuffer._for_one_read(flat)  # DA-38: read once, by dest
                    with _MAIL_CV:
                        _EXPOSED[(key, dest)] = (buf, flat)
                    msg = ("rdma", buf, self.rank, tuple(value.shape), value.dtype, flat.numel(),
                           self.peers, os.getpid())
                else:
                    msg = ("value", value.to("cpu").contiguous().clone(), value.device)
            if dest == self.rank and dest_peers is None:
                _deliver((key, dest), msg)
            else:
                peers.slice(**_root_point(peers, dest)).deliver.broadcast((key, dest), msg)

    def _c_recv(self, out_id: int, key: int, timeout: float) -> None:
        mail = (key, self.rank)
        with _MAIL_CV:
            if not _MAIL_CV.wait_for(lambda: mail in _MAILBOX, timeout):
                raise TimeoutError(f"to_mesh: no value arrived for transfer {key} within "
                                   f"{timeout} s")
            got = _MAILBOX.pop(mail)
        if type(got) is Failure:
            raise _Poisoned(got)
        if got[0] == "value":
            self.values[out_id] = got[1].to(got[2])
            return
        _, buf, src_rank, shape, dtype, nbytes, src_peers, src_pid = got
        dst = torch.empty(nbytes, dtype=torch.uint8)
        try:
            buf.read_into(dst, timeout=timeout).get(timeout=timeout + 5)
        finally:
            if src_pid == os.getpid():
                _release(mail)
            else:
                src_peers.slice(**_root_point(src_peers, src_rank)).release.broadcast(mail)
        self.values[out_id] = dst.view(dtype).view(shape)


# The workers of this process by client token, for the actors that read their values (TE-20).
_LOCAL: Dict[str, "TensorWorker"] = {}
_LOCAL_CV = threading.Condition()
ACTOR_CALL_TIMEOUT_S = 3600.0  # bound on an rref's endpoint call
LOCAL_WAIT_TIMEOUT_S = 300.0  # bound on an actor waiting for the commands before its call


def local_value(token: str, rid: int, seq: Optional[int]) -> Any:
    """Unpickled in an actor: this proc's value `rid`, once the worker has run the commands
    up to mark `seq` (None: the worker is waiting in an rref command, the value is ready).
    A failed value raises RemoteException (TE-20)."""
    with _LOCAL_CV:
        ok = _LOCAL_CV.wait_for(
            lambda: token in _LOCAL and (seq is None or _LOCAL[token].mark >= seq),
            LOCAL_WAIT_TIMEOUT_S)
        if not ok:
            raise TimeoutError(f"a tensor argument (value {rid}) did not become ready on this "
                               f"proc within {LOCAL_WAIT_TIMEOUT_S} s")
        worker = _LOCAL[token]
    v = worker.values.get(rid)
    if v is None:
        raise ValueError(f"tensor argument: no value {rid} on rank {worker.rank} "
                         f"({worker.host}): it was freed or never made here")
    if type(v) is Failure:
        raise RemoteException(v, "A tensor passed to this endpoint failed to compute.")
    return v


class _LocalRef:
    """A worker value sent to an actor of the same proc by reference."""

    __slots__ = ("token", "id")

    def __init__(self, token: str, rid: int) -> None:
        self.token = token
        self.id = rid

    def __reduce__(self):
        return (local_value, (self.token, self.id, None))


def _refs(x: Any) -> List[Ref]:
    out: List[Ref] = []

    def walk(v: Any) -> None:
        if type(v) is Ref:
            out.append(v)
        elif isinstance(v, (list, tuple)):
            for e in v:
                walk(e)
        elif isinstance(v, dict):
            for e in v.values():
                walk(e)

    walk(x)
    return out


def _as_local(token: Optional[str], x: Any) -> Any:
    t = type(x)
    if t is Ref:
        return _LocalRef(token or "", x.id)
    if t is list or t is tuple:
        return t(_as_local(token, v) for v in x)
    if t is dict:
        return {k: _as_local(token, v) for k, v in x.items()}
    return x


# to_mesh's mailbox of this proc: what other workers delivered, and the buffers this proc's
# worker exposes until their reader has read them. The Mailbox actor fills it while the
# TensorWorker of the same proc waits in a recv command.
_MAILBOX: Dict[Any, Any] = {}
_EXPOSED: Dict[Any, Any] = {}
_MAIL_CV = threading.Condition()


def _deliver(mail: Any, value: Any) -> None:
    with _MAIL_CV:
        _MAILBOX[mail] = value
        _MAIL_CV.notify_all()


def _release(mail: Any) -> None:
    with _MAIL_CV:
        held = _EXPOSED.pop(mail, None)
    if held is not None:
        held[0].drop()


class Mailbox(Actor):
    """One per proc, beside its TensorWorker: receives to_mesh values while that worker
    waits for them."""

    _podium_internal = True

    @endpoint
    def deliver(self, mail: Any, value: Any) -> None:
        _deliver(mail, value)

    @endpoint
    def release(self, mail: Any) -> None:
        _release(mail)


def _matching(mine: Dict[str, int], region: tuple) -> List[int]:
    """The root ranks of `region` whose coordinates agree with `mine` where both have them."""
    labels, offset, sizes, strides = region
    ranks = [offset]
    for label, size, stride in zip(labels, sizes, strides):
        if label in mine:
            ranks = [r + mine[label] * stride for r in ranks]
        else:
            ranks = [r + i * stride for r in ranks for i in range(size)]
    return ranks


def _root_point(mesh: Any, rank: int) -> Dict[str, int]:
    sizes = mesh.sizes
    coords: Dict[str, int] = {}
    for label in reversed(list(sizes)):
        coords[label] = rank % sizes[label]
        rank //= sizes[label]
    return coords


def _function(fn: Any) -> Any:
    if isinstance(fn, str):
        return resolve_function(fn)
    if isinstance(fn, bytes):  # defined in __main__ or a closure: sent by value
        f = _BY_VALUE.get(fn)
        if f is None:
            f = _BY_VALUE[fn] = pickle.loads(fn)
        return f
    return fn


def _structure(out: Any, keys: List[tuple]) -> Any:
    """The spec of an output (as the controller's _tensor._spec) and each tensor's metadata."""
    if isinstance(out, torch.Tensor):
        keys.append((tuple(out.shape), tuple(out.stride()), out.dtype, out.device))
        return len(keys) - 1
    if isinstance(out, (list, tuple)):
        return (type(out), tuple(_structure(o, keys) for o in out))
    return ("v", out)


def _flatten(x: Any, out: List[Any]) -> None:
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _flatten(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _flatten(v, out)


def _outputs(cmd: tuple) -> List[int]:
    kind = cmd[0]
    if kind == "op":
        return list(cmd[2]) + list(cmd[5])
    if kind in ("call", "collective"):
        return list(cmd[2])
    if kind == "actor":
        return list(cmd[3])
    if kind in ("lift", "rank", "alias", "recv"):
        return [cmd[1]]
    return []


def _name(cmd: tuple) -> str:
    if cmd[0] == "actor":
        return f"{cmd[1]._class.__qualname__}.{cmd[2]}" if len(cmd) > 2 else str(cmd[1])
    if cmd[0] in ("op", "call", "collective"):
        fn = cmd[1]
        return fn if isinstance(fn, str) else getattr(fn, "__qualname__", repr(fn))
    return ""
