"""The reading side of the per-proc log files (proc_log.py): one LogReader actor per ProcMesh
(``podium_logs``), used by ``ProcMesh.logs()`` and ``podium logs`` (podium/debugger/logs.py,
PL-3).

A proc that has died cannot read its own file, but the file outlives it on its host (PL-4).
Its lines are read through that host: by the reader of a live proc of the same mesh on the
same host (``tail_of``: same log dir, the dead proc's pid), else, when the dead proc ran on
this process's own host, from the file here. Only a dead proc whose host has no live proc
of the mesh left, on another machine, cannot be read; the error says so.

  PL-6 ``logs()`` of a mesh with dead procs returns their last lines too (each labelled as a
    live proc's): a reader's failure with its proc is kept quiet (supervision reports the
    proc's own meshes), and the dead proc's file is read through its host.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

from podium._src import proc_log, supervision
from podium._src.endpoint import Actor, endpoint
from podium._src.future import CoroFuture, Future

LOGS_MESH = "podium_logs"


class LogReader(Actor):
    """Reads its proc's log file."""

    @endpoint
    def tail(self, n: int) -> Tuple[str, int, List[str]]:
        """(host, the file's size, its last n lines)."""
        proc_log.log.drain()  # PL-5: what this proc wrote so far is in the file
        path = proc_log.log.current_path()
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        return socket.gethostname(), size, proc_log.tail(path, n)

    @endpoint
    def tail_of(self, pid: int, n: int) -> Tuple[str, int, List[str]]:
        """Another (dead) proc's file on this host: (host, its size, its last n lines)."""
        return _file_tail(proc_log.path(pid), n)

    @endpoint
    def read_from(self, offset: int) -> Tuple[int, List[str]]:
        proc_log.log.drain()
        return proc_log.read_from(proc_log.log.current_path(), offset)


def _file_tail(path: str, n: int) -> Tuple[str, int, List[str]]:
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    return socket.gethostname(), size, proc_log.tail(path, n)


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
        # PL-6: a reader dies with its proc; that proc's own meshes report it.
        supervision.keep_mesh(LOGS_MESH, lambda failure: "quiet")
        mesh = pm.spawn(LOGS_MESH, LogReader)
        _readers[id(pm)] = (weakref.ref(pm), mesh)
        return mesh


class Target:
    """One selected proc: how to reach its reader and how to label its lines."""

    def __init__(self, reader: Any, coords: Dict[str, int], rank: int,
                 proc: Tuple[str, int, str] = ("", 0, "")) -> None:
        self.reader, self.coords, self.rank = reader, coords, rank
        self.proc_id, self.pid, self.proc_host = proc  # (address, pid, host) of the proc
        self.host = "?"
        self.offset = 0
        self.siblings: List["Target"] = []  # the other procs of its mesh

    def where(self) -> str:
        """The machine the proc runs on: its address's host part (procs of one worker share
        it), or this machine for a local socket."""
        addr = self.proc_id
        if addr.startswith("tcp:"):
            return addr[4:].rsplit(":", 1)[0]
        return "local:" + self.proc_host

    def prefix(self) -> str:
        return label(self.coords, self.rank, self.host)


def targets(meshes: List[Any], rank: Optional[int]) -> List[Target]:
    out = []
    for pm in meshes:
        sizes = pm.sizes
        if rank is not None and not 0 <= rank < len(pm):
            raise ValueError(f"rank {rank} is not in the proc mesh {sizes} ({len(pm)} procs)")
        reader = _reader(pm)
        try:
            procs = list(pm._core.state()[2])
        except Exception:  # a handle without its procs' table: no dead-proc fallback
            procs = []
        every = []
        for r in range(len(pm)):
            coords = coords_of(sizes, r)
            every.append(Target(reader.slice(**coords) if coords else reader, coords, r,
                                tuple(procs[r]) if r < len(procs) else ("", 0, "")))
        for t in every:
            t.siblings = [o for o in every if o is not t]
        out.extend(every if rank is None else [every[rank]])
    return out


def _dead_tail(t: Target, n: int, why: BaseException, timeout: float
               ) -> Tuple[str, int, List[str]]:
    """The last lines of a dead proc's file, read through its host (PL-6)."""
    if t.pid:
        for o in t.siblings:
            if o.where() != t.where():
                continue
            try:
                return o.reader.tail_of.call_one(t.pid, n).get(timeout=timeout)
            except Exception:
                continue  # that one is dead too
        if t.proc_host == socket.gethostname() and os.path.exists(proc_log.path(t.pid)):
            return _file_tail(proc_log.path(t.pid), n)
    raise RuntimeError(
        f"cannot read the log of rank {t.rank} (pid {t.pid}, host {t.proc_host or '?'}, "
        f"{t.proc_id or 'no address'}): its proc cannot answer ({type(why).__name__}: "
        f"{str(why).splitlines()[0] if str(why) else ''}) and no live proc of its mesh is "
        f"left on that host to read the file") from why


def read_tails(chosen: List[Target], n: int, timeout: float = 30.0) -> List[str]:
    """Blocking: the prefixed last ``n`` lines of each target, in order (PL-3)."""
    futs = [t.reader.tail.call_one(n) for t in chosen]
    out: List[str] = []
    for t, fut in zip(chosen, futs):
        try:
            t.host, t.offset, lines = fut.get(timeout=timeout)
        except Exception as e:  # its proc is gone: the file, through its host (PL-6)
            t.host, t.offset, lines = _dead_tail(t, n, e, timeout)
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
