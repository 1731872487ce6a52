"""The controller's tensors: ``podium.Tensor`` handles and the interception of torch ops.

``podium.Tensor`` is a torch wrapper subclass: it holds no data, only the id of the value
each worker of its mesh holds, its mesh view, its stream and its metadata (shape, strides,
dtype, device). Inside ``with mesh.activate():`` a TorchDispatchMode sees every aten op (the
factories too); an op on handles reaches ``Tensor.__torch_dispatch__`` anywhere. Either way
the op becomes one command in the batch (``_client.Client``) and returns handles whose
metadata comes from running the op on meta tensors.

  TE-6 The metadata of an op's outputs is computed once per (op, input metadata, other
    arguments): a repeated op with the same shapes costs a dictionary lookup, no meta run.
  TE-7 Outside any active mesh torch runs locally, unchanged; inside one, an op with no
    tensor argument (a factory) runs on the mesh, and an op whose tensor arguments are all
    local (a fetched value) runs locally. A local tensor mixed with handles in one op raises
    TypeError naming it (``torch.tensor(...)`` written inside the block is sent as a value
    instead), as do handles of two meshes, a handle of another stream than the active one,
    and a handle its borrow forbids (TE-11).
  TE-8 An op that mutates its input (``add_``, ``out=``) returns the same handle; autograd
    runs in the controller over handles, so ``backward()``, ``.grad``, modules and optimizers
    made inside the block issue their ops as commands.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from podium.tensor._client import View
from podium.tensor._worker import Ref


class _State:
    """The active mesh (a View, or None) and stream of this controller."""

    __slots__ = ("mesh", "stream", "mode_depth", "mode")

    def __init__(self) -> None:
        self.mesh: Optional[View] = None
        self.stream: Any = None  # set by _stream.py: the default Stream
        self.mode_depth = 0
        self.mode: Optional[TorchDispatchMode] = None


state = _State()

# --- handles --------------------------------------------------------------------------------

_READ, _WRITE = 1, 2
_RW = _READ | _WRITE


class Tensor(torch.Tensor):
    """A handle on one value per proc of a mesh (see the module docstring)."""

    _rid: int
    _ref: Ref
    _view: View
    _stream: Any
    _key: tuple
    _access = 3  # _RW until a borrow changes it
    _dropped = False

    @property
    def mesh(self) -> Any:
        """The ProcMesh view the tensor lives on."""
        return self._view.proc_mesh

    @property
    def stream(self) -> Any:
        return self._stream

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return (f"podium.Tensor(shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"device={self.device}, mesh={self._view}, id={self._rid})")

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return dispatch(func, args, kwargs or {}, None)

    # Monarch's tensor methods; the implementations live in their own modules.
    def reduce(self, dims: Any, reduction: str = "sum", scatter: bool = False,
               mesh: Any = None) -> "Tensor":
        return _hooks["reduce"](self, dims, reduction, scatter, mesh, False)

    def reduce_(self, dims: Any, reduction: str = "sum", scatter: bool = False,
                mesh: Any = None) -> "Tensor":
        return _hooks["reduce"](self, dims, reduction, scatter, mesh, True)

    def to_mesh(self, mesh: Any, stream: Any = None) -> "Tensor":
        return _hooks["to_mesh"](self, mesh, stream)

    def slice_mesh(self, **kwargs: Any) -> Any:
        return _hooks["slice_mesh"](self, kwargs)

    def drop(self) -> None:
        """Frees the remote value now; later uses raise."""
        drop(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # TypeError, except in the arguments of an endpoint of actors on its procs (TE-20;
        # _actors.py fills the hook, and podium.tensor always imports it).
        return _hooks["reduce_handle"](self)

    @property
    def dropped(self) -> bool:
        return self._dropped


# Filled by the modules that implement them (_collective.py, _move.py, _actors.py): no
# import cycle.
_hooks: Dict[str, Any] = {}


class _Freed(weakref.ref):
    __slots__ = ("view", "rid")


_live: Dict[int, _Freed] = {}


def _on_free(wr: _Freed) -> None:
    _live.pop(wr.rid, None)
    wr.view.client.freed(wr.view, wr.rid)


def new_handle(view: View, key: tuple, stream: Any, rid: int = 0) -> Tensor:
    """A handle of metadata `key` = (shape, strides, dtype, device) on `view`; a fresh id
    unless `rid` is given."""
    shape, strides, dtype, device = key
    t = torch.Tensor._make_wrapper_subclass(Tensor, shape, strides=strides, dtype=dtype,
                                            device=device)
    if not rid:
        c = view.client
        rid = c.next_id
        c.next_id = rid + 1
    t._rid = rid
    t._ref = Ref(rid)
    t._view = view
    t._stream = stream
    t._key = key
    wr = _Freed(t, _on_free)
    wr.view = view
    wr.rid = rid
    _live[rid] = wr
    return t


def drop(t: Tensor) -> None:
    if t._dropped:
        return
    t._dropped = True
    t._access = 0  # every later use takes the slow check, which names the drop
    wr = _live.pop(t._rid, None)
    if wr is not None:
        t._view.client.freed(t._view, t._rid)


def meta_key(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), tuple(t.stride()), t.dtype, t.device)


# --- interception ------------------------------------------------------------------------------


class _Mode(TorchDispatchMode):
    """Active while a mesh is: every aten op, factories included, goes to the mesh."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Else torch wraps __torch_dispatch__ to keep torch.compile out of it, a few
        # microseconds per op; the controller's interception is never compiled.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        view = state.mesh
        if (view is None or func.namespace in _LOCAL_NAMESPACES
                or (func in _LOCAL_ACCESSORS and not isinstance(args[0], Tensor))):
            return func(*args, **(kwargs or {}))
        return dispatch(func, args, kwargs or {}, view)


