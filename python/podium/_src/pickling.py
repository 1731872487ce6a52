"""How Python values become message parts and back.

A value is pickled with cloudpickle (so classes and functions defined in ``__main__`` travel
by value) at protocol 5: part 0 is the pickle stream, and every contiguous PickleBuffer larger
than podium._core.base.COPY_THRESHOLD (NumPy arrays, torch tensors, bytearrays) becomes a part
of its own, which the C++ core writes to the socket with writev, without copying it into the
stream. A CPU torch tensor's storage is such a buffer (PK-1): torch would otherwise copy it
into the stream through torch.save; the tensor itself (shape, strides, offset,
requires_grad, nn.Parameter) still pickles as torch pickles it.

On receipt the parts are buffers over the bytes read from the socket, each in its own
allocation: a part that one call alone received is writable (BU-1), so a NumPy array or a
torch tensor unpickled from it uses those bytes as its own memory, writable, without a copy.
A part that is not writable (a cast that delivered the same bytes to several actors of this
process, an in-process delivery whose bytes are the sender's, a reply) gives a read-only
NumPy array, and a torch tensor with a copy of its own (torch has no read-only tensors).

  PK-1 A CPU torch tensor above the copy threshold travels as an out-of-band part (not inside
    the pickle stream), arrives with its dtype, shape, strides and requires_grad, and is
    writable on the receiver.

Because large parts are not copied, an object sent must not be mutated until the call that
carries it has been answered (or, for broadcast, until the receivers have it).
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any, List, Optional, Sequence

import cloudpickle

from podium._core import base as _base
from podium._core import mesh as _mesh

_THRESHOLD = _base.COPY_THRESHOLD


# Values of these types pickle the same with the C pickler as with cloudpickle (they never
# refer to a class or function by name), so a message made only of them skips cloudpickle's
# Python-level Pickler, which costs several µs per message.
_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})


def _plain(obj: Any) -> bool:
    """True when ``obj`` is a plain value, or a tuple/list/dict of plain values (one level
    of nesting below that: enough for (args, kwargs) and (ok, value) messages)."""
    t = type(obj)
    if t in _PLAIN:
        return True
    if t is tuple or t is list:
        for x in obj:
            if type(x) not in _PLAIN and not _plain_shallow(x):
                return False
        return True
    if t is dict:
        for k, v in obj.items():
            if type(k) is not str or (type(v) not in _PLAIN and not _plain_shallow(v)):
                return False
        return True
    return False


def _plain_shallow(obj: Any) -> bool:
    t = type(obj)
    if t is tuple or t is list:
        for x in obj:
            if type(x) not in _PLAIN:
                return False
        return True
    if t is dict:
        for k, v in obj.items():
            if type(k) is not str or type(v) not in _PLAIN:
                return False
        return True
    return False


def dumps(obj: Any) -> List[Any]:
    """The message parts of ``obj``: [pickle stream, out-of-band buffer, ...]."""
    if _plain(obj):
        return [pickle.dumps(obj, protocol=5)]
    buffers: List[Any] = []

    def out_of_band(pb: pickle.PickleBuffer) -> bool:
        try:
            raw = pb.raw()
        except BufferError:  # not contiguous: serialise it inside the stream
            return True
        if raw.nbytes <= _THRESHOLD:
            return True
        buffers.append(raw)
        return False

    if "torch" in sys.modules:
        with io.BytesIO() as f:
            _TorchPickler(f, protocol=5, buffer_callback=out_of_band).dump(obj)
            stream = f.getvalue()
    else:
        stream = cloudpickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    return [stream, *buffers]


# --- torch storages as out-of-band buffers (PK-1) -----------------------------------------


def _storage_bytes(storage: Any) -> Optional[Any]:
    """A writable uint8 NumPy view of a CPU torch UntypedStorage's bytes (keeping the storage
    alive), or None when this one cannot be exported (empty, not CPU, no NumPy)."""
    if storage.device.type != "cpu" or storage.nbytes() == 0:
        return None
    try:
        import torch
        view = torch.empty(0, dtype=torch.uint8).set_(storage)
        return view.numpy()
    except Exception:  # NumPy missing or a storage torch cannot view: torch's own pickling
        return None


def _rebuild_storage(buf: Any, dtype: Any) -> Any:
    """The receiver's side of PK-1: a TypedStorage over ``buf`` itself when it is writable,
    over a copy of it otherwise (torch has no read-only tensors)."""
    import torch
    view = memoryview(buf)
    if view.readonly:
        view = memoryview(bytearray(view))
    untyped = torch.frombuffer(view, dtype=torch.uint8).untyped_storage()
    if dtype is None:
        return untyped
    return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


class _TorchPickler(cloudpickle.Pickler):
    """cloudpickle's pickler, with CPU torch storages as PickleBuffers (PK-1)."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None:
            t = type(obj)
            if t is torch.storage.TypedStorage:
                data = _storage_bytes(obj._untyped_storage)
                if data is not None:
                    return _rebuild_storage, (pickle.PickleBuffer(data), obj.dtype)
            elif t is torch.storage.UntypedStorage:
                data = _storage_bytes(obj)
                if data is not None:
                    return _rebuild_storage, (pickle.PickleBuffer(data), None)
        return super().reducer_override(obj)


def loads(parts: Sequence[Any]) -> Any:
    """The inverse of dumps(), reading the parts in place."""
    return pickle.loads(parts[0], buffers=parts[1:])


# What a call's envelope holds besides its arguments (the call header, the reply port, the
# frame's table) fits in this many bytes.
_HEADER_ROOM = 64 << 10


def check_fits(whose: str, parts: List[Any]) -> None:
    """ValueError when ``parts`` cannot go in one message between procs (``whose``: "the
    arguments of A.f()", "the result of A.f()", ...). Sent anyway, the sender's channel would
    refuse the envelope: a call after it took its place in the caller's ordered stream (the
    callee then waits 10 s for it before the next, and the caller hears the actor failed), a
    reply or a port's value never arrives (its caller waits out its timeout)."""
    total = len(parts[0]) + sum(memoryview(p).nbytes for p in parts[1:])
    if total <= 1 << 30:  # under any limit podium sets; the runtime is asked only above
        return
    frame = _mesh.max_frame_bytes()
    if total > frame - _HEADER_ROOM:
        raise ValueError(
            f"{whose} ({total} bytes) cannot go in one message between procs, which holds at "
            f"most {frame - _HEADER_ROOM} bytes (max_frame_bytes {frame}, less its header): "
            f"move large data with podium.rdma (RDMABuffer) or in several messages")


def dumps_call(what: str, args: tuple, kwargs: dict) -> List[Any]:
    """dumps((args, kwargs)); on failure, a TypeError that names the argument that cannot be
    pickled, or a ValueError for arguments too large for one message (nothing has been
    sent)."""
    try:
        parts = dumps((args, kwargs))
    except Exception as e:
        for i, a in enumerate(args):
            _check_one(what, f"argument {i}", a)
        for k, v in kwargs.items():
            _check_one(what, f"argument '{k}'", v)
        raise TypeError(f"cannot pickle the arguments of {what}: {e}") from e
    check_fits(f"the arguments of {what}", parts)
    return parts


def _check_one(what: str, name: str, value: Any) -> None:
    try:
        cloudpickle.dumps(value, protocol=5, buffer_callback=lambda _: False)
    except Exception as e:
        raise TypeError(
            f"{name} of {what} ({type(value).__name__}) cannot be pickled: {e}"
        ) from e
