"""``podium logs [MESH] [--rank R] [--tail N] [--follow]`` and ``ProcMesh.logs()``: the procs'
log files (python/podium/_src/proc_log.py) read back through the running job, each line
prefixed with the proc's coordinates, rank and host.

``podium logs`` reaches the job as ``podium exec`` does: attached to the controller through
its debug address (endpoint.py: a channel listener, the job's secret, DB-8), it calls the
DebugController's ``logs_open`` (and ``logs_next`` while it follows). The controller reads
the files through one small actor per ProcMesh (``podium_logs``, spawned on first use), so
the lines travel over podium's own channels from any host, and to the command as replies.

  PL-3 ``podium logs`` and ``ProcMesh.logs()`` return, for each selected proc in rank order,
    the last N lines of its log file (PL-2: with the rotated file's before them when
    needed), each prefixed ``[<coords> rank <r> <host>] ``; with ``--follow``, then the lines
    each proc adds, as they come, until the client leaves. MESH selects the ProcMeshes: every
    live one the controller spawned (``all``, the default), the one numbered N (in the order
    ``podium exec`` numbers them), or those running an actor mesh of that name; a selection
    that matches nothing is an error that names what there is.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from podium._src import proc_mesh as _proc_mesh
from podium._src.proc_log_read import LOGS_MESH, read_new, read_tails, Target, targets

DONE = "podium logs: "
DEFAULT_TAIL = 100
FOLLOW_POLL_S = 0.5
NEXT_WAIT_S = 5.0  # logs_next answers at least this often, with nothing when nothing came
FORGET_AFTER_S = 120.0  # a followed read nobody asked about for this long is dropped


def select_meshes(which: str) -> List[Any]:
    meshes = [pm for pm in list(_proc_mesh.spawned.values()) if not pm._shared.stopped]
    if not meshes:
        raise ValueError("this controller has spawned no procs that are running")
    if which in ("", "all"):
        return meshes
    if which.isdigit():
        i = int(which)
        if i >= len(meshes):
            raise ValueError(f"no proc mesh {i}: there are {len(meshes)} "
                             f"({_names(meshes)})")
        return [meshes[i]]
    chosen = [pm for pm in meshes
              if any(_core_name(core) == which for core in list(pm._shared.actor_meshes))]
    if not chosen:
        raise ValueError(f"no proc mesh runs an actor mesh named {which!r} ({_names(meshes)})")
    return chosen


def _core_name(core: Any) -> str:
    try:
        return core.name
    except Exception:
        return ""


def _names(meshes: List[Any]) -> str:
    parts = []
    for i, pm in enumerate(meshes):
        names = sorted({_core_name(c) for c in list(pm._shared.actor_meshes)} - {"", LOGS_MESH})
        parts.append(f"mesh {i} {pm.sizes}: {', '.join(names) or 'no actors'}")
    return "; ".join(parts)


class Reads:
    """The controller's side of ``podium logs``: the followed reads, by handle."""

    def __init__(self) -> None:
        self.follows: Dict[int, Tuple[List[Target], float]] = {}
        self.ids = itertools.count(1)

    async def open(self, mesh: str, rank: Optional[int], tail: int,
                   follow: bool) -> Tuple[Optional[int], str]:
        self._expire()
        try:
            def first() -> Tuple[List[Target], List[str]]:
                chosen = targets(select_meshes(str(mesh or "all")),
                                 None if rank is None else int(rank))
                return chosen, read_tails(chosen, int(tail))
            chosen, lines = await asyncio.to_thread(first)
        except Exception as e:
            return None, f"{DONE}error: {e}\n"
        text = "".join(line + "\n" for line in lines)
        if not follow:
            return None, text + f"{DONE}{len(chosen)} proc(s)\n"
        handle = next(self.ids)
        self.follows[handle] = (chosen, time.monotonic())
        return handle, text

    async def next(self, handle: int) -> Tuple[str, bool]:
        entry = self.follows.get(handle)
        if entry is None:
            return f"{DONE}error: no followed read {handle} (it ended, or was idle too long)\n", True
        chosen = entry[0]
        deadline = time.monotonic() + NEXT_WAIT_S
        while True:
            self.follows[handle] = (chosen, time.monotonic())
            try:
                new = await asyncio.to_thread(read_new, chosen)
            except Exception as e:  # a proc that ended, the mesh stopped: said, and the end
                self.follows.pop(handle, None)
                return f"{DONE}error: {type(e).__name__}: {e}\n", True
            if new or time.monotonic() >= deadline:
                return "".join(line + "\n" for line in new), False
            await asyncio.sleep(FOLLOW_POLL_S)

    def close(self, handle: int) -> None:
        self.follows.pop(handle, None)

    def _expire(self) -> None:
        now = time.monotonic()
        for h in [h for h, (_, used) in self.follows.items() if now - used > FORGET_AFTER_S]:
            del self.follows[h]


# --- the client ---------------------------------------------------------------------------


def add_arguments(p: Any) -> None:
    p.add_argument("mesh", nargs="?", default="all", metavar="MESH",
                   help="which proc meshes: all (the default), a number N (as podium exec "
                        "numbers them), or the name of an actor mesh they run")
    p.add_argument("--rank", type=int, default=None, help="only this rank of each mesh")
    p.add_argument("--tail", type=int, default=DEFAULT_TAIL, metavar="N",
                   help=f"the last N lines of each proc (default {DEFAULT_TAIL})")
    p.add_argument("--follow", "-f", action="store_true",
                   help="then print the lines the procs add, until interrupted")


def run(args: Any, connect: Any) -> int:
    try:
        ctrl = connect(args.host, args.port, args.wait, args.secret_file)
        handle, text = ctrl.logs_open.call_one(args.mesh, args.rank, args.tail,
                                               args.follow).get()
    except Exception as e:  # unreachable, refused (DB-8), or the controller went away
        print(f"podium logs: {e}", file=sys.stderr)
        return 1
    _write(text)
    if handle is None:
        last = text.rstrip("\n").rsplit("\n", 1)[-1]
        return 0 if last.startswith(DONE) and "error:" not in last else 1
    try:
        while True:
            text, ended = ctrl.logs_next.call_one(handle).get()
            _write(text)
            if ended:
                return 1
    except KeyboardInterrupt:
        try:
            ctrl.logs_close.call_one(handle).get(timeout=5)
        except Exception:
            pass
        return 130
    except Exception as e:
        print(f"podium logs: {e}", file=sys.stderr)
        return 1


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