# Ops of these namespaces run locally even inside the block (the profiler's record_function,
# which optimizers and modules open around their steps).
_LOCAL_NAMESPACES = frozenset({"profiler"})
# On local tensors they stay local inside the block (unpickling a fetched value, .item()).
_LOCAL_ACCESSORS = frozenset({torch.ops.aten.set_.source_Storage_storage_offset,
                              torch.ops.aten.set_.source_Storage,
                              torch.ops.aten._local_scalar_dense.default})


class _Entry:
    """What TE-6 caches per op signature."""

    __slots__ = ("name", "spec", "keys", "alias", "mutated")

    def __init__(self, name: str, spec: Any, keys: List[tuple], alias: List[int],
                 mutated: Tuple[int, ...]) -> None:
        self.name = name  # "aten::add.Tensor"
        self.spec = spec  # the output structure (see _spec)
        self.keys = keys  # per output tensor: its metadata
        self.alias = alias  # per output tensor: index of the input handle it is, or -1
        self.mutated = mutated  # indexes of the input handles the op writes (not outputs)


_cache: Dict[tuple, _Entry] = {}
CACHE_LIMIT = 1 << 16
cache_stats = {"hits": 0, "misses": 0}


def _scan(x: Any, handles: List[Tensor], local: List[torch.Tensor]) -> Tuple[Any, Any]:
    """(cache key, command form) of an argument: handles become their Ref (in `handles`),
    local tensors are collected in `local`."""
    t = type(x)
    if t is Tensor:
        handles.append(x)
        return x._key, x._ref
    if t is tuple or t is list:
        keys = []
        vals = []
        for v in x:
            k, r = _scan(v, handles, local)
            keys.append(k)
            vals.append(r)
        return (t, tuple(keys)), (tuple(vals) if t is tuple else vals)
    if isinstance(x, Tensor):
        handles.append(x)
        return x._key, x._ref
    if isinstance(x, torch.Tensor):
        local.append(x)
        return ("local", id(x)), x
    return x, x


