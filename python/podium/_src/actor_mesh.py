"""ActorMesh and its endpoints' adverbs: call, call_one, choose, stream, broadcast.

A call message carries, after the C++ CallHeader: a meta part (empty, or for calls sent to one
rank on behalf of a wider mesh — choose, stream — the pickled (rank, labels, sizes) the actor
should see as current_rank()), then the pickled (args, kwargs) and their out-of-band buffers.
A reply carries the pickled (True, value) or (False, exception, message, remote traceback).
"""

from __future__ import annotations

import pickle
from typing import Any, Generic, Iterator, List, TypeVar

from podium._core import ndslice as _nd
from podium._src import errors, pickling
from podium._src.endpoint import check_call, endpoints_of, EndpointProperty
from podium._src.future import Future
from podium._src.shape import MeshShape, select, ValueMesh

R = TypeVar("R")
T = TypeVar("T")

_NO_META = b""


def _decode_reply(ok: bool, payload: Any, where: str, endpoint: str) -> Any:
    """The value of one rank's reply, or raises its exception."""
    if not ok:
        subsystem, code, message = payload
        raise errors.from_core(subsystem, code, message, endpoint)
    reply = pickling.loads(payload)
    if reply[0]:
        return reply[1]
    _, exc, message, tb = reply
    raise errors.ActorError(exc, f"{message} ({where})", tb)


def _decode_none(core: Any) -> None:
    """Decoder of futures that carry no value (initialized, stop)."""
    from podium._core.base import CoreError

    try:
        replies = core.replies()
    except CoreError as e:
        raise errors.from_core(e.subsystem, e.code, e.message) from None
    for ok, payload in replies:
        if not ok:
            raise errors.from_core(*payload)


class ActorMesh(MeshShape, Generic[T]):
    """Actors of one class, one per proc of the mesh they were spawned on. Endpoints are
    attributes: ``mesh.method.call(...)``."""

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
        return Future(self._core.initialized(), _decode_none)

    def __getattr__(self, name: str) -> "Endpoint[Any]":
        if name.startswith("_"):
            raise AttributeError(name)
        ep = endpoints_of(self._class).get(name)
        if ep is None:
            if hasattr(self._class, name):
                raise AttributeError(
                    f"{self._class.__qualname__}.{name} is not an endpoint: decorate it with "
                    f"@endpoint to call it on an actor mesh"
                )
            raise AttributeError(f"{self._class.__qualname__} has no endpoint '{name}'")
        return Endpoint(self, name, ep)

    def slice(self, **kwargs: Any) -> "ActorMesh[T]":
        """``slice(gpus=1)`` removes the dimension, ``slice(gpus=slice(0, 2))`` keeps it."""
        return ActorMesh(self._class, select(self._core, kwargs), self._proc_mesh)

    def stop(self) -> "Future[None]":
        """Stops the actors of this mesh after the messages queued before the stop (running
        ``__cleanup__``); later calls raise SupervisionError."""
        return Future(self._core.stop(), _decode_none)

    def __repr__(self) -> str:
        return f"<ActorMesh {self.name} of {self._class.__qualname__} {self.extent}>"


class Endpoint(Generic[R]):
    """One endpoint of an ActorMesh, with its adverbs."""

    def __init__(self, mesh: ActorMesh[Any], name: str, prop: EndpointProperty) -> None:
        self._mesh = mesh
        self._name = name
        self._prop = prop

    @property
    def _what(self) -> str:
        return f"{self._mesh._class.__qualname__}.{self._name}()"

    def _parts(self, args: tuple, kwargs: dict) -> List[Any]:
        check_call(self._what, self._prop.signature, args, kwargs)
        return pickling.dumps_call(self._what, args, kwargs)

    def _where(self, rank: int) -> str:
        point = self._mesh._core.region.extent.point_of_rank(rank)
        return f"{self._mesh.name} rank {rank} {point}"

    def call(self, *args: Any, **kwargs: Any) -> "Future[ValueMesh[R]]":
        """Every actor of the mesh runs the endpoint; the future resolves to a ValueMesh of the
        results, or raises ActorError if any raised."""
        parts = self._parts(args, kwargs)
        core = self._mesh._core
        region_extent = core.region.extent
        name = self._name

        def decode(fut: Any) -> ValueMesh[R]:
            values = []
            for rank, (ok, payload) in enumerate(fut.replies()):
                values.append(_decode_reply(ok, payload, self._where(rank), name))
            return ValueMesh._from_values(list(region_extent.labels), list(region_extent.sizes),
                                          values)

        return Future(core.call(name, [_NO_META, *parts]), decode)

    def call_one(self, *args: Any, **kwargs: Any) -> "Future[R]":
        """Calls the one actor of this mesh; ValueError at once if it holds several."""
        n = len(self._mesh)
        if n != 1:
            raise ValueError(
                f"call_one() needs a mesh of exactly one actor; {self._mesh.name} has {n} in "
                f"{self._mesh.extent}: slice it first, or use call() or choose()"
            )
        parts = self._parts(args, kwargs)
        return self._single(self._mesh._core.call(self._name, [_NO_META, *parts]), 0)

    def choose(self, *args: Any, **kwargs: Any) -> "Future[R]":
        """One actor of the mesh runs the endpoint: the one with the fewest calls
        outstanding."""
        parts = self._parts(args, kwargs)
        core = self._mesh._core
        rank = core.least_loaded_rank()
        return self._single(core.call_rank(rank, self._name, [self._meta(rank), *parts]), rank)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator["Future[R]"]:
        """Calls every actor at once; yields one future per actor, in the order the replies
        arrive."""
        parts = self._parts(args, kwargs)
        core = self._mesh._core
        per_rank = [[self._meta(r), *parts] for r in range(len(self._mesh))]
        name = self._name

        def decode(fut: Any) -> R:
            ((ok, payload),) = fut.replies()
            return _decode_reply(ok, payload, self._where(fut.rank()), name)

        return iter([Future(f, decode) for f in core.stream(name, per_rank)])

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Fire and forget to every actor of the mesh. An exception there fails the actor."""
        parts = self._parts(args, kwargs)
        self._mesh._core.broadcast(self._name, [_NO_META, *parts])

    def _meta(self, rank: int) -> bytes:
        e = self._mesh._core.region.extent
        return pickle.dumps((rank, list(e.labels), list(e.sizes)))

    def _single(self, core_future: Any, rank: int) -> "Future[R]":
        where = self._where(rank)
        name = self._name

        def decode(fut: Any) -> R:
            ((ok, payload),) = fut.replies()
            return _decode_reply(ok, payload, where, name)

        return Future(core_future, decode)

    def __repr__(self) -> str:
        return f"<Endpoint {self._what} on {self._mesh.name}>"
