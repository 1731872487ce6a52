"""``podium logs [MESH] [--rank R] [--tail N] [--follow]`` and ``ProcMesh.logs()``: the procs'
log files (python/podium/_src/proc_log.py) read back through the running job, each line
prefixed with the proc's coordinates, rank and host.

``podium logs`` reaches the job as ``podium exec`` does: through the controller's debug
server (server.py: loopback by default, the job's secret off loopback). The controller reads
the files through one small actor per ProcMesh (``podium_logs``, spawned on first use), so
the lines travel over podium's own channels from any host.

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
import json
import os
import sys
from typing import Any, List, Optional, Tuple

from podium._src import proc_mesh as _proc_mesh
from podium._src.proc_log_read import LOGS_MESH, read_new, read_tails, Target, targets
from podium.debugger.prompt_io import DebugIO, IOClosed
MODE_LOGS = "podium-logs "
DONE = "podium logs: "
DEFAULT_TAIL = 100
FOLLOW_POLL_S = 0.5


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


def request(mesh: str, rank: Optional[int], tail: int, follow: bool) -> str:
    return MODE_LOGS + json.dumps({"mesh": mesh, "rank": rank, "tail": tail,
                                   "follow": follow}) + "\n"


async def serve(io: DebugIO, line: str) -> None:
    """The controller's side of a ``podium logs`` request."""
    try:
        req = json.loads(line[len(MODE_LOGS):])
        rank = req.get("rank")
        tail = int(req.get("tail", DEFAULT_TAIL))
        follow = bool(req.get("follow"))

        def first() -> Tuple[List[Target], List[str]]:
            chosen = targets(select_meshes(str(req.get("mesh") or "all")),
                             None if rank is None else int(rank))
            return chosen, read_tails(chosen, tail)
        chosen, lines = await asyncio.to_thread(first)
    except Exception as e:
        await io.close(f"{DONE}error: {e}\n")
        return
    try:
        if lines:
            await io.output("".join(line + "\n" for line in lines))
        while follow:
            await asyncio.sleep(FOLLOW_POLL_S)
            try:
                new = await asyncio.to_thread(read_new, chosen)
            except Exception as e:  # a proc that ended, the mesh stopped: said, and the end
                await io.close(f"{DONE}error: {type(e).__name__}: {e}\n")
                return
            if new:
                await io.output("".join(line + "\n" for line in new))
        await io.close(f"{DONE}{len(chosen)} proc(s)\n")
    except IOClosed:
        return


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
        sock = connect(args.host, args.port, args.wait, args.secret_file)
    except (OSError, ValueError) as e:
        print(f"podium logs: {e}", file=sys.stderr)
        return 1
    try:
        sock.sendall(request(args.mesh, args.rank, args.tail, args.follow).encode())
        last = b""
        out = sys.stdout.fileno()
        while True:
            data = sock.recv(65536)
            if not data:
                break
            os.write(out, data)
            last = (last + data)[-4096:]
    except KeyboardInterrupt:
        return 130
    finally:
        sock.close()
    tail = last.decode(errors="replace").rstrip("\n").rsplit("\n", 1)[-1]
    if not tail.startswith(DONE) or "error:" in tail:
        if not tail.startswith(DONE):
            print("podium logs: the controller closed the connection before the end",
                  file=sys.stderr)
        return 1
    return 0