def dispatch(func: Any, args: tuple, kwargs: dict, view: Optional[View]) -> Any:
    handles: List[Tensor] = []
    local: List[torch.Tensor] = []
    # The flat positional arguments of most ops are scanned inline (the hot path, TE-6).
    akeys: List[Any] = [id(func)]
    rargs: List[Any] = []
    for x in args:
        t = type(x)
        if t is Tensor:
            handles.append(x)
            akeys.append(x._key)
            rargs.append(x._ref)
        elif t is int or t is float or t is bool:
            akeys.append(x)
            rargs.append(x)
        else:
            k, r = _scan(x, handles, local)
            akeys.append(k)
            rargs.append(r)
    if kwargs:
        rkwargs = {}
        for name, v in kwargs.items():
            k, r = _scan(v, handles, local)
            akeys.append((name, k))
            rkwargs[name] = r
    else:
        rkwargs = kwargs
    key = tuple(akeys)
    if handles:
        view = handles[0]._view
    if local:
        if not handles:
            if func in _LIFT and view is not None:
                return _lift(view, local[0])
            return func(*args, **kwargs)  # only local tensors: a local op (a fetched value)
        _bad_arguments(func, args, kwargs, view, handles, local)
    if view is None:  # no handle, no active mesh: nothing remote about it
        return func(*args, **kwargs)
    stream = state.stream
    for h in handles:
        if h._view is not view or h._stream is not stream or h._access != _RW:
            _check(func, args, kwargs, view, handles, stream)
            break
    try:
        entry = _cache.get(key)
    except TypeError:  # an unhashable argument: no caching for this call
        entry = None
        key = None
    if entry is None:
        if func in _FETCHES:
            raise RuntimeError(
                f"{func}: the value of a podium.Tensor lives on its mesh's procs; use "
                f"podium.inspect(t) or podium.fetch_shard(t) to read it")
        entry = _propagate(func, args, kwargs, handles)
        if key is not None:
            if len(_cache) >= CACHE_LIMIT:  # a program of ever-new shapes: start over
                _cache.clear()
            _cache[key] = entry
        cache_stats["misses"] += 1
    else:
        cache_stats["hits"] += 1
    client = view.client
    if client.stream != stream.name:
        client.set_stream(stream.name)
    outs: List[Tensor] = []
    out_ids: List[int] = []
    for k, a in zip(entry.keys, entry.alias):
        h = handles[a] if a >= 0 else new_handle(view, k, stream)
        outs.append(h)
        out_ids.append(h._rid)
    mutated = [handles[i]._rid for i in entry.mutated] if entry.mutated else _NONE
    client.append(view, ("op", entry.name, out_ids, tuple(rargs), rkwargs, mutated))
    return _rebuild(entry.spec, outs)


_NONE: tuple = ()  # shared: fewer objects per command for the garbage collector to scan
_LIFT = frozenset({torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default})
_FETCHES = frozenset({torch.ops.aten._local_scalar_dense.default,
                      torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default})


def _lift(view: View, value: torch.Tensor) -> Tensor:
    """``torch.tensor(data)`` inside the block: the value travels in the command (TE-7)."""
    value = value.detach().clone()
    h = new_handle(view, meta_key(value), state.stream)
    view.client.append(view, ("lift", h._rid, value))
    return h


def _to_meta(x: Any) -> Any:
    if isinstance(x, Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(v) for v in x)
    return x


def _propagate(func: Any, args: tuple, kwargs: dict, handles: List[Tensor]) -> _Entry:
    """Runs `func` on meta tensors (TE-6): the outputs' metadata and aliasing."""
    schema = func._schema
    margs = _to_meta(args)
    mkwargs = {k: _to_meta(v) for k, v in kwargs.items()}
    device = kwargs.get("device")
    if any(a.name == "device" for a in schema.arguments):
        mkwargs["device"] = torch.device("meta")
    out_device = (torch.device(device) if device is not None
                  else handles[0].device if handles else torch.device("cpu"))
    try:
        out = func(*margs, **mkwargs)
    except NotImplementedError as e:
        raise NotImplementedError(
            f"{func} cannot run on a podium.Tensor: its output shape depends on the values "
            f"(or it has no meta implementation): {e}") from e
    metas: List[torch.Tensor] = []
    spec = _spec(out, metas)
    keys = [(tuple(m.shape), tuple(m.stride()), m.dtype, out_device) for m in metas]
    # Which input handles the op writes, and which outputs are those inputs (TE-8).
    index = {id(h): i for i, h in reversed(list(enumerate(handles)))}
    written: Dict[Any, int] = {}
    mutated: List[int] = []
    for i, a in enumerate(schema.arguments):
        info = a.alias_info
        if info is None or not info.is_write:
            continue
        v = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
        found: List[Tensor] = []
        _collect(v, found)
        for h in found:
            mutated.append(index[id(h)])
        if len(found) == 1:
            written[tuple(sorted(info.before_set))] = index[id(found[0])]
    alias = []
    for r in schema.returns:
        info = r.alias_info
        if info is not None and info.is_write:
            alias.append(written.get(tuple(sorted(info.before_set)), -1))
        else:
            alias.append(-1)
    if len(alias) != len(keys):  # a list return: no in-place aliases
        alias = [-1] * len(keys)
    extra = tuple(sorted(set(mutated) - set(alias)))  # written, yet not an output
    return _Entry(f"{schema.name}.{schema.overload_name}" if schema.overload_name
                  else schema.name, spec, keys, alias, extra)


