"""Counts of the messages this process sends to actor meshes, and its calls still waiting for
replies: what the dashboard shows as message rates and in-flight calls (podium.dashboard).

Every endpoint adverb of an ActorMesh (call, call_one, choose, stream, broadcast, send) counts
one message per actor it addresses, under the name of the mesh it was spawned as. A call that
waits for replies (call, call_one, choose, stream) is also kept, with the core future that its
replies complete, until a snapshot finds it done: ``in_flight()`` counts, per mesh and per
rank, the calls whose replies have not all arrived.

  DS-1 The dashboard's message counts and in-flight calls are the controller's own: a
    message is counted when an endpoint adverb sends it (one per addressed actor), and a call
    is in flight from then until its core future is done (every reply arrived, or a proc's
    exit completed it). Nothing is estimated.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Tuple

_lock = threading.Lock()
_sent: Dict[str, int] = {}  # mesh name -> messages sent
# (mesh name, core future, a function giving the base ranks it waits on, or None)
_pending: List[Tuple[str, Any, Any]] = []
# A done call is dropped at the next sweep: one runs when the list reaches _prune_at, which
# then becomes twice what is still in flight (at least _MIN_PRUNE_AT), so that sweeps cost
# O(1) a call and at most max(_MIN_PRUNE_AT, 2 x in flight) done calls keep their replies
# alive here (the core future holds them).
_MIN_PRUNE_AT = 256
_prune_at = _MIN_PRUNE_AT


def sent(mesh: str, count: int) -> None:
    with _lock:
        _sent[mesh] = _sent.get(mesh, 0) + count


def call(mesh: str, count: int, core_future: Any, ranks: Any) -> None:
    """A call of ``count`` actors whose replies complete ``core_future``; ``ranks``: the base
    ranks (in the mesh it was spawned as) that it waits on."""
    global _prune_at
    with _lock:
        _sent[mesh] = _sent.get(mesh, 0) + count
        _pending.append((mesh, core_future, ranks))
        if len(_pending) >= _prune_at:
            _pending[:] = [p for p in _pending if not _done(p[1])]
            _prune_at = max(_MIN_PRUNE_AT, 2 * len(_pending))


def _done(core_future: Any) -> bool:
    try:
        return bool(core_future.ready())
    except Exception:
        return True


def messages_sent() -> Dict[str, int]:
    with _lock:
        return dict(_sent)


def in_flight() -> Dict[str, Dict[str, Any]]:
    """Per mesh name: ``calls`` (calls still waiting for a reply) and ``ranks`` (rank -> the
    calls waiting for that rank's reply; a stream's replies name no rank before they arrive)."""
    with _lock:
        _pending[:] = [p for p in _pending if not _done(p[1])]
        pending = list(_pending)
    out: Dict[str, Dict[str, Any]] = {}
    for mesh, _, ranks in pending:
        m = out.setdefault(mesh, {"calls": 0, "ranks": {}})
        m["calls"] += 1
        try:
            for r in ranks() if ranks is not None else ():
                m["ranks"][r] = m["ranks"].get(r, 0) + 1
        except Exception:  # the mesh is gone: the call still counts
            pass
    return out
