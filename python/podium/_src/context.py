"""context(), current_rank(), current_size(), current_actor_name().

An actor's thread (see server.py) sets the context of the message it is handling, in a
contextvars.ContextVar so that concurrent endpoints of one actor (asyncio tasks on the same
thread) each see their own message; everywhere else (the controller's own code) the context is
the client's: no dimensions, rank 0.

As Monarch's, an ActorInstance knows its ``creator`` (who spawned it), prints as the chain of
creators (``<client>.<mod.Trainer trainer{'gpus': 0/2}>``), and ``abort(reason)`` fails the
actor. Python ``logging`` records made while an actor's context is active carry the
``[actor=<that chain>] `` prefix (``podium.actor.config.prefix_python_logs_with_actor``):

  LG-1 A logging record created in an actor's context (its thread, or its asyncio task) has
    its message prefixed with "[actor=<repr of the actor instance>] " once, whatever the
    handlers; records made outside actors, and empty messages, are left as they are.
  LG-2 ``abort(reason)`` fails the calling actor: the call in progress and later calls raise
    SupervisionError, and the failure reported to its owner carries the reason.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any, Callable, Dict, List, Optional

from podium._core import ndslice as _nd
from podium._src.shape import Extent, Point

# this_proc(), handed in by proc_mesh.py (which sits above this module) when it is imported:
# the proc mesh of an ActorInstance that was made without one (the client's).
_default_proc_mesh: Optional[Callable[[], Any]] = None


def set_default_proc_mesh(fn: Callable[[], Any]) -> None:
    global _default_proc_mesh
    _default_proc_mesh = fn


# podium._src.config, handed in by it when it is imported (it sits above this module): where
# ``prefix_python_logs_with_actor`` lives (LG-1).
_config: Any = None


def set_config_module(module: Any) -> None:
    global _config
    _config = module


class ActorInstance:
    """Who is running.

    ``actor_id`` (text), ``name`` (the mesh name given to spawn), ``rank`` (the actor's point
    in the proc mesh it was spawned on), ``class_name``, ``proc_mesh`` (the ProcMesh it was
    spawned on; this_proc() for the client), ``proc`` (its own proc, as a ProcMesh of no
    dimensions)."""

    __slots__ = ("actor_id", "name", "rank", "class_name", "_proc_mesh", "_children", "creator")

    def __init__(
        self,
        actor_id: str,
        name: str,
        rank: Point,
        class_name: Optional[str],
        proc_mesh: Any = None,
        creator: Optional["CreatorInstance"] = None,
    ) -> None:
        self.actor_id = actor_id
        self.name = name
        self.rank = rank
        self.class_name = class_name
        self._proc_mesh = proc_mesh
        # Actor meshes this actor spawned: stopped before its own __cleanup__ runs.
        self._children: List[Any] = []
        # Who spawned it (a CreatorInstance), as Monarch's; None for the client.
        self.creator = creator

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

    def _as_creator(self) -> "CreatorInstance":
        """What an actor spawned by this one keeps as its ``creator`` (it pickles)."""
        return CreatorInstance(self.actor_id, self.name, self.rank, self.class_name,
                               self.creator)

    def abort(self, reason: Optional[str] = None) -> None:
        """Fails this actor with ``reason`` (LG-2), as Monarch's: the call in progress and
        later calls raise SupervisionError, and its owner's ``__supervise__`` (or the
        unhandled-fault hook) gets a MeshFailure whose cause carries the reason. Call it from
        the actor's own code (``__init__`` or an endpoint): it raises ActorAborted, a
        BaseException that podium turns into the actor's failure; code after it does not
        run."""
        if actor_context() is None or actor_context().actor_instance is not self:
            raise RuntimeError(
                f"abort(): only the actor {self!r} can abort itself, from its own code")
        raise ActorAborted(reason)

    def __repr__(self) -> str:
        return _qualified_name(self)


class ActorAborted(BaseException):
    """Raised by ``context().actor_instance.abort(reason)``: fails the actor (a BaseException
    escaping an endpoint or ``__init__`` does), its text carrying the reason."""

    def __init__(self, reason: Optional[str] = None) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"the actor aborted: {self.reason if self.reason is not None else 'no reason given'}"


class CreatorInstance:
    """The actor (or client) that spawned an actor: ``actor_id``, ``name``, ``rank``,
    ``class_name`` and its own ``creator``. Prints as Monarch's: the chain of names."""

    __slots__ = ("actor_id", "name", "rank", "class_name", "creator")

    def __init__(self, actor_id: str, name: str, rank: Point, class_name: Optional[str],
                 creator: Optional["CreatorInstance"]) -> None:
        self.actor_id = actor_id
        self.name = name
        self.rank = rank
        self.class_name = class_name
        self.creator = creator

    def __reduce__(self):
        return (CreatorInstance, (self.actor_id, self.name, self.rank, self.class_name,
                                  self.creator))

    def __repr__(self) -> str:
        return _qualified_name(self)


def _qualified_name(ins: Any) -> str:
    """``<client>.<mod.Manager manager{'gpus': 0/1}>.<mod.Worker w{'gpus': 1/2}>``."""
    names = []
    while ins is not None:
        rank = str(ins.rank) if len(ins.rank) else ""
        names.append(f"<{ins.class_name + ' ' if ins.class_name else ''}{ins.name}{rank}>")
        ins = ins.creator
    return ".".join(reversed(names))


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
    if not _log_prefix_installed:
        _install_log_prefix()
    return _current.set(ctx)


# --- the [actor=...] prefix of logging records (LG-1) ---------------------------------------

_log_prefix_installed = False


def _install_log_prefix() -> None:
    """Chains a record factory that prefixes the records made in an actor's context: once per
    record, so every handler (and one added later) sees the same text."""
    global _log_prefix_installed
    if _log_prefix_installed:
        return
    _log_prefix_installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        ctx = _current.get()
        if ctx is not None and record.msg and isinstance(record.msg, str):
            if getattr(_config, "prefix_python_logs_with_actor", True):
                prefix = f"[actor={ctx.actor_instance!r}] "
                record.actor_prefix = prefix
                record.msg = prefix + record.msg
        return record

    logging.setLogRecordFactory(factory)


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
