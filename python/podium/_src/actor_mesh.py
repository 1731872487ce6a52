"""ActorMesh and its endpoints' adverbs: call, call_one, choose, stream, broadcast; send(),
as_endpoint(), Accumulator.

A call message carries, after the C++ CallHeader: a meta part, then the pickled (args, kwargs)
and their out-of-band buffers. The meta part is empty, or a pickled dict with ``rank`` (for
calls sent to one rank on behalf of a wider mesh — choose, stream, send(selection="choose") —
the (rank, labels, sizes) the actor should see as current_rank()) and/or ``raw`` (the method
is not decorated: as_endpoint(); the value says whether it takes an explicit response port).

A reply carries the pickled ``(True, value)``, ``(False, exception)`` (Port.exception: the
caller raises that exception) or ``(False, exception, message, remote traceback)`` (the
endpoint raised: the caller raises ActorError).
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Dict, Generic, Iterator, List, Optional, Tuple, TypeVar

from podium._core import mesh as _mesh
from podium._core import ndslice as _nd
from podium._core.base import ActorErrc as _ActorErrc
from podium._src import call_stats, errors, pickling
from podium._src.endpoint import (
    check_call,
    endpoints_of,
    EndpointProperty,
    NotAnEndpoint,
)
from podium._src.future import Future
from podium._src.port_ref import _DROP, Port
from podium._src.runtime import ensure_runtime
from podium._src.shape import MeshShape, RunValues, select, shareable, ValueMesh

R = TypeVar("R")
T = TypeVar("T")
A = TypeVar("A")

# Set by podium.tensor._actors when the tensor engine loads (it needs torch, which this module
# must not import): how calls carry tensor handles (TE-20) and Endpoint.rref (TE-19).
tensor_calls: Any = None

_NO_META = b""
# ActorMesh.stop(): how long an actor may take to stop before its proc is killed.
STOP_GRACE_S = 10.0


def _undecodable(e: BaseException, endpoint: "Endpoint[Any]", rank: int) -> Exception:
    """What the caller raises for a reply of ``rank`` that it cannot unpickle (EP-4): a
    ReplyDecodeError that names the actor mesh, the endpoint and the actor's rank."""
    mesh = endpoint._mesh
    error = errors.ReplyDecodeError(e, endpoint._where(rank), mesh.name, endpoint._name,
                                    mesh._core.rank_info(rank)[3])
    return error


# The errors of a call whose actor failed or whose proc exited: its owner's __supervise__ runs
# before the owner's own code sees them (supervision.py, SV-7).
_CHILD_FAILED = {_ActorErrc.ACTOR_FAILED: "actor", _ActorErrc.PROC_EXITED: "proc"}


def _decode_reply(ok: bool, payload: Any, endpoint: "Endpoint[Any]", rank: int) -> Any:
    """The value of rank ``rank``'s reply, or raises its exception (a SupervisionError with
    the failed actor's place). The one place where a caller unpickles what an endpoint
    answered: what unpickling raises becomes ReplyDecodeError (EP-4), but a
    KeyboardInterrupt, which may be the user's Ctrl-C, stays one."""
    if not ok:
        subsystem, code, message = payload
        e = endpoint._locate(rank)(errors.from_reply(subsystem, code, message, endpoint._name))
        kind = _CHILD_FAILED.get(errors.errc(subsystem, code))
        if kind is not None:  # its owner supervises it first (SV-7)
            e._child_failure = kind
        raise e
    try:
        reply = pickling.loads(payload)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # SystemExit from a __setstate__ included
        raise _undecodable(e, endpoint, rank) from e
    if reply[0]:
        return reply[1]
    if len(reply) == 2:  # Port.exception(e) of an explicit response port
        raise reply[1]
    _, exc, message, tb = reply
    raise errors.ActorError(exc, f"{message} ({endpoint._where(rank)})", tb)


def _decode_single(fut: Any, endpoint_rank: Tuple["Endpoint[Any]", int]) -> Any:
    """Decoder of the futures of call_one() and choose()."""
    ((ok, payload),) = fut.replies()
    endpoint, rank = endpoint_rank
    return _decode_reply(ok, payload, endpoint, rank)


def _decode_none(core: Any) -> None:
    """Decoder of futures that carry no value (initialized, stop)."""
    for ok, payload in core.replies():  # a C++ error raises errors.from_core's exception
        if not ok:
            raise errors.from_reply(*payload)


def _decode_initialized(core: Any) -> None:
    """Decoder of ``ActorMesh.initialized``: an actor whose ``__init__`` raised raises
    ActorInitError (an ActorError and a SupervisionError, MW-2)."""
    try:
        _decode_none(core)
    except errors.SupervisionError as e:
        raise errors.init_failure(e) from None


