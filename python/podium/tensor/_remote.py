"""``remote(fn)``: user functions run on the workers; the mesh methods ProcMesh gains
(``activate``, ``rank_tensor``, ``rank_tensors``, ``to_table``).

  TE-13 ``remote(fn)(*args)`` runs ``fn`` on every proc of the mesh of its tensor arguments
    (else the active mesh), with each handle replaced by that proc's value; it returns handles
    for the tensors ``fn`` returns, whose metadata comes from ``propagate`` (a function of the
    same arguments, called on fake tensors; ``"inspect"``: ``fn`` run once on the mesh's first
    proc, its result dropped; ``"cached"``: the same, once per input metadata), or by
    default from ``fn`` itself on fake tensors. ``fn`` travels by reference (a function of an
    importable module, or an import path string); one defined in ``__main__`` or a closure
    travels by value.
  TE-14 ``mesh.rank_tensor(dim)`` is a 0-dim int64 tensor whose value on each proc is that
    proc's coordinate along ``dim`` of that mesh view (several dims: the row-major rank over
    them); ``rank_tensors()`` maps every dimension to its rank tensor.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import cloudpickle
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes

from podium.tensor._client import View, view_of
from podium.tensor._fetch import RemoteException, root_point
from podium.tensor._tensor import (
    Activation,
    Tensor,
    _bad_arguments,
    _check,
    _rebuild,
    _scan,
    _spec,
    new_handle,
    state,
)
from podium.tensor._worker import resolve_function


PROBE_TIMEOUT_S = 300.0


def _by_value(fn: Callable[..., Any]) -> bool:
    return (getattr(fn, "__module__", None) == "__main__"
            or "<locals>" in getattr(fn, "__qualname__", "")
            or "<lambda>" in getattr(fn, "__qualname__", ""))


def on_fakes(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``fn`` called with every handle in ``args``/``kwargs`` replaced by a fake tensor of its
    metadata (how `propagate` functions give output metadata: TE-13, TE-19)."""
    with _disable_current_modes():
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            def fake(x: Any) -> Any:
                if isinstance(x, Tensor):
                    return mode.from_tensor(torch.empty_strided(
                        x.shape, x.stride(), dtype=x.dtype, device="meta"))
                if isinstance(x, (list, tuple)):
                    return type(x)(fake(v) for v in x)
                if isinstance(x, dict):
                    return {k: fake(v) for k, v in x.items()}
                return x

            return fn(*fake(args), **fake(kwargs))


class Remote:
    """A function that runs on the workers (TE-13)."""

    def __init__(self, fn: Any, propagate: Any = None) -> None:
        if propagate == "mocked":
            raise NotImplementedError(
                "remote(propagate='mocked') is not supported by podium: pass a function that "
                "computes the outputs from fake inputs, 'inspect', 'cached', or none (fn runs "
                "on fake tensors)")
        self._cached: Dict[Any, Any] = {}
        self._fn = fn
        self._propagate = propagate
        self._local: Optional[Callable[..., Any]] = None
        if isinstance(fn, str):
            self._sent: Any = fn
        elif _by_value(fn):
            self._sent = cloudpickle.dumps(fn)
        else:
            self._sent = fn

    def _impl(self) -> Callable[..., Any]:
        if self._local is None:
            self._local = resolve_function(self._fn) if isinstance(self._fn, str) else self._fn
        return self._local

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        handles: List[Tensor] = []
        local: List[torch.Tensor] = []
        _, rargs = _scan(args, handles, local)
        _, rkwargs = _scan(kwargs, handles, local)
        view: Optional[View] = handles[0]._view if handles else state.mesh
        if view is None:
            raise ValueError("Remote functions require an active device mesh, use "
                             "`with mesh.activate():`")
        if local:
            _bad_arguments(self._fn, args, kwargs, view, handles, local)
        stream = state.stream
        for h in handles:
            if h._view is not view or h._stream is not stream or h._dropped or h._access != 3:
                _check(self._fn, args, kwargs, view, handles, stream)
        if self._propagate in ("inspect", "cached"):
            spec, keys = self._probed(view, rargs, rkwargs, args, kwargs, handles)
        else:
            out = self._fake_outputs(args, kwargs, handles)
            metas: List[torch.Tensor] = []
            spec = _spec(out, metas)
            default = handles[0].device if handles else torch.device("cpu")
            keys = [(tuple(m.shape), tuple(m.stride()), m.dtype,
                     default if m.device.type == "meta" else m.device) for m in metas]
        client = view.client
        if client.stream != stream.name:
            client.set_stream(stream.name)
        outs = [new_handle(view, k, stream) for k in keys]
        client.append(view, ("call", self._sent, [o._rid for o in outs], rargs, rkwargs))
        return _rebuild(spec, outs)

    def _probed(self, view: View, rargs: Any, rkwargs: Any, args: tuple, kwargs: dict,
                handles: List[Tensor]) -> Any:
        """propagate="inspect": the function runs once on the first proc of the mesh (its
        result dropped) to learn the outputs' metadata; "cached": once per input metadata."""
        key = None
        if self._propagate == "cached":
            key = tuple(h._key for h in handles)
            hit = self._cached.get(key)
            if hit is not None:
                return hit
        client = view.client
        client.flush()
        first = view.root_rank({label: 0 for label in view.labels})
        payload = cloudpickle.dumps((self._sent, rargs, rkwargs))
        ok, got = client.workers.slice(**root_point(view, first)).probe.call_one(
            payload).get(timeout=PROBE_TIMEOUT_S)
        if not ok:
            raise RemoteException(got, "remote(propagate='inspect'): the function failed "
                                       "on the first proc of the mesh.")
        if key is not None:
            self._cached[key] = got
        return got

    def _fake_outputs(self, args: tuple, kwargs: dict, handles: List[Tensor]) -> Any:
        fn = self._propagate if self._propagate is not None else self._impl()
        return on_fakes(fn, args, kwargs)

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """As calling it (Monarch's name for the handle-returning call)."""
        return self(*args, **kwargs)


