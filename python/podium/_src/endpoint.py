"""Actor, @endpoint, @concurrent_endpoint, and the checks made on an actor class before it is
spawned."""

from __future__ import annotations

import functools
import inspect
import logging
import types
import weakref
from typing import Any, Callable, Dict, Optional


class Actor:
    """Base class of podium actors. Endpoints are methods decorated with @endpoint; they are
    either all ``def`` or all ``async def`` within one class.

    Optional hooks: ``__cleanup__(self, exc)`` runs when the actor stops (``exc`` is None for
    a requested stop)."""

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """A logger named after the actor's class, at level DEBUG, as Monarch's; its records
        carry the ``[actor=...]`` prefix (LG-1)."""
        lgr = logging.getLogger(type(self).__name__)
        lgr.setLevel(logging.DEBUG)
        return lgr

    @classmethod
    def options(cls, **opts: Any) -> Any:
        """Service options, as TorchForge's: ``MyActor.options(procs=1, num_replicas=2)
        .as_service(*args)`` starts a service (podium.service, docs/services.md)."""
        if _service_options is None:
            raise RuntimeError("services need podium.service (import podium.actor first)")
        return _service_options(cls, opts)


# podium._src.service's ServiceOptions maker, handed in by it when imported (it sits above).
_service_options: Optional[Callable[[type, Dict[str, Any]], Any]] = None


def set_service_options(fn: Callable[[type, Dict[str, Any]], Any]) -> None:
    global _service_options
    _service_options = fn


class EndpointProperty:
    """What @endpoint puts on the class. On an actor instance (inside the actor) it is the
    plain bound method; on an ActorMesh it becomes an Endpoint with the adverbs.

    ``explicit_response_port``: the method takes a Port as its first argument after self and
    answers through it (its return value is ignored). ``concurrent``: an async method whose
    calls may overlap with the actor's other calls."""

    def __init__(
        self,
        method: Callable[..., Any],
        *,
        explicit_response_port: bool = False,
        concurrent: bool = False,
        propagate: Any = None,
        instrument: bool = True,
    ) -> None:
        if isinstance(method, EndpointProperty):
            raise ValueError("@endpoint is applied twice to the same method")
        if not callable(method):
            raise TypeError(f"@endpoint decorates a method, not {type(method).__name__}")
        self._method = method
        self._name = getattr(method, "__name__", "endpoint")
        self._is_async = inspect.iscoroutinefunction(method)
        self._explicit_response_port = bool(explicit_response_port)
        self._concurrent = bool(concurrent)
        self._propagator = propagate
        self._instrument = instrument
        self._signature: Optional[inspect.Signature] = None
        self._arity: Optional[tuple] = None
        functools.update_wrapper(self, method)

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @property
    def signature(self) -> inspect.Signature:
        if self._signature is None:
            self._signature = inspect.signature(self._method)
        return self._signature

    def takes_positional(self, n: int) -> bool:
        """True when a call with ``n`` positional arguments and no keyword arguments surely
        fits the signature (the fast path of check_call; False means: bind to find out)."""
        arity = self._arity
        if arity is None:
            arity = self._arity = _positional_arity(self.signature,
                                                    2 if self._explicit_response_port else 1)
        return arity[0] <= n <= arity[1]

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self._method, instance)