def _decode_bootstrap(core: Any) -> None:
    """Decoder of ``ProcMesh.initialized`` when it ran a bootstrap function: the function
    raising fails the actor that runs it in its constructor, which the caller sees as
    ActorError, as in Monarch (MW-2); a proc that ended stays a SupervisionError."""
    try:
        _decode_none(core)
    except errors.SupervisionError as e:
        if getattr(e, "errc", None) is not errors.ActorErrc.ACTOR_FAILED:
            raise
        raise errors.ActorError(e, "the bootstrap function of a proc raised", f"{e}\n") from e


def _rebuild_actor_mesh(cls: type, state: tuple) -> "ActorMesh[Any]":
    ensure_runtime()
    return ActorMesh(cls, _mesh.ActorMesh.from_state(*state), None)


def _ranks_of(core: Any, rank: Optional[int]) -> Callable[[], List[int]]:
    """The base ranks (in the mesh spawned) of region rank ``rank`` (None: every rank),
    computed when a snapshot asks (call_stats, DS-1)."""
    if rank is None:
        return lambda: [core.rank_info(r)[3] for r in range(core.region.num_ranks)]
    return lambda: [core.rank_info(rank)[3]]


def _track(core: Any, core_future: Any, rank: Optional[int]) -> None:
    call_stats.call(core.name, 1 if rank is not None else core.region.num_ranks, core_future,
                    _ranks_of(core, rank))


class ActorMesh(MeshShape, Generic[T]):
    """Actors of one class, one per proc of the mesh they were spawned on. Endpoints are
    attributes: ``mesh.method.call(...)``. Picklable: pass it to an actor, or return it from an
    endpoint, and call it from there."""

    def __init__(self, cls: type, core: Any, proc_mesh: Any) -> None:
        self._class = cls
        self._core = core
        self._proc_mesh = proc_mesh

    @property
    def _region(self) -> "_nd.Region":
        return self._core.region

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def initialized(self) -> "Future[None]":
        """Resolves when every actor's __init__ has run; raises if one failed."""
        return Future(self._core.initialized(), _decode_initialized)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        ep = endpoints_of(self._class).get(name)
        if ep is None:
            if callable(getattr(self._class, name, None)):
                return NotAnEndpoint(self, name)
            raise AttributeError(f"{self._class.__qualname__} has no endpoint '{name}'")
        # Kept on the instance: the next `mesh.name` finds it without __getattr__.
        endpoint = self.__dict__[name] = Endpoint(self, name, ep)
        return endpoint

    def slice(self, **kwargs: Any) -> "ActorMesh[T]":
        """``slice(gpus=1)`` removes the dimension, ``slice(gpus=slice(0, 2))`` keeps it."""
        return ActorMesh(self._class, select(self._core, kwargs), self._proc_mesh)

    def _reshaped(self, op: Callable[[Any], Any]) -> "ActorMesh[T]":
        return ActorMesh(self._class, op(self._core), self._proc_mesh)

    def stop(self) -> "Future[None]":
        """Stops the actors of this mesh after the messages queued before the stop: each stops
        the meshes it spawned, then runs ``__cleanup__``; later calls raise
        SupervisionError. An actor still not stopped after ``STOP_GRACE_S`` (hung in an
        endpoint) has its proc killed, and a warning says so."""
        return Future(self._core.stop(int(STOP_GRACE_S * 1000)), _decode_none)

    def __await__(self):
        """``await procs.spawn(...)``, the older spelling of Monarch's examples: the mesh,
        once every actor's ``__init__`` has run (raises as ``initialized`` does)."""
        return self._initialized_mesh().__await__()

    async def _initialized_mesh(self) -> "ActorMesh[T]":
        await self.initialized
        return self

    def __reduce__(self):
        return (_rebuild_actor_mesh, (self._class, tuple(self._core.state())))

    def __repr__(self) -> str:
        return f"<ActorMesh {self.name} of {self._class.__qualname__} {self.extent}>"


