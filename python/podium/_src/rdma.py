"""podium.rdma: one-sided reads and writes of another proc's memory, as Monarch's
``monarch.rdma`` (docs/data.md).

An ``RDMABuffer`` registers a region of its owner's memory (a memoryview, any C-contiguous
buffer, or a 1-D contiguous torch tensor: CPU, or CUDA where UCX has CUDA support) with the
process's UCX data plane
(podium._core.data). The object is a small reference: owner (actor id, proc, rank, host, pid),
buffer id, capability token, address, size, remote key, the owner's UCX worker address and its
TCP bulk address (DA-48). It pickles, so it travels to other actors as an endpoint argument or
result, over podium's authenticated control plane. A reader asks the owner to check the token,
then reads or writes the bytes one-sidedly (``read_into``, ``write_from``, ``RDMAAction``);
between hosts without RDMA hardware, the owner's TCP bulk server checks the token with each
request and moves the bytes itself (DA-49).

  RD-1 Every argument is checked before anything moves: a local buffer that is empty, not
    contiguous, read-only where it must be written, or too small for the transfer raises
    ValueError from the call itself, and a dropped buffer (this copy) raises RuntimeError.
    A timeout that is not a number raises TypeError, NaN ValueError, a negative one
    TimeoutRangeError (a ValueError, and the OverflowError Monarch raises); one past about
    31 years, infinity included, means no limit (never a deadline in the past).
  RD-2 A transfer whose buffer's owner died fails with SupervisionError naming the owner
    actor, its rank, host and pid (at once when the runtime knows the owner's proc ended);
    one from a buffer dropped by any holder (or whose owner actor stopped) fails with
    RuntimeError saying so; a wrong token with PermissionError; a timeout with TimeoutError.
  RD-3 The buffers an actor owns are released (their memory unregistered) when the actor
    stops, as when they are dropped.
  RD-7 A CUDA tensor (owner's buffer or reader's local side) moves GPU to GPU or between GPU
    and host memory through UCX, without a copy staged by either side, where this process's
    UCX has CUDA support (``_data.cuda_supported()``, DA-23); the GPU work queued on the
    tensor's device is finished before its memory is registered or handed to UCX. Without
    CUDA support, a CUDA tensor is refused with NotImplementedError naming the UCX in use.
  RD-8 A summed read (``read_into(dst, checksum=True)``, ``read_remote(..., checksum=True)``; a
    podium extension, not in Monarch) resolves to the wrapping (mod 2**64) sum of the
    little-endian uint64 words of the bytes it read into ``dst`` (the last partial word
    zero-padded), computed in C++ by the data plane right after the copy (DA-40, DA-41),
    never by a pass in Python; without ``checksum`` a read resolves to None, as Monarch's.
    A summed read into CUDA memory is refused with NotImplementedError before anything moves.
  RD-6 A buffer's owner is on the reader's host (CMA or UCX's shared memory, DA-9, DA-10)
    only when both run on one kernel in the same network and pid namespaces (``_node()``):
    hosts that share a machine's name but not its network namespace (containers, the
    network-namespace hosts of the tests) are other hosts, reached over UCX's network
    transports, whose pids mean nothing to each other.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import warnings
from typing import Any, List, Optional, Tuple

from podium._core import base as _base
from podium._core import data as _data
from podium._core import mesh as _mesh
from podium._src import errors, runtime
from podium._src.context import context
from podium._src.future import Future, done as _done


class TimeoutRangeError(ValueError, OverflowError):
    """A negative timeout: a ValueError, and the OverflowError Monarch raises for a timeout
    outside an unsigned 64-bit integer. Beyond about 31 years a timeout means no limit."""


class RDMAReadTransferWarning(Warning):
    pass


class RDMAWriteTransferWarning(Warning):
    pass


class RDMATcpFallbackWarning(Warning):
    pass


def is_ibverbs_available() -> bool:
    """Whether this host has ibverbs devices (InfiniBand, RoCE, EFA), which UCX would use."""
    try:
        return any(os.scandir("/sys/class/infiniband"))
    except OSError:
        return False


def is_rdma_available() -> bool:
    """Deprecated, as Monarch's: whether RDMA over ibverbs is available."""
    warnings.warn(
        "is_rdma_available is deprecated because Monarch now supports multiple RDMA backends, "
        "making this function ambiguous. For now it indicates whether RDMA over ibverbs is "
        "available. Use is_ibverbs_available() or get_rdma_backend() instead.",
        DeprecationWarning, stacklevel=2)
    return is_ibverbs_available()


