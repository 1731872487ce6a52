"""What the dashboard shows: one snapshot of the controller's own view of its job, as JSON.

Everything comes from the runtime of this process (the controller): the ProcMeshes it
spawned or took over (their procs' hosts, pids and exit status, from the core), the actor
meshes it spawned or adopted (their extents, and each rank's actor, proc and host), the
messages it sent and the calls still waiting for replies (call_stats, DS-1), the failures
its supervision was told of, and the debug controller's stopped actors.

  DS-2 A rank's health is derived from what the controller was told, never guessed:
    "failed" once a failure of that mesh and rank (or of its proc) reached the
    controller's supervision (the newest 100 are kept, each with its report), "exited"
    when the core saw its proc end (with how), "stopped" when its ProcMesh was stopped,
    "debugger" while it is stopped in the debugger, else "ok".
  DS-3 Message rates are the difference of the controller's counters between two
    snapshots divided by the time between them (per actor mesh, per second); the first
    snapshot has no rate (null), and the page shows "-".
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from podium._src import call_stats, supervision
from podium._src import proc_mesh as _proc_mesh


def _coords(sizes: Dict[str, int], rank: int) -> Dict[str, int]:
    out: Dict[str, int] = {}
    rest = rank
    for dim in reversed(list(sizes)):  # row-major: the last dimension varies fastest
        out[dim], rest = rest % sizes[dim], rest // sizes[dim]
    return {d: out[d] for d in sizes}


def _point_text(coords: Dict[str, int]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in coords.items()) + "}"


def _stopped_sessions(ctrl: Any) -> List[Dict[str, Any]]:
    """The debugger's stopped actors (the DebugController's table)."""
    for _ in range(5):  # the table changes on the controller's loop: copy it
        try:
            sessions = list(ctrl.sessions.values())
            break
        except RuntimeError:
            continue
    else:
        return []
    out = []
    for s in sessions:
        if s.ended:
            continue
        out.append({"actor": s.actor_name, "rank": s.rank, "coords": dict(s.coords),
                    "host": s.hostname, "function": s.function, "line": s.lineno,
                    "actor_id": s.actor_id})
    return sorted(out, key=lambda d: (d["actor"], d["rank"]))


def _debug_server(ctrl: Any) -> Optional[str]:
    try:
        if ctrl.listener.address is None:
            return None
        return f"{ctrl.listener.host}:{ctrl.listener.port}"
    except Exception:
        return None


class Collector:
    """Builds snapshots; keeps the previous counters for rates (DS-3). ``ctrl``: the
    DebugController whose table of stopped actors it shows (it owns the collector)."""

    def __init__(self, ctrl: Any) -> None:
        self.ctrl = ctrl
        self._lock = threading.Lock()
        self._last: Optional[Tuple[float, Dict[str, int]]] = None
        self.host = socket.gethostname()

    def snapshot(self) -> Dict[str, Any]:
        now = time.time()
        sent = call_stats.messages_sent()
        with self._lock:
            last, self._last = self._last, (time.monotonic(), sent)
        rates: Dict[str, Optional[float]] = {}
        if last is not None:
            dt = self._last[0] - last[0]
            for name, n in sent.items():
                rates[name] = (n - last[1].get(name, 0)) / dt if dt > 0 else None
        flight = call_stats.in_flight()
        failures = list(supervision.recent_failures)
        failed: Dict[Tuple[str, int], str] = {}
        failed_procs: Dict[Tuple[str, int], str] = {}  # (host, pid) of a proc failure
        for _, f in failures:
            failed[(f.mesh_name, f.rank)] = f.kind
            if f.kind == "proc":
                failed_procs[(f.host, f.pid)] = f.signal or f"exit {f.exit_code}"
        stopped = _stopped_sessions(self.ctrl)
        in_debugger = {s["actor_id"] for s in stopped}

        proc_meshes, pm_index, hosts = [], {}, {}
        for pm in list(_proc_mesh.spawned.values()):
            try:
                pm_index[id(pm)] = len(proc_meshes)
                proc_meshes.append(self._proc_mesh(pm, len(proc_meshes), failed_procs, hosts))
            except Exception as e:  # a mesh in the middle of its end: say so
                proc_meshes.append({"id": len(proc_meshes), "error": f"{type(e).__name__}: {e}"})

        actor_meshes = []
        for name, mesh in sorted(supervision._meshes.items()):
            try:
                actor_meshes.append(self._actor_mesh(
                    name, mesh, pm_index, proc_meshes, failed, in_debugger, sent, rates,
                    flight))
            except Exception as e:
                actor_meshes.append({"name": name, "error": f"{type(e).__name__}: {e}"})

        return {
            "time": now,
            "controller": {"host": self.host, "pid": os.getpid(),
                           "debug_server": _debug_server(self.ctrl)},
            "hosts": [dict(host=h, **v) for h, v in sorted(hosts.items())],
            "proc_meshes": proc_meshes,
            "actor_meshes": actor_meshes,
            "failures": [{"time": t, "mesh": f.mesh_name, "rank": f.rank, "point": f.point,
                          "host": f.host, "pid": f.pid, "kind": f.kind, "signal": f.signal,
                          "exit_code": f.exit_code, "report": f.report()}
                         for t, f in reversed(failures)],
            "stopped": stopped,
        }

    def _proc_mesh(self, pm: Any, index: int, failed_procs: Dict[Tuple[str, int], str],
                   hosts: Dict[str, Dict[str, int]]) -> Dict[str, Any]:
        sizes = dict(pm.sizes)
        procs = pm._core.state()[2]  # the root mesh's procs: (proc id, pid, host)
        stopped = pm._shared.stopped
        base = list(pm._core.region.base_ranks())
        out = []
        for r in range(len(pm)):
            b = base[r] if r < len(base) else r
            _, pid, host = procs[b]
            status = pm._core.exit_status(r)
            if status is None and (host, pid) in failed_procs:
                status = failed_procs[(host, pid)]
            health = "stopped" if stopped else ("exited" if status is not None else "ok")
            out.append({"rank": r, "coords": _coords(sizes, r), "host": host, "pid": pid,
                        "health": health, "exit": status})
            h = hosts.setdefault(host, {"procs": 0, "alive": 0})
            h["procs"] += 1
            h["alive"] += health == "ok"
        return {"id": index, "extent": sizes, "stopped": stopped, "procs": out}

    def _actor_mesh(self, name: str, mesh: Any, pm_index: Dict[int, int],
                    proc_meshes: List[Dict[str, Any]], failed: Dict[Tuple[str, int], str],
                    in_debugger: set, sent: Dict[str, int], rates: Dict[str, Optional[float]],
                    flight: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
        core = mesh._core
        pm = mesh._proc_mesh
        pmi = pm_index.get(id(pm)) if pm is not None else None
        proc_health: Dict[int, Dict[str, Any]] = {}
        if pmi is not None and "procs" in proc_meshes[pmi]:
            proc_health = {p["pid"]: p for p in proc_meshes[pmi]["procs"]}
        fl = flight.get(name, {"calls": 0, "ranks": {}})
        ranks = []
        for r in range(len(mesh)):
            actor_id, pid, host, base, point = core.rank_info(r)
            p = proc_health.get(pid)
            if (name, base) in failed:
                health = "failed"
            elif p is not None and p["health"] != "ok":
                health = p["health"]
            elif actor_id in in_debugger:
                health = "debugger"
            else:
                health = "ok"
            ranks.append({"rank": base, "point": point, "actor": actor_id, "host": host,
                          "pid": pid, "health": health, "in_flight": fl["ranks"].get(base, 0)})
        return {"name": name, "class": mesh._class.__qualname__, "extent": dict(mesh.sizes),
                "proc_mesh": pmi, "sent": sent.get(name, 0), "rate": rates.get(name),
                "in_flight": fl["calls"], "ranks": ranks}