def remote(function: Any = None, *, propagate: Any = None) -> Any:
    """``remote(fn)``, ``remote("pkg.mod.fn", propagate=...)``, or ``@remote(propagate=...)``."""
    if function is None:
        return lambda fn: Remote(fn, propagate)
    return Remote(function, propagate)


# --- the methods ProcMesh gains ----------------------------------------------------------------


def activate(proc_mesh: Any) -> Activation:
    """``with mesh.activate():`` (TE-7); starts the workers at the first activation."""
    return Activation(view_of(proc_mesh))


def rank_tensor(proc_mesh: Any, dims: "str | Sequence[str]") -> Tensor:
    """TE-14."""
    view = view_of(proc_mesh)
    names = [dims] if isinstance(dims, str) else list(dims)
    for d in names:
        if d not in view.labels:
            raise KeyError(f"{view} does not have dimension {d!r}")
    h = new_handle(view, ((), (), torch.long, torch.device("cpu")), state.stream)
    view.client.append(view, ("rank", h._rid, view.region, names))
    return h


def rank_tensors(proc_mesh: Any) -> Dict[str, Tensor]:
    """TE-14."""
    return {d: rank_tensor(proc_mesh, d) for d in view_of(proc_mesh).labels}


def to_table(proc_mesh: Any) -> str:
    """The mesh as a grid (up to 3 dimensions, as Monarch's): each cell names the proc at
    those coordinates as ``<host>.gpu[<proc on the host>]``."""
    region = proc_mesh._region
    labels = list(region.extent.labels)
    sizes = list(region.extent.sizes)
    if len(labels) > 3:
        raise ValueError("to_table: a mesh of at most 3 dimensions")
    root_sizes = list(proc_mesh._core.state()[1])
    per_host = root_sizes[-1] if root_sizes else 1
    ranks = list(region.base_ranks())
    while len(sizes) < 3:
        sizes.insert(0, 1)
        labels.insert(0, "")
    cells = [f"{r // per_host}.gpu[{r % per_host}]" for r in ranks]
    depth, rows, cols = sizes
    out: List[str] = []
    k = 0
    width = max([len(c) for c in cells] + [len(str(cols))])
    for d in range(depth):
        if labels[0]:
            out.append(f"{labels[0]}: {d}")
        head = " " * (len(str(rows)) + 3) + " | ".join(f"{j:>{width}}" for j in range(cols))
        if labels[2]:
            out.append(f"{' ' * (len(str(rows)) + 3)}{labels[2]}")
        out.append(head)
        rule = "-" * len(head)
        out.append(rule)
        for i in range(rows):
            row = cells[k:k + cols]
            k += cols
            prefix = f"{i:>{len(str(rows))}} | " if labels[1] else " " * (len(str(rows)) + 3)
            out.append(prefix + " | ".join(f"{c:>{width}}" for c in row))
        out.append(rule)
    if labels[1]:
        out.insert(0, f"rows: {labels[1]}")
    return "\n".join(out)