def get_rdma_backend() -> str:
    """'ibverbs' where UCX runs and the host has ibverbs devices; 'tcp' where UCX runs without
    them (as Monarch's word for "works without RDMA hardware": UCX moves the bytes through
    shared memory on one host and TCP across hosts); 'none' where the data plane cannot
    start."""
    ok, _why = _data.available()
    if not ok:
        return "none"
    return "ibverbs" if is_ibverbs_available() else "tcp"


def _is_torch_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


class _TensorRegion:
    """A tensor's bytes, as the data plane takes them: the binding gets (address, size,
    tensor, cuda), and the tensor keeps them alive. A CUDA tensor's because no Python buffer
    can export device memory (RD-7); a CPU tensor's because the NumPy array and memoryview
    that would export it cost 3 to 5 us a transfer, a third of a 4 KiB read."""

    __slots__ = ("tensor", "nbytes", "readonly", "cuda")

    def __init__(self, tensor: Any, cuda: bool) -> None:
        self.tensor = tensor
        self.nbytes = tensor.nbytes
        self.readonly = False
        self.cuda = cuda

    def arg(self) -> Tuple[int, int, Any, bool]:
        return (self.tensor.data_ptr(), self.nbytes, self.tensor, self.cuda)


def _cuda_region(data: Any, what: str) -> _TensorRegion:
    runtime.ensure_runtime()
    if not _data.cuda_supported():
        raise NotImplementedError(
            f"{what}: a cuda tensor needs a UCX built with CUDA support; this process's UCX "
            f"({_data.ucx_version()}) has none, so this data plane moves host memory only "
            f"(build podium against a CUDA UCX: docs/data.md, \"GPU memory\")")
    # RD-7: kernels still writing (or reading) the tensor finish before UCX touches it.
    sys.modules["torch"].cuda.synchronize(data.device)
    return _TensorRegion(data.detach(), cuda=True)


Local = Any  # a 1-D byte memoryview, or a _TensorRegion (RD-7)


def _arg(view: Local) -> Any:
    """What the binding takes for a local region."""
    return view.arg() if isinstance(view, _TensorRegion) else view


def _local_view(data: Any, *, writable: bool, what: str) -> Local:
    """``data``'s memory, shared (RD-1): a _TensorRegion for a tensor (RD-7), a 1-D byte
    memoryview for anything else."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        # The common case first, in the fewest of torch's attribute reads (each ~0.1 us).
        if (data.is_cpu and data.layout is torch.strided and data.ndim == 1
                and data.is_contiguous() and not data.is_conj() and not data.is_neg()):
            return _TensorRegion(data, cuda=False)
        if data.device.type not in ("cpu", "cuda"):
            raise NotImplementedError(
                f"{what}: a {data.device.type} tensor cannot be moved by this data plane "
                f"(host memory, and CUDA memory with a CUDA UCX)")
        if data.dim() != 1 or not data.is_contiguous():
            raise ValueError(f"{what}: the tensor must be 1-D and contiguous "
                             f"(got shape {tuple(data.shape)}, strides {data.stride()})")
        if data.device.type == "cuda":
            return _cuda_region(data, what)
        # Other layouts and lazy conjugate or negative views: as NumPy exports them (or says
        # why it cannot); the array shares the tensor's memory and keeps the tensor alive.
        mv = memoryview(data.detach().view(torch.uint8).numpy())
    else:
        try:
            mv = data if isinstance(data, memoryview) else memoryview(data)
        except TypeError:
            raise TypeError(f"{what}: expected a memoryview, a buffer or a torch.Tensor, got "
                            f"{type(data).__name__}") from None
        if not mv.c_contiguous:
            raise ValueError(f"{what}: the memoryview must be C-contiguous")
    if writable and mv.readonly:
        raise ValueError(f"{what}: the destination is read-only")
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    return mv


_HOST = socket.gethostname()


def _hostname() -> str:
    """This host's name, as errors name a buffer's owner."""
    return _HOST


def _read_id(path: str) -> str:
    try:
        return str(os.stat(path).st_ino)
    except OSError:
        return "?"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "?"


# RD-6: the kernel (boot id), and this process's network and pid namespaces.
_NODE = f"{_boot_id()}/{_read_id('/proc/self/ns/net')}/{_read_id('/proc/self/ns/pid')}"


def _node() -> str:
    """Where this process runs, for the data plane (RD-6): equal for two processes only when
    one may reach the other's memory by pid (CMA) and shared memory."""
    return _NODE