class Endpoint(Generic[R]):
    """One endpoint of an ActorMesh, with its adverbs."""

    def __init__(
        self, mesh: ActorMesh[Any], name: str, prop: EndpointProperty, raw: bool = False
    ) -> None:
        self._mesh = mesh
        self._name = name
        self._prop = prop
        self._raw = raw  # not decorated: made an endpoint by as_endpoint()

    @property
    def _what(self) -> str:
        what = self.__dict__.get("_what_text")
        if what is None:
            what = self._what_text = f"{self._mesh._class.__qualname__}.{self._name}()"
        return what

    def _parts(self, args: tuple, kwargs: dict) -> List[Any]:
        prop = self._prop
        if kwargs or not prop.takes_positional(len(args)):
            check_call(self._what, prop.signature, args, kwargs,
                       port=prop._explicit_response_port)
        if tensor_calls is not None:  # handles among the arguments (TE-20)
            return tensor_calls.dumps_call(
                self, lambda: pickling.dumps_call(self._what, args, kwargs))
        return pickling.dumps_call(self._what, args, kwargs)

    def _where(self, rank: int) -> str:
        """Rank ``rank`` of the called region as the actor's rank and coordinates in the mesh
        it was spawned on (as SupervisionError and MeshFailure name it), and its host."""
        _, _, host, base, point = self._mesh._core.rank_info(rank)
        return f"{self._mesh.name} rank {base} {point}, host {host}"

    def _locate(self, rank: int) -> Callable[[Exception], Exception]:
        """Names the mesh, actor, rank, coordinates, host and pid in a SupervisionError."""
        mesh = self._mesh

        def locate(e: Exception) -> Exception:
            procs = mesh._proc_mesh
            return errors.located(e, mesh.name, mesh._class.__qualname__,
                                  mesh._core.rank_info(rank),
                                  procs is not None and procs._shared.stopped)

        return locate

    def _meta(self, rank: Optional[int] = None) -> bytes:
        if rank is None and not self._raw:
            return _NO_META
        meta: Dict[str, Any] = {}
        if rank is not None:
            e = self._mesh._core.region.extent
            meta["rank"] = (rank, list(e.labels), list(e.sizes))
        if self._raw:
            meta["raw"] = self._prop._explicit_response_port
        return pickle.dumps(meta)

    def _call(self, args: tuple, kwargs: dict, then: Optional[Callable[[Any], Any]] = None
              ) -> "Future[Any]":
        parts = self._parts(args, kwargs)
        core = self._mesh._core
        region_extent = core.region.extent
        name = self._name

        def decode(fut: Any) -> Any:
            # One decode per run of equal replies (ME-9); a value that the run's ranks cannot
            # share safely (a mutable object) is decoded again for each of them.
            runs = []
            rank = 0
            for count, ok, payload in fut.reply_runs():
                value = _decode_reply(ok, payload, self, rank)
                if count == 1 or shareable(value):
                    runs.append((count, value))
                else:
                    runs.append((1, value))
                    runs.extend((1, _decode_reply(ok, payload, self, rank + k))
                                for k in range(1, count))
                rank += count
            vm = ValueMesh._from_values(list(region_extent.labels), list(region_extent.sizes),
                                        RunValues(runs))
            return vm if then is None else then(vm)

        cf = core.call(name, [self._meta(), *parts])
        _track(core, cf, None)
        return Future(cf, decode)

    def call(self, *args: Any, **kwargs: Any) -> "Future[ValueMesh[R]]":
        """Every actor of the mesh runs the endpoint; the future resolves to a ValueMesh of the
        results, or raises ActorError if any raised."""
        return self._call(args, kwargs)

    def call_one(self, *args: Any, **kwargs: Any) -> "Future[R]":
        """Calls the one actor of this mesh; ValueError at once if it holds several."""
        n = len(self._mesh)
        if n != 1:
            raise ValueError(
                f"call_one() needs a mesh of exactly one actor; {self._mesh.name} has {n} in "
                f"{self._mesh.extent}: slice it first, or use call() or choose()"
            )
        parts = self._parts(args, kwargs)
        parts.insert(0, self._meta())
        core = self._mesh._core
        cf = core.call(self._name, parts)
        _track(core, cf, 0)
        return self._single(cf, 0)

    def choose(self, *args: Any, **kwargs: Any) -> "Future[R]":
        """One actor of the mesh runs the endpoint: the one with the fewest calls
        outstanding."""
        parts = self._parts(args, kwargs)
        core = self._mesh._core
        rank = core.least_loaded_rank()
        cf = core.call_rank(rank, self._name, [self._meta(rank), *parts])
        _track(core, cf, rank)
        return self._single(cf, rank)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator["Future[R]"]:
        """Calls every actor at once; yields one future per actor, in the order the replies
        arrive."""
        parts = self._parts(args, kwargs)
        core = self._mesh._core
        per_rank = [[self._meta(r), *parts] for r in range(len(self._mesh))]
        name = self._name

        def decode(fut: Any) -> R:
            ((ok, payload),) = fut.replies()
            return _decode_reply(ok, payload, self, fut.rank())

        futures = core.stream(name, per_rank)
        call_stats.sent(core.name, len(futures))
        for f in futures:  # the reply of a rank not known before it arrives
            call_stats.call(core.name, 0, f, None)
        return iter([Future(f, decode) for f in futures])

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Fire and forget to every actor of the mesh. An exception there fails the actor."""
        parts = self._parts(args, kwargs)
        core = self._mesh._core
        core.broadcast(self._name, [self._meta(), *parts])
        call_stats.sent(core.name, core.region.num_ranks)

    def _send(self, args: tuple, kwargs: dict, port: Any = None, selection: str = "all") -> None:
        """See send()."""
        if port is not None and not isinstance(port, Port):
            raise TypeError(f"send(port=...) takes a Port, not {type(port).__name__}")
        if selection not in ("all", "choose"):
            raise ValueError(f"send(selection=...) is 'all' or 'choose', not {selection!r}")
        parts = self._parts(args, kwargs)
        core = self._mesh._core
        reply = "" if port is None or port._kind == _DROP else port._port_id
        if selection == "all":
            core.cast_to_port(self._name, [self._meta(), *parts], reply, None)
            call_stats.sent(core.name, core.region.num_ranks)
        else:
            rank = core.least_loaded_rank()
            core.cast_to_port(self._name, [self._meta(rank), *parts], reply, rank)
            call_stats.sent(core.name, 1)

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Inside ``with mesh.activate():``, with these actors on the procs of the active mesh:
        each proc's actor runs the endpoint in the order of the tensor commands, and the
        result is a tensor handle (a pytree of them) of what each returned (docs/tensor.md)."""
        if tensor_calls is None:
            raise RuntimeError(f"{self._what}.rref() needs the tensor engine: call it inside "
                               "`with mesh.activate():` (docs/tensor.md)")
        return tensor_calls.rref(self, args, kwargs)

    def _single(self, core_future: Any, rank: int) -> "Future[R]":
        return Future(core_future, _decode_single, (self, rank))

    def __repr__(self) -> str:
        return f"<Endpoint {self._what} on {self._mesh.name}>"


