"""Actor, @endpoint, and the checks made on an actor class before it is spawned."""

from __future__ import annotations

import functools
import inspect
import types
import weakref
from typing import Any, Callable, Dict, Optional


class Actor:
    """Base class of podium actors. Endpoints are methods decorated with @endpoint; they are
    either all ``def`` or all ``async def`` within one class."""


class EndpointProperty:
    """What @endpoint puts on the class. On an actor instance (inside the actor) it is the
    plain bound method; on an ActorMesh it becomes an Endpoint with the adverbs."""

    def __init__(self, method: Callable[..., Any]) -> None:
        if not callable(method):
            raise TypeError(f"@endpoint decorates a method, not {type(method).__name__}")
        self._method = method
        self._name = getattr(method, "__name__", "endpoint")
        self._is_async = inspect.iscoroutinefunction(method)
        self._signature: Optional[inspect.Signature] = None
        functools.update_wrapper(self, method)

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @property
    def signature(self) -> inspect.Signature:
        if self._signature is None:
            self._signature = inspect.signature(self._method)
        return self._signature

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self._method, instance)


def endpoint(method: Optional[Callable[..., Any]] = None) -> Any:
    """Marks an actor method as an endpoint: ``@endpoint`` or ``@endpoint()``."""
    if method is None:
        return EndpointProperty
    return EndpointProperty(method)


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
    endpoints; returns True when the endpoints are async."""
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(f"spawn needs a subclass of podium.actor.Actor, not {cls!r}")
    eps = endpoints_of(cls)
    sync = sorted(n for n, e in eps.items() if not e._is_async)
    asyn = sorted(n for n, e in eps.items() if e._is_async)
    if sync and asyn:
        raise ValueError(
            f"{cls.__qualname__} mixes sync endpoints ({', '.join(sync)}) and async endpoints "
            f"({', '.join(asyn)}); an actor's endpoints must be all `def` or all `async def`"
        )
    return bool(asyn)


def check_call(what: str, signature: inspect.Signature, args: tuple, kwargs: dict) -> None:
    """TypeError, naming ``what``, when (self, *args, **kwargs) does not fit ``signature``."""
    try:
        signature.bind(None, *args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{what}: {e}") from None
