"""The reading side of the per-proc log files (proc_log.py): one LogReader actor per ProcMesh
(``podium_logs``), used by ``ProcMesh.logs()`` and ``podium logs`` (podium/debugger/logs.py,
PL-3)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

from podium._src import proc_log
from podium._src.endpoint import Actor, endpoint
from podium._src.future import CoroFuture, Future

LOGS_MESH = "podium_logs"


class LogReader(Actor):
    """Reads its proc's log file."""

    @endpoint
    def tail(self, n: int) -> Tuple[str, int, List[str]]:
        """(host, the file's size, its last n lines)."""
        path = proc_log.log.current_path()
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        return socket.gethostname(), size, proc_log.tail(path, n)

    @endpoint
    def read_from(self, offset: int) -> Tuple[int, List[str]]:
        return proc_log.read_from(proc_log.log.current_path(), offset)


def coords_of(sizes: Dict[str, int], rank: int) -> Dict[str, int]:
    coords, rest = {}, rank
    for dim in reversed(list(sizes)):  # row-major: the last dimension varies fastest
        coords[dim], rest = rest % sizes[dim], rest // sizes[dim]
    return {d: coords[d] for d in sizes}


def label(coords: Dict[str, int], rank: int, host: str) -> str:
    where = ",".join(f"{k}={v}" for k, v in coords.items())
    return f"[{where + ' ' if where else ''}rank {rank} {host}] "


_readers: Dict[int, Tuple[Any, Any]] = {}  # id(ProcMesh) -> (weakref to it, its readers)
_readers_lock = threading.Lock()


def _reader(pm: Any) -> Any:
    with _readers_lock:
        entry = _readers.get(id(pm))
        if entry is not None and entry[0]() is pm:
            return entry[1]
        mesh = pm.spawn(LOGS_MESH, LogReader)
        _readers[id(pm)] = (weakref.ref(pm), mesh)
        return mesh


class Target:
    """One selected proc: how to reach its reader and how to label its lines."""

    def __init__(self, reader: Any, coords: Dict[str, int], rank: int) -> None:
        self.reader, self.coords, self.rank = reader, coords, rank
        self.host = "?"
        self.offset = 0

    def prefix(self) -> str:
        return label(self.coords, self.rank, self.host)


def targets(meshes: List[Any], rank: Optional[int]) -> List[Target]:
    out = []
    for pm in meshes:
        sizes = pm.sizes
        if rank is not None and not 0 <= rank < len(pm):
            raise ValueError(f"rank {rank} is not in the proc mesh {sizes} ({len(pm)} procs)")
        reader = _reader(pm)
        for r in range(len(pm)) if rank is None else [rank]:
            coords = coords_of(sizes, r)
            out.append(Target(reader.slice(**coords) if coords else reader, coords, r))
    return out


def read_tails(chosen: List[Target], n: int, timeout: float = 30.0) -> List[str]:
    """Blocking: the prefixed last ``n`` lines of each target, in order (PL-3)."""
    futs = [t.reader.tail.call_one(n) for t in chosen]
    out: List[str] = []
    for t, fut in zip(chosen, futs):
        t.host, t.offset, lines = fut.get(timeout=timeout)
        p = t.prefix()
        out.extend(p + line for line in lines)
    return out


def read_new(chosen: List[Target], timeout: float = 30.0) -> List[str]:
    futs = [t.reader.read_from.call_one(t.offset) for t in chosen]
    out: List[str] = []
    for t, fut in zip(chosen, futs):
        t.offset, lines = fut.get(timeout=timeout)
        p = t.prefix()
        out.extend(p + line for line in lines)
    return out


def proc_mesh_logs(pm: Any, rank: Optional[int], tail: int) -> List[str]:
    """ProcMesh.logs (blocking part)."""
    return read_tails(targets([pm], rank), tail)


def logs(pm: Any, rank: Optional[int], tail: int) -> "Future[List[str]]":
    """ProcMesh.logs: awaitable, or ``.get()``; the reading runs on a thread of its own."""
    if not isinstance(tail, int) or isinstance(tail, bool) or tail < 0:
        raise ValueError(f"logs(tail=...) takes a number of lines >= 0, not {tail!r}")

    async def go() -> List[str]:
        return await asyncio.to_thread(proc_mesh_logs, pm, rank, tail)
    return CoroFuture(go())
