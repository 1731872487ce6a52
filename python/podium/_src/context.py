"""context(), current_rank(), current_size(), current_actor_name().

An actor's thread (see server.py) sets the context of the message it is handling; everywhere
else (the controller's own code) the context is the client's: no dimensions, rank 0."""

from __future__ import annotations

import threading
from typing import Dict, Optional

from podium._src.shape import Extent, Point


class ActorInstance:
    """Who is running: ``actor_id`` (text), ``name`` (the mesh name given to spawn),
    ``rank`` (the actor's point in the proc mesh it was spawned on), ``class_name``."""

    __slots__ = ("actor_id", "name", "rank", "class_name")

    def __init__(self, actor_id: str, name: str, rank: Point, class_name: Optional[str]) -> None:
        self.actor_id = actor_id
        self.name = name
        self.rank = rank
        self.class_name = class_name

    def __repr__(self) -> str:
        rank = str(self.rank) if len(self.rank) else ""
        return f"<{self.class_name + ' ' if self.class_name else ''}{self.name}{rank}>"


class Context:
    """The running actor (``actor_instance``) and the point of the current message within the
    cast that carried it (``message_rank``)."""

    __slots__ = ("actor_instance", "message_rank")

    def __init__(self, actor_instance: ActorInstance, message_rank: Point) -> None:
        self.actor_instance = actor_instance
        self.message_rank = message_rank


_tls = threading.local()
_client: Optional[Context] = None


def _client_context() -> Context:
    global _client
    if _client is None:
        origin = Point(0, Extent([], []))
        _client = Context(ActorInstance("client", "client", origin, None), origin)
    return _client


def set_context(ctx: Optional[Context]) -> None:
    _tls.ctx = ctx


def context() -> Context:
    return getattr(_tls, "ctx", None) or _client_context()


def current_rank() -> Point:
    return context().message_rank


def current_size() -> Dict[str, int]:
    e = context().message_rank.extent
    return {k: e[k] for k in e}


def current_actor_name() -> str:
    return str(context().actor_instance.actor_id)