class _Owner:
    """Who owns a buffer, for error messages."""

    __slots__ = ("actor_id", "proc", "rank", "point", "host", "pid", "node")

    def __init__(self, actor_id: str, proc: str, rank: int, point: str, host: str,
                 pid: int, node: str) -> None:
        self.actor_id, self.proc, self.rank, self.point = actor_id, proc, rank, point
        self.host, self.pid, self.node = host, pid, node

    def state(self) -> Tuple[str, str, int, str, str, int, str]:
        return (self.actor_id, self.proc, self.rank, self.point, self.host, self.pid,
                self.node)

    def __str__(self) -> str:
        return (f"{self.actor_id} (rank {self.rank} {self.point}, host {self.host}, "
                f"pid {self.pid})")


class RDMABuffer:
    """A region of its owner's memory that other procs read and write one-sidedly.

    ``RDMABuffer(data)``: ``data`` is a 1-D contiguous tensor (CPU, or CUDA where UCX has CUDA
    support: RD-7; views and slices too) or a
    C-contiguous memoryview (any C-contiguous buffer). Size 0 and non-contiguous input raise
    ValueError. The buffer pickles as a small reference; pass it to (or return it from)
    endpoints. Its memory stays registered until ``drop()`` or its owner actor stops."""

    __slots__ = ("_owner", "_id", "_token", "_addr", "_size", "_rkey", "_worker", "_cuda",
                 "_window", "_bulk", "_dropped", "__weakref__")

    def __init__(self, data: Any) -> None:
        self._register(data, share=True)

    def _register(self, data: Any, share: bool) -> None:
        view = _local_view(data, writable=False, what="RDMABuffer")
        if view.nbytes == 0:
            raise ValueError("Cannot create RDMABuffer with size 0.")
        runtime.ensure_runtime()
        ok, why = _data.available()
        if not ok:
            raise RuntimeError(f"Tried to create an RDMABuffer, but the data plane (UCX) "
                               f"cannot start in this process: {why}")
        ins = context().actor_instance
        rank = ins.rank
        self._owner = _Owner(ins.actor_id, _mesh.this_proc_id(), rank.rank if len(rank) else 0,
                             str(rank), _hostname(), os.getpid(), _node())
        (self._id, self._token, self._addr, self._size, self._rkey, self._worker,
         _writable, self._window, self._bulk) = _data.register_buffer(_arg(view), ins.actor_id,
                                                                      share)
        self._cuda = isinstance(view, _TensorRegion) and view.cuda
        self._dropped = False

    @classmethod
    def _for_one_read(cls, data: Any) -> "RDMABuffer":
        """A buffer the runtime makes for one reader to read once (the tensor engine's
        ``to_mesh``): its pages stay where they are (DA-38). Moving them into shared pages
        (DA-29) costs a copy and fresh pages, more than the one read gains from them."""
        b = cls.__new__(cls)
        b._register(data, share=False)
        return b

    @classmethod
    def _rebuild(cls, owner: tuple, ref: tuple) -> "RDMABuffer":
        b = cls.__new__(cls)
        b._owner = _Owner(*owner)
        (b._id, b._token, b._addr, b._size, b._rkey, b._worker, b._cuda,
         b._window, b._bulk) = ref
        b._dropped = False
        return b

    def __reduce__(self):
        return (RDMABuffer._rebuild, (self._owner.state(), (
            self._id, self._token, self._addr, self._size, self._rkey, self._worker,
            self._cuda, self._window, self._bulk)))

    @property
    def backend(self) -> str:
        return get_rdma_backend()

    def size(self) -> int:
        return self._size

    @property
    def owner(self) -> str:
        """The owner actor's id."""
        return self._owner.actor_id

    def read_into(self, dst: Any, *, timeout: float = 60,
                  checksum: bool = False) -> "Future[Optional[int]]":
        """Reads this buffer into ``dst`` (a 1-D contiguous tensor or C-contiguous memoryview
        of at least ``size()`` bytes). ValueError if ``dst`` is smaller. The Future resolves to
        None, as Monarch's.

        ``checksum=True`` (a podium extension, RD-8): the Future resolves instead to the
        wrapping (mod 2**64) sum of the little-endian uint64 words of the ``size()`` bytes read
        into ``dst``, the last partial word zero-padded, computed by the data plane right
        after the copy while the bytes are in its cache, so that a reader checking what it
        read makes no second pass over them. Host memory only: a CUDA ``dst`` raises
        NotImplementedError."""
        return _submit([_read_op(dst, self, checksum)], timeout, one=checksum)

    def write_from(self, src: Any, *, timeout: float = 60) -> Future[None]:
        """Writes ``src`` (at most ``size()`` bytes) into this buffer, from its start.
        ValueError if ``src`` is larger."""
        return _submit([_write_op(self, src)], timeout, one=False)

    def drop(self) -> Future[None]:
        """Releases the buffer at its owner (its memory is unregistered); later transfers
        through any copy of it fail. Dropping twice is harmless."""
        self._dropped = True
        runtime.ensure_runtime()
        return Future(_data.drop(self._owner.proc, self._id, self._token, 60.0), _decode,
                      ("drop", [self], None, False))

    def _check_live(self) -> None:
        if self._dropped:
            raise RuntimeError(f"RDMABuffer {self._id} of {self._owner} was dropped; it cannot "
                               f"be read or written any more")

    def __repr__(self) -> str:
        return f"<RDMABuffer {self._id} of {self._owner.actor_id}, {self._size} bytes>"


