"""``podium exec [--all | --one | --point DIM=V,...] -- COMMAND``: a shell command on the procs
of a running job, each line of its output prefixed with the proc's coordinates.

It reaches the job the way ``podium debug`` does: attached to the controller through its
debug address (endpoint.py: a channel listener, the job's secret, DB-8), it calls the
DebugController's ``exec_command``. The controller runs the command in every selected proc
of every ProcMesh it spawned, through one small actor per mesh (``podium_exec``, spawned on
first use), with the proc's environment and working directory; the command and the outputs
are actor messages.

  DB-10 ``podium exec`` runs COMMAND once in each selected proc: ``--all`` every proc of every
    live ProcMesh the controller spawned, ``--one`` the first proc of the first one,
    ``--point`` those whose coordinates match (values as in the debugger's rank specs);
    every output line is prefixed ``[mesh M hosts=H,gpus=G]`` (the mesh number only when
    there are several), in rank order, and a last line counts the procs and the failures.
    Its exit status is 0 when every command exited 0, else 1; a selection that matches no
    proc is an error that names the meshes there are.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

from podium._src import proc_mesh as _proc_mesh
from podium._src.endpoint import Actor, endpoint
from podium.debugger import commands

EXEC_MESH = "podium_exec"
DONE = "podium exec: "
DEFAULT_TIMEOUT_S = 60.0


class ExecActor(Actor):
    """Runs shell commands in its proc."""

    @endpoint
    def run(self, command: str, timeout: float) -> Tuple[int, str]:
        try:
            r = subprocess.run(command, shell=True, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=timeout)
            return r.returncode, r.stdout.decode(errors="replace")
        except subprocess.TimeoutExpired as e:
            out = (e.output or b"").decode(errors="replace")
            return 124, out + f"(killed after {timeout:g} s)\n"


def _label(index: Optional[int], coords: Dict[str, int]) -> str:
    where = ",".join(f"{k}={v}" for k, v in coords.items())
    return f"[mesh {index} {where}]" if index is not None else f"[{where}]"


class Runner:
    """The controller's side: one per DebugController."""

    def __init__(self) -> None:
        self.meshes: Dict[int, Any] = {}  # id(ProcMesh) -> its podium_exec ActorMesh

    async def run(self, select: str, point_text: Optional[str], command: str,
                  timeout: float) -> Tuple[str, int]:
        """(every output line, prefixed, then the count line; 0 when every command exited 0,
        else 1)."""
        try:
            command, timeout = str(command), float(timeout or DEFAULT_TIMEOUT_S)
            point = commands.parse_ranks(point_text) if point_text else None
            if select not in ("all", "one", "point") or (select == "point") != (point is not None):
                raise ValueError(f"bad selection {select!r}")
            results = await asyncio.to_thread(self._run, select, point, command, timeout)
        except Exception as e:  # DB-10: the client is told why, and exits 1
            return f"{DONE}error: {e}\n", 1
        failed = 0
        out = []
        for label, rc, text in results:
            for out_line in text.splitlines():
                out.append(f"{label} {out_line}\n")
            if rc != 0:
                failed += 1
                out.append(f"{label} exited with status {rc}\n")
        out.append(f"{DONE}{len(results)} proc(s), {failed} failed\n")
        return "".join(out), 0 if failed == 0 else 1

    def _run(self, select: str, point: Any, command: str,
             timeout: float) -> List[Tuple[str, int, str]]:
        meshes = [pm for pm in list(_proc_mesh.spawned.values()) if not pm._shared.stopped]
        if not meshes:
            raise ValueError("this controller has spawned no procs that are running")
        several = len(meshes) > 1
        futures = []
        for index, pm in enumerate(meshes):
            sizes = pm.sizes
            chosen = []
            for rank in range(len(pm)):
                coords, rest = {}, rank
                for dim in reversed(list(sizes)):  # row-major: the last dimension varies fastest
                    coords[dim], rest = rest % sizes[dim], rest // sizes[dim]
                coords = {d: coords[d] for d in sizes}
                if (select == "all" or (select == "one" and index == 0 and rank == 0)
                        or (select == "point" and commands.selects(point, rank, coords))):
                    chosen.append(coords)
            if not chosen:
                continue
            mesh = self.meshes.get(id(pm))
            if mesh is None:
                mesh = self.meshes[id(pm)] = pm.spawn(EXEC_MESH, ExecActor)
            for coords in chosen:
                target = mesh.slice(**coords) if coords else mesh
                futures.append((_label(index if several else None, coords),
                                target.run.call_one(command, timeout)))
        if not futures:
            shapes = "; ".join(f"mesh {i}: {pm.sizes}"
                               for i, pm in enumerate(meshes))
            raise ValueError(f"no proc matches {point} ({shapes})")
        out = []
        for label, fut in futures:
            try:
                rc, text = fut.get(timeout=timeout + 30)
            except Exception as e:
                rc, text = 255, f"{type(e).__name__}: {e}\n"
            out.append((label, rc, text))
        return out


# --- the client ---------------------------------------------------------------------------


def add_arguments(p: Any) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--all", action="store_true", help="every proc of the job (the default)")
    g.add_argument("--one", action="store_true", help="one proc: the first of the first mesh")
    g.add_argument("--point", metavar="DIM=V,...",
                   help="the procs at these coordinates, e.g. hosts=0,gpus=1 (values may be "
                        "ranges a:b or lists (a,b))")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds each command may run (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("command", nargs="+", metavar="COMMAND",
                   help="the shell command (after --)")


def run(args: Any, connect: Any) -> int:
    select = "point" if args.point else "one" if args.one else "all"
    if args.point:
        try:
            spec = commands.parse_ranks(args.point)
        except commands.CommandError as e:
            print(f"podium exec: --point {args.point}: {e}", file=sys.stderr)
            return 2
        if not isinstance(spec, dict):
            print(f"podium exec: --point takes coordinates DIM=VALUE,... (got {args.point})",
                  file=sys.stderr)
            return 2
    try:
        ctrl = connect(args.host, args.port, args.wait, args.secret_file)
        text, rc = ctrl.exec_command.call_one(select, args.point, " ".join(args.command),
                                              args.timeout).get()
    except Exception as e:  # unreachable, refused (DB-8), or the controller went away
        print(f"podium exec: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    sys.stdout.flush()
    return rc