def _collect(v: Any, out: List[Tensor]) -> None:
    if isinstance(v, Tensor):
        out.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _collect(x, out)


def _spec(out: Any, metas: List[torch.Tensor]) -> Any:
    """The structure of an op's output: an int (index of a tensor), a tuple/list of specs, or
    ("v", value) for a non-tensor."""
    if isinstance(out, torch.Tensor):
        metas.append(out)
        return len(metas) - 1
    if isinstance(out, (list, tuple)):
        return (type(out), tuple(_spec(o, metas) for o in out))
    return ("v", out)


def _rebuild(spec: Any, outs: List[Tensor]) -> Any:
    if type(spec) is int:
        return outs[spec]
    if spec[0] == "v":
        return spec[1]
    items = [_rebuild(s, outs) for s in spec[1]]
    return items if spec[0] is list else tuple(items)


# --- errors -------------------------------------------------------------------------------------


def _describe(t: torch.Tensor) -> str:
    if isinstance(t, Tensor):
        return repr(t)
    return f"local tensor(shape={tuple(t.shape)}, dtype={t.dtype}, device={t.device})"


def _bad_arguments(func: Any, args: tuple, kwargs: dict, view: Optional[View],
                   handles: List[Tensor], local: List[torch.Tensor]) -> None:
    lines = [f"Incorrect arguments to podium operation {func}:", f"  active mesh = {view}"]
    for t in local:
        lines.append(f"  {_describe(t)}: a local tensor cannot be used in an op of a mesh; "
                     "create it inside `with mesh.activate():` or move it with a remote "
                     "function")
    raise TypeError("\n".join(lines))


def _check(func: Any, args: tuple, kwargs: dict, view: View, handles: List[Tensor],
           stream: Any) -> None:
    lines = [f"Incorrect arguments to podium operation {func}:",
             f"  mesh = {view}", f"  active stream = {stream}"]
    written = set()
    try:
        schema = func._schema
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
                found: List[Tensor] = []
                _collect(v, found)
                written.update(id(h) for h in found)
    except Exception:
        pass
    bad = False
    for h in handles:
        if h._dropped:
            lines.append(f"  {_describe(h)}: was dropped (borrow.drop() or t.drop())")
            bad = True
        elif h._view is not view:
            lines.append(f"  {_describe(h)}: lives on another mesh; move it with "
                         "t.to_mesh(mesh)")
            bad = True
        elif h._stream is not stream:
            lines.append(f"  {_describe(h)}: is on {h._stream}, not the active {stream}; "
                         "borrow it with stream.borrow(t)")
            bad = True
        elif not h._access & _READ:
            lines.append(f"  {_describe(h)}: is mutably borrowed by another stream; use it "
                         "after borrow.drop()")
            bad = True
        elif id(h) in written and not h._access & _WRITE:
            lines.append(f"  {_describe(h)}: is borrowed by another stream, which may read "
                         "it: it cannot be mutated until borrow.drop()")
            bad = True
    if bad:
        raise TypeError("\n".join(lines))


# --- activation -----------------------------------------------------------------------------------


class Activation:
    """``mesh.activate()``: active from the call, as Monarch's (``with`` or ``deactivate()``)."""

    def __init__(self, view: Optional[View]) -> None:
        self._old = state.mesh
        self._view = view
        self._done = False
        state.mesh = view
        if state.mode_depth == 0:
            state.mode = _Mode()
            state.mode.__enter__()
        state.mode_depth += 1

    def __enter__(self) -> "Activation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.deactivate()

    def deactivate(self) -> None:
        if self._done:
            return
        self._done = True
        if self._view is not None:
            self._view.client.flush()
        state.mesh = self._old
        state.mode_depth -= 1
        if state.mode_depth == 0 and state.mode is not None:
            mode, state.mode = state.mode, None
            mode.__exit__(None, None, None)


def get_active_mesh() -> Any:
    """The active ProcMesh view; ValueError when none is, as Monarch's."""
    if state.mesh is None:
        raise ValueError("no device mesh is active")
    return state.mesh.proc_mesh


class _NoMesh:
    """``with podium.no_mesh.activate():`` runs torch locally inside an active mesh."""

    def activate(self) -> Activation:
        return Activation(None)


no_mesh = _NoMesh()