def endpoint(
    method: Optional[Callable[..., Any]] = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Marks an actor method as an endpoint: ``@endpoint``, ``@endpoint()`` or
    ``@endpoint(explicit_response_port=True)`` (the method then takes a Port as its first
    argument after self, and the caller's future resolves with what is sent to it)."""
    if method is None:
        return functools.partial(
            endpoint,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
        )
    return EndpointProperty(
        method,
        explicit_response_port=explicit_response_port,
        propagate=propagate,
        instrument=instrument,
    )


def concurrent_endpoint(
    method: Optional[Callable[..., Any]] = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Marks an ``async def`` actor method as an endpoint whose calls may run while the
    actor's other calls are in progress (they overlap at every ``await``). Calls of plain
    endpoints of the same actor still run one at a time, in arrival order."""
    if method is None:
        return functools.partial(
            concurrent_endpoint,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
        )
    if isinstance(method, EndpointProperty):
        raise ValueError(
            "@concurrent_endpoint does not wrap @endpoint: use @concurrent_endpoint alone"
        )
    if not inspect.iscoroutinefunction(method):
        raise ValueError(
            f"@concurrent_endpoint can only wrap async endpoints; "
            f"{getattr(method, '__qualname__', method)!s} is not `async def`"
        )
    return EndpointProperty(
        method,
        explicit_response_port=explicit_response_port,
        concurrent=True,
        propagate=propagate,
        instrument=instrument,
    )


class NotAnEndpointError(AttributeError, RuntimeError):
    """A method of an actor that is not an endpoint was called on an ActorMesh."""


class NotAnEndpoint:
    """What an ActorMesh gives for a method of its class that is not an endpoint: calling it
    (or one of its adverbs) raises; ``as_endpoint(mesh.method)`` turns it into an Endpoint."""

    def __init__(self, mesh: Any, name: str) -> None:
        self._ref = mesh
        self._name = name

    def _error(self) -> NotAnEndpointError:
        cls = self._ref._class.__qualname__
        return NotAnEndpointError(
            f"{cls}.{self._name} is not an endpoint: decorate it with @endpoint to call it on "
            f"an actor mesh, or wrap it: as_endpoint(mesh.{self._name}).call(...)"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._error()

    def __getattr__(self, name: str) -> Any:
        if name in ("call", "call_one", "choose", "stream", "broadcast", "rref"):
            raise self._error()
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<not an endpoint: {self._ref._class.__qualname__}.{self._name}>"


_endpoints: "weakref.WeakKeyDictionary[type, Dict[str, EndpointProperty]]" = (
    weakref.WeakKeyDictionary()
)


def endpoints_of(cls: type) -> Dict[str, EndpointProperty]:
    """The endpoints of ``cls`` by name, the most derived definition winning."""
    found = _endpoints.get(cls)
    if found is None:
        found = _endpoints[cls] = _collect_endpoints(cls)
    return found


def _collect_endpoints(cls: type) -> Dict[str, EndpointProperty]:
    found: Dict[str, EndpointProperty] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointProperty):
                found[name] = value
            elif name in found:
                del found[name]  # overridden by a plain attribute
    return found


def check_actor_class(cls: Any) -> bool:
    """Raises TypeError for a non-Actor, ValueError for a class that mixes sync and async
    endpoints (or an async class with a sync ``__cleanup__``, and the reverse; a sync class
    with an async ``__supervise__``), as Monarch's; returns True when the endpoints are async.
    (Endpoint names an ActorMesh attribute would hide: actor_mesh.check_endpoint_names.)"""
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(f"spawn needs a subclass of podium.actor.Actor, not {cls!r}")
    eps = endpoints_of(cls)
    sync = sorted(n for n, e in eps.items() if not e._is_async)
    asyn = sorted(n for n, e in eps.items() if e._is_async)
    # The texts open with Monarch's words (MW-2).
    if sync and asyn:
        raise ValueError(
            f"{cls.__qualname__} mixes both async and sync endpoints: sync {sync}, async "
            f"{asyn}; an actor's endpoints must be all `def` or all `async def`"
        )
    supervise = getattr(cls, "__supervise__", None)
    if sync and supervise is not None and inspect.iscoroutinefunction(supervise):
        raise ValueError(
            f"{cls.__qualname__} has sync endpoints, but an async __supervise__; make "
            f"__supervise__ a plain `def` too (sync {sync})"
        )
    cleanup = getattr(cls, "__cleanup__", None)
    if cleanup is not None:
        async_cleanup = inspect.iscoroutinefunction(cleanup)
        if sync and async_cleanup:
            raise ValueError(
                f"{cls.__qualname__} has sync endpoints, but an async __cleanup__; make "
                f"__cleanup__ a plain `def` too (sync {sync})"
            )
        if asyn and not async_cleanup:
            raise ValueError(
                f"{cls.__qualname__} has async endpoints, but a synchronous __cleanup__; make "
                f"__cleanup__ `async def` too (async {asyn})"
            )
        if not sync and not asyn and async_cleanup:
            return True
    return bool(asyn)


def _positional_arity(signature: inspect.Signature, skip: int) -> tuple:
    """(least, most) positional arguments that bind without keywords, after the first
    ``skip`` parameters (self, and the port); (1, 0), which nothing fits, when a keyword-only
    parameter is required or the first ones are not positional."""
    params = list(signature.parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(params) < skip or any(p.kind not in positional for p in params[:skip]):
        return (1, 0)
    least, most = 0, 0
    for p in params[skip:]:
        if p.kind in positional:
            most += 1
            if p.default is inspect.Parameter.empty:
                least = most
        elif p.kind is inspect.Parameter.VAR_POSITIONAL:
            most = 1 << 30
        elif p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty:
            return (1, 0)
    return (least, most)


def check_call(
    what: str, signature: inspect.Signature, args: tuple, kwargs: dict, port: bool = False
) -> None:
    """TypeError, naming ``what``, when (self, [port,] *args, **kwargs) does not fit
    ``signature``."""
    try:
        if port:
            signature.bind(None, None, *args, **kwargs)
        else:
            signature.bind(None, *args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{what}: {e}") from None


def _init_signature(cls: type) -> inspect.Signature:
    try:
        return inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
                                  inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                                  inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])


def check_spawn(Class: Any, args: tuple, kwargs: dict) -> None:
    """What spawning ``Class(*args, **kwargs)`` checks first: the class (check_actor_class),
    then that the arguments fit its ``__init__`` (TypeError naming the class)."""
    check_actor_class(Class)
    check_call(f"{Class.__qualname__}()", _init_signature(Class), args, kwargs)