def send(
    endpoint: Endpoint[R],
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    port: Any = None,
    selection: str = "all",
) -> None:
    """Fire and forget: sends ``endpoint(*args, **kwargs)`` to every actor of its mesh
    (``selection="all"``) or to one (``"choose"``, the least loaded). With ``port``, each
    actor's result (or exception) is sent to that Port, where its PortReceiver gets it;
    without, the results are dropped and an exception fails the actor."""
    if not isinstance(endpoint, Endpoint):
        raise TypeError(f"send() takes an endpoint of an actor mesh, not {endpoint!r}")
    endpoint._send(tuple(args), dict(kwargs or {}), port, selection)


def as_endpoint(
    not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False
) -> Endpoint[Any]:
    """Calls a method that is not decorated with @endpoint as if it were one:
    ``as_endpoint(mesh.helper).call(...)``."""
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError(
            "as_endpoint() expects a method of a spawned actor mesh that is not an endpoint "
            f"(mesh.method), not {not_an_endpoint!r}"
        )
    mesh = not_an_endpoint._ref
    method = getattr(mesh._class, not_an_endpoint._name)
    prop = EndpointProperty(method, explicit_response_port=explicit_response_port,
                            propagate=propagate)
    return Endpoint(mesh, not_an_endpoint._name, prop, raw=True)


class Accumulator(Generic[R, A]):
    """Folds the results of calling an endpoint on every actor of its mesh:
    ``Accumulator(mesh.value, 0, operator.add).accumulate()`` is a Future of the sum."""

    def __init__(self, endpoint: Endpoint[R], identity: A,
                 combine: Callable[[A, R], A]) -> None:
        if not isinstance(endpoint, Endpoint):
            raise TypeError(f"Accumulator takes an endpoint of an actor mesh, not {endpoint!r}")
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: Any, **kwargs: Any) -> "Future[A]":
        """Calls the endpoint on every actor with these arguments; the Future resolves to
        ``combine(...combine(combine(identity, r0), r1)..., rN)`` over the replies in rank
        order, or raises ActorError if any actor raised."""
        identity, combine = self._identity, self._combine

        def fold(vm: ValueMesh[R]) -> A:
            acc = identity
            for v in vm.values():
                acc = combine(acc, v)
            return acc

        return self._endpoint._call(args, kwargs, fold)


def check_endpoint_names(cls: type) -> None:
    """ValueError, as Monarch's, for an endpoint of ``cls`` that an ActorMesh attribute would
    hide: ``mesh.slice`` is the mesh's own method, so an endpoint named ``slice`` (or
    ``stop``, ``name``, ``size``, ...) could never be called. Checked at spawn."""
    for name in sorted(endpoints_of(cls)):
        if not name.startswith("_") and hasattr(ActorMesh, name):
            raise ValueError(
                f"ActorMesh has an attribute that collides with an endpoint name: "
                f"attribute={name}, ActorMesh.{name}={getattr(ActorMesh, name)!r}, endpoint "
                f"{cls.__qualname__}.{name}; rename the endpoint")