class RDMAAction:
    """A batch of RDMA operations submitted as one unit: ``submit()`` runs them in parallel
    and its Future resolves once all are done, or with the first failure."""

    def __init__(self) -> None:
        self._ops: List[Tuple[bool, RDMABuffer, Local, int, bool]] = []

    def read_remote(self, dst: Any, src: RDMABuffer, *, checksum: bool = False
                    ) -> "RDMAAction":
        """Queues a read of the whole of ``src`` into local memory ``dst`` (RD-1).
        ``checksum=True`` (a podium extension, RD-8) sums the bytes read, as
        ``RDMABuffer.read_into`` does; ``submit()`` then resolves to a list with one entry
        per queued operation: that sum for a summed read, None for the others."""
        self._ops.append(_read_op(dst, src, checksum))
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> "RDMAAction":
        """Queues a write of local memory ``src`` into the start of ``dst`` (RD-1)."""
        self._ops.append(_write_op(dst, src))
        return self

    def fetch_add(self, src: RDMABuffer, dst: Any, add: int) -> "RDMAAction":
        raise NotImplementedError("Not yet supported")

    def compare_and_swap(self, src: RDMABuffer, dst: Any, compare: int,
                         swap: int) -> "RDMAAction":
        raise NotImplementedError("Not yet supported")

    def submit(self, *, timeout: float = 60) -> Future[Any]:
        """Runs the queued operations in parallel. Safe to call more than once. Resolves to
        None, or, where a read was queued with ``checksum=True`` (RD-8), to the list of the
        operations' sums (None for those not summed)."""
        return self._submit(timeout, one=False)

    def _submit(self, timeout: float, one: bool) -> Future[Any]:
        """``one``: resolve to the one operation's sum (read_into's checksum)."""
        return _submit(self._ops, timeout, one)


# One queued operation: (write, buffer, local region, bytes, summed).
_Op = Tuple[bool, RDMABuffer, Local, int, bool]


def _read_op(dst: Any, src: RDMABuffer, checksum: bool) -> _Op:
    """A read of the whole of ``src`` into ``dst``, checked (RD-1, RD-8)."""
    src._check_live()
    if checksum and _is_torch_tensor(dst) and dst.device.type != "cpu":
        raise NotImplementedError(
            f"read_into(checksum=True): the sum is computed in host memory; a "
            f"{dst.device.type} destination cannot be summed (read without checksum)")
    view = _local_view(dst, writable=True, what="read_into")
    if view.nbytes < src.size():
        raise ValueError(f"read_into: the destination holds {view.nbytes} bytes, fewer than "
                         f"the {src.size()} bytes of {src!r}")
    return (False, src, view, src.size(), bool(checksum))


