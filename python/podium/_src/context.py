"""context(), current_rank(), current_size(), current_actor_name().

An actor's thread (see server.py) sets the context of the message it is handling, in a
contextvars.ContextVar so that concurrent endpoints of one actor (asyncio tasks on the same
thread) each see their own message; everywhere else (the controller's own code) the context is
the client's: no dimensions, rank 0."""

from __future__ import annotations

import contextvars
from typing import Any, Callable, Dict, List, Optional

from podium._core import ndslice as _nd
from podium._src.shape import Extent, Point

# this_proc(), handed in by proc_mesh.py (which sits above this module) when it is imported:
# the proc mesh of an ActorInstance that was made without one (the client's).
_default_proc_mesh: Optional[Callable[[], Any]] = None


def set_default_proc_mesh(fn: Callable[[], Any]) -> None:
    global _default_proc_mesh
    _default_proc_mesh = fn


class ActorInstance:
    """Who is running.

    ``actor_id`` (text), ``name`` (the mesh name given to spawn), ``rank`` (the actor's point
    in the proc mesh it was spawned on), ``class_name``, ``proc_mesh`` (the ProcMesh it was
    spawned on; this_proc() for the client), ``proc`` (its own proc, as a ProcMesh of no
    dimensions)."""

    __slots__ = ("actor_id", "name", "rank", "class_name", "_proc_mesh", "_children")

    def __init__(
        self,
        actor_id: str,
        name: str,
        rank: Point,
        class_name: Optional[str],
        proc_mesh: Any = None,
    ) -> None:
        self.actor_id = actor_id
        self.name = name
        self.rank = rank
        self.class_name = class_name
        self._proc_mesh = proc_mesh
        # Actor meshes this actor spawned: stopped before its own __cleanup__ runs.
        self._children: List[Any] = []

    @property
    def proc_mesh(self) -> Any:
        if self._proc_mesh is None:
            if _default_proc_mesh is None:
                raise RuntimeError("context(): podium.actor is not imported in this process")
            self._proc_mesh = _default_proc_mesh()
        return self._proc_mesh

    @property
    def proc(self) -> Any:
        mesh = self.proc_mesh
        if len(mesh.extent) == 0:
            return mesh
        return mesh.slice(**dict(self.rank))

    def _add_child(self, mesh: Any) -> None:
        self._children.append(mesh)

    def __repr__(self) -> str:
        rank = str(self.rank) if len(self.rank) else ""
        return f"<{self.class_name + ' ' if self.class_name else ''}{self.name}{rank}>"


class Context:
    """The running actor (``actor_instance``) and the point of the current message within the
    cast that carried it (``message_rank``).

    ``message_rank`` may be given as ``(rank, labels, sizes)``: the Point is then made on
    first use, so a call whose endpoint never asks for it does not pay for it."""

    __slots__ = ("actor_instance", "_message_rank")

    def __init__(self, actor_instance: ActorInstance, message_rank: Any) -> None:
        self.actor_instance = actor_instance
        self._message_rank = message_rank

    @property
    def message_rank(self) -> Point:
        p = self._message_rank
        if type(p) is tuple:
            rank, labels, sizes = p
            p = self._message_rank = Point._wrap(_nd.Extent(labels, sizes).point_of_rank(rank))
        return p


_current: "contextvars.ContextVar[Optional[Context]]" = contextvars.ContextVar(
    "podium.context", default=None
)
_client: Optional[Context] = None


def _client_context() -> Context:
    global _client
    if _client is None:
        origin = Point(0, Extent([], []))
        _client = Context(ActorInstance("client", "client", origin, None), origin)
    return _client


def set_context(ctx: Optional[Context]) -> "contextvars.Token[Optional[Context]]":
    return _current.set(ctx)


def reset_context(token: "contextvars.Token[Optional[Context]]") -> None:
    _current.reset(token)


def actor_context() -> Optional[Context]:
    """The context of the actor running on this thread / task, or None outside actors."""
    return _current.get()


def context() -> Context:
    return _current.get() or _client_context()


def current_rank() -> Point:
    return context().message_rank


def current_size() -> Dict[str, int]:
    e = context().message_rank.extent
    return {k: e[k] for k in e}


def current_actor_name() -> str:
    return str(context().actor_instance.actor_id)
