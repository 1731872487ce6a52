"""How Python values become message parts and back.

A value is pickled with cloudpickle (so classes and functions defined in ``__main__`` travel
by value) at protocol 5: part 0 is the pickle stream, and every contiguous PickleBuffer larger
than podium._core.base.COPY_THRESHOLD (NumPy arrays, torch tensors, bytearrays) becomes a part
of its own, which the C++ core writes to the socket without copying it into the stream. On
receipt the parts are read-only buffers over the received bytes, so such arrays arrive
read-only and without a copy.

Because large parts are not copied, an object sent must not be mutated until the call that
carries it has been answered (or, for broadcast, until the receivers have it).
"""

from __future__ import annotations

import pickle
from typing import Any, List, Sequence

import cloudpickle

from podium._core import base as _base

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

    stream = cloudpickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    return [stream, *buffers]


def loads(parts: Sequence[Any]) -> Any:
    """The inverse of dumps(), reading the parts in place."""
    return pickle.loads(parts[0], buffers=parts[1:])


def dumps_call(what: str, args: tuple, kwargs: dict) -> List[Any]:
    """dumps((args, kwargs)); on failure, a TypeError that names the argument that cannot be
    pickled (nothing has been sent)."""
    try:
        return dumps((args, kwargs))
    except Exception as e:
        for i, a in enumerate(args):
            _check_one(what, f"argument {i}", a)
        for k, v in kwargs.items():
            _check_one(what, f"argument '{k}'", v)
        raise TypeError(f"cannot pickle the arguments of {what}: {e}") from e


def _check_one(what: str, name: str, value: Any) -> None:
    try:
        cloudpickle.dumps(value, protocol=5, buffer_callback=lambda _: False)
    except Exception as e:
        raise TypeError(
            f"{name} of {what} ({type(value).__name__}) cannot be pickled: {e}"
        ) from e