def _write_op(dst: RDMABuffer, src: Any) -> _Op:
    """A write of ``src`` into the start of ``dst``, checked (RD-1)."""
    dst._check_live()
    view = _local_view(src, writable=False, what="write_from")
    if view.nbytes > dst.size():
        raise ValueError(f"write_from: the source holds {view.nbytes} bytes, more than the "
                         f"{dst.size()} bytes of {dst!r}")
    return (True, dst, view, view.nbytes, False)


def _submit(queued: List[_Op], timeout: float, one: bool) -> Future[Any]:
    """Runs ``queued`` as one transfer. ``one``: resolve to the one operation's sum.

    One loop and no comprehension: each comprehension is a function object made per call
    (Python 3.11), and what a small transfer allocates is what the garbage collector then
    walks (docs/data_figures.md, "Per-transfer costs")."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if timeout != timeout:
        raise ValueError("timeout must be a number of seconds, got nan")
    if timeout < 0:
        raise TimeoutRangeError(f"timeout must not be negative, got {timeout}")
    runtime.ensure_runtime()
    here = _NODE
    ops = []
    kinds = []
    any_summed = False
    for w, b, v, n, s in queued:
        b._check_live()
        o = b._owner
        ops.append((w, o.proc, b._id, b._token, b._addr, b._rkey, b._worker, _arg(v), n,
                    o.node == here, o.pid, b._cuda, b._window, s, b._bulk))
        kinds.append(("write" if w else "read", b))
        any_summed = any_summed or s
    core = None
    if len(ops) == 1:
        if ops[0][9]:
            # DA-43: a same-host one is copied at once, under its lease.
            total = _data.copy_now(ops[0], float(timeout))
            if total is not None:
                return _done((total if one else [total]) if any_summed else None)
        elif ops[0][14]:
            # DA-52: one over podium's TCP path, finished by this thread at once as a rule.
            core = _data.bulk_now(ops, float(timeout))
            if type(core) is int:
                return _done((core if one else [core]) if any_summed else None)
    summed = [op[4] for op in queued] if any_summed else None  # RD-8, rare
    if core is None:
        core = _data.transfer(ops, float(timeout))
    return Future(core, _decode, ("transfer", kinds, summed, one))


_TAG = re.compile(r"\x1f(\d+)\x1f")


def _decode(core: Any, what: Tuple[str, list, Optional[List[bool]], bool]) -> Any:
    ok, payload = core.replies()[0]
    kind, items, summed, one = what
    if ok:
        if summed is None:
            return None
        # RD-8: one part, every operation's sum as 8 little-endian bytes (DA-41).
        raw = bytes(payload[0])
        sums = [int.from_bytes(raw[8 * i:8 * i + 8], "little") if s else None
                for i, s in enumerate(summed)]
        return sums[0] if one else sums
    sub, code, message = payload
    m = _TAG.match(message)
    index = 0
    if m:
        index, message = int(m.group(1)), message[m.end():]
    if kind == "transfer":
        op, buf = items[index] if index < len(items) else ("transfer", None)
    else:
        op, buf = "drop", items[0]
    raise _error(sub, code, message, op, buf)


def _error(sub: int, code: int, message: str, op: str, buf: Optional[RDMABuffer]
           ) -> BaseException:
    errc = errors.errc(sub, code)
    where = f"RDMA {op} of {buf!r}" if buf is not None else f"RDMA {op}"
    D = _base.DataErrc
    if errc is D.TIMEOUT:
        return TimeoutError(f"{where}: {message}")
    if errc is D.DROPPED:
        return RuntimeError(f"{where} failed: {message}; the buffer cannot be used any more")
    if errc is D.REFUSED:
        return PermissionError(f"{where} refused by its owner: {message}")
    if errc is D.INVALID_ARGUMENT:
        return ValueError(f"{where}: {message}")
    e = errors.from_core(sub, code, message)
    if isinstance(e, errors.SupervisionError) and buf is not None:
        o = buf._owner
        return errors.SupervisionError(
            f"{where} failed: the buffer's owner {o} is unreachable: {message}",
            cause=message, actor_id=o.actor_id, rank=o.rank, point=o.point, host=o.host,
            pid=o.pid)
    return e


def release_owner(actor_id: str) -> int:
    """RD-3: the actor ``actor_id`` stopped; its buffers are released."""
    return _data.release_owner(actor_id)
