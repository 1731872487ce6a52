"""Actors and tensors together: ``endpoint.rref(...)`` returns the endpoint's results as
tensor handles, and a handle passed to an endpoint of an actor on the same procs arrives as
that proc's local torch tensor.

  TE-19 ``actor_mesh.endpoint.rref(*args)`` inside ``with mesh.activate():`` (the actors on
    exactly the procs of the active mesh) is one command of the stream, ordered with the
    tensor commands (TE-1): each proc's TensorWorker calls its proc's actor and keeps what the
    endpoint returned under the handles' ids. The outputs' metadata comes from the endpoint's
    ``propagate`` (a function of the same arguments, called on fake tensors) or, without one
    (or ``"inspect"``), from the first proc's result, reported back once (the endpoint runs
    once per proc either way). A failing endpoint poisons the outputs (TE-2): a fetch raises
    RemoteException naming rank, host and the endpoint's error.
  TE-20 A handle among the arguments of ``call``, ``call_one``, ``choose``, ``stream``,
    ``broadcast``, ``send`` or ``rref`` of actors on procs that hold its value arrives as
    that proc's local torch tensor (the worker's own object, not a copy), after every command
    issued before the call has run there (the controller waits for that before sending the
    call); a failed value fails the call with RemoteException. A handle sent to actors on
    procs that do not all hold it raises TypeError at the call, naming both meshes; the call
    is not sent.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, List, Optional

import torch

from podium._src import actor_mesh as _actor_mesh
from podium._src.endpoint import check_call
from podium.tensor._client import View
from podium.tensor._fetch import RemoteException, root_point
from podium.tensor._tensor import (
    Tensor,
    _hooks as _tensor_hooks,
    _bad_arguments,
    _check,
    _rebuild,
    _scan,
    _spec,
    new_handle,
    state,
)
from podium.tensor import _worker
from podium.tensor._remote import on_fakes

# The most tensors an endpoint without `propagate` may return through rref (ids reserved).
RREF_MAX_OUTPUTS = 64
PROBE_TIMEOUT_S = 300.0

_target = threading.local()  # the actor mesh an endpoint's arguments are pickled for


def _ranks(region: tuple) -> List[int]:
    labels, offset, sizes, strides = region
    ranks = [offset]
    for size, stride in zip(sizes, strides):
        ranks = [r + i * stride for r in ranks for i in range(size)]
    return ranks


def _actor_region(actor_mesh: Any) -> tuple:
    st = actor_mesh._core.region.__getstate__()
    return (list(st[0]), st[1], list(st[2]), list(st[3]))


def _same_procs(actor_mesh: Any, view: View) -> bool:
    procs = actor_mesh._proc_mesh
    return procs is not None and procs._shared is view.proc_mesh._shared


def dumps_call(endpoint: Any, dumps: Any) -> Any:
    """Runs `dumps()` (pickling an endpoint call's arguments) with handles pickled as
    references to their local values on the procs of `endpoint`'s actors (TE-20)."""
    prev = getattr(_target, "value", None)
    _target.value = {"mesh": endpoint._mesh, "what": endpoint._what, "seq": {}}
    try:
        return dumps()
    finally:
        _target.value = prev


def reduce_handle(t: Tensor) -> Any:
    """Tensor.__reduce_ex__: a LocalValue when pickled for actors on the procs holding `t`."""
    target = getattr(_target, "value", None)
    if target is None:
        raise TypeError(
            f"{t!r} is a handle to values on its mesh's procs and cannot be pickled; read "
            "a value with podium.inspect / podium.fetch_shard, or pass it to an endpoint of "
            "actors spawned on the same procs")
    mesh = target["mesh"]
    view = t._view
    if t._dropped:
        raise TypeError(f"{t!r} was dropped: it cannot be passed to {target['what']}")
    if not _same_procs(mesh, view) or not set(_ranks(_actor_region(mesh))) <= set(
            view.base_ranks()):
        raise TypeError(
            f"{t!r} lives on {view} of its procs and cannot be sent to {target['what']} on "
            f"{mesh.name} {mesh.extent}: a tensor handle can only be passed to actors spawned "
            "on procs that hold its value (use podium.inspect/fetch_shard to send a value)")
    client = view.client
    seq = target["seq"].get(id(client))
    if seq is None:
        seq = target["seq"][id(client)] = client.mark()
        # The call leaves once the workers of the value's procs have run what came before it:
        # an rref issued earlier may be running the same actors, which must not receive this
        # call first (it would wait for that rref, and that rref for it).
        view.workers.reached.call().get(timeout=_worker.LOCAL_WAIT_TIMEOUT_S)
    return (_worker.local_value, (client.token, t._rid, seq))


def rref(endpoint: Any, args: tuple, kwargs: dict) -> Any:
    """``endpoint.rref(*args, **kwargs)`` (TE-19)."""
    mesh = endpoint._mesh
    prop = endpoint._prop
    handles: List[Tensor] = []
    local: List[torch.Tensor] = []
    _, rargs = _scan(args, handles, local)
    _, rkwargs = _scan(kwargs, handles, local)
    view: Optional[View] = state.mesh if state.mesh is not None else (
        handles[0]._view if handles else None)
    if view is None:
        raise ValueError(f"{endpoint._what}.rref() requires an active device mesh, use "
                         "`with mesh.activate():`")
    if local:
        _bad_arguments(endpoint._what, args, kwargs, view, handles, local)
    stream = state.stream
    for h in handles:
        if h._view is not view or h._stream is not stream or h._dropped or h._access != 3:
            _check(endpoint._what, args, kwargs, view, handles, stream)
    region = _actor_region(mesh)
    if not _same_procs(mesh, view) or sorted(_ranks(region)) != sorted(view.base_ranks()):
        raise ValueError(
            f"{endpoint._what}.rref(): the actors of {mesh.name} {mesh.extent} are not on "
            f"the procs of the active mesh {view}: spawn them on that mesh")
    check_call(endpoint._what, prop.signature, args, kwargs,
               port=prop._explicit_response_port)  # TypeError, as a call raises
    client = view.client
    if client.stream != stream.name:
        client.set_stream(stream.name)
    propagate = prop._propagator
    if callable(propagate):
        out = on_fakes(propagate, args, kwargs)
        metas: List[torch.Tensor] = []
        spec = _spec(out, metas)
        default = handles[0].device if handles else torch.device("cpu")
        outs = [new_handle(view, (tuple(m.shape), tuple(m.stride()), m.dtype,
                                  default if m.device.type == "meta" else m.device), stream)
                for m in metas]
        client.append(view, ("actor", mesh, endpoint._name, [o._rid for o in outs], rargs,
                             rkwargs, region, None))
        return _rebuild(spec, outs)
    if propagate not in (None, "inspect"):
        raise NotImplementedError(
            f"{endpoint._what}.rref(): propagate={propagate!r} is not supported for actor "
            "endpoints: pass a function of the endpoint's arguments, 'inspect', or none")
    # No propagate: the first proc reports the structure of its result (probe).
    first_id = client.next_id
    client.next_id = first_id + RREF_MAX_OUTPUTS
    ids = list(range(first_id, first_id + RREF_MAX_OUTPUTS))
    first = view.root_rank({label: 0 for label in view.labels})
    client.append(view, ("actor", mesh, endpoint._name, ids, rargs, rkwargs, region, first))
    client.flush()
    worker = client.workers.slice(**root_point(view, first))
    ok, got = worker.rref_spec.call_one(first_id).get(timeout=PROBE_TIMEOUT_S)
    if not ok:
        client.append(view, ("del", ids))
        raise RemoteException(got, f"{endpoint._what}.rref(): the endpoint failed on the "
                                   "first proc of the mesh (its result gives the outputs' "
                                   "metadata; pass propagate= to the endpoint to defer "
                                   "failures to fetches).")
    spec, keys = got
    if len(keys) < RREF_MAX_OUTPUTS:
        client.append(view, ("del", ids[len(keys):]))
    outs = [new_handle(view, k, stream, rid=first_id + i) for i, k in enumerate(keys)]
    return _rebuild(spec, outs)


# The hooks through which podium's actor calls and handles reach this module (no import of
# torch in podium._src.actor_mesh, no import cycle in this package).
_tensor_hooks["reduce_handle"] = reduce_handle
_actor_mesh.tensor_calls = sys.modules[__name__]
