"""The debug controller: one actor in the controller process that every stopped actor's pdb
talks to (session.py), and the prompt (``podium_dbg>``) that drives them.

``debug_controller()`` returns it (spawned on first use with get_or_spawn_controller, as
Monarch's). The prompt is reached two ways, both through ``exchange`` calls: ``podium debug``
calls them from its own process, attached to the controller through the debug address
(endpoint.py: a channel listener of the controller's proc, DB-8), and ``podium.debug()``
calls them in the controller's own terminal or notebook. One prompt at a time: a new one
replaces the one before (which is told so). ``podium exec``, ``podium logs`` and ``podium
dashboard`` are calls to this actor too (exec_command, logs_open / logs_next, dashboard_url /
dashboard_state).

  DB-6 ``list`` answers from the controller's own table (no message to any proc): one row
    per stopped actor, sorted by actor and rank.
  DB-7 ``attach`` shows what the session printed since its last command, then relays lines
    both ways until ``detach`` (back to the prompt, the actor stays stopped) or the session
    ends; ``cast`` sends one command to every selected session at a prompt and shows each
    one's answer under an "[actor rank]" header; ``continue`` clears every breakpoint and
    resumes every session, and returns once each has ended or stopped again.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from podium._src import server as _server
from podium._src.endpoint import Actor, concurrent_endpoint
from podium._src.proc_mesh import get_or_spawn_controller
from podium.debugger import commands
from podium.debugger.commands import CommandError
from podium.debugger.prompt_io import DebugIO, IOClosed, LocalIO
from podium.debugger import logs as _logs
from podium._src.dashboard.state import Collector
from podium.debugger.endpoint import CONTROLLER_NAME, Listener, has_secret
from podium.debugger.shell import Runner

PROMPT = "podium_dbg> "
LOCAL = "podium.debug()"  # the client name of the controller's own prompt
# podium.dashboard(), set by podium._src.dashboard when it is imported: what `podium
# dashboard` asks this controller to run.
start_dashboard: Optional[Any] = None
BANNER = ("\n************************ PODIUM DEBUGGER ************************\n"
          "Enter 'help' for a list of commands.\n"
          "Enter 'list' to show all active breakpoints.\n\n")


@dataclass(order=True)
class DebugSessionInfo:
    """One row of ``list``, as Monarch's."""

    actor_name: str
    rank: int
    coords: Dict[str, int]
    hostname: str
    function: Optional[str]
    lineno: Optional[int]


class _Session:
    def __init__(self, info: Dict[str, Any]) -> None:
        self.actor_name: str = info["actor_name"]
        self.rank: int = int(info["rank"])
        self.coords: Dict[str, int] = dict(info["coords"])
        self.hostname: str = info["hostname"]
        self.actor_id: str = info.get("actor_id", "")
        self.function: Optional[str] = info.get("function")
        self.lineno: Optional[int] = info.get("lineno")
        self.output = ""  # what it printed since its last command
        self.pending: Optional["asyncio.Future[str]"] = None  # its read, waiting for a line
        self.ended = False
        self.changed = asyncio.Event()

    def info(self) -> DebugSessionInfo:
        return DebugSessionInfo(self.actor_name, self.rank, dict(self.coords), self.hostname,
                                self.function, self.lineno)

    def name(self) -> str:
        return f"{self.actor_name} {self.rank} ({self.hostname})"

    def send(self, line: str) -> None:
        fut, self.pending = self.pending, None
        self.output = ""
        if fut is not None and not fut.done():
            fut.set_result(line)

    async def settled(self) -> None:
        """Returns once the session waits for a command or has ended."""
        while True:
            self.changed.clear()
            if self.ended or self.pending is not None:
                return
            await self.changed.wait()


class DebugController(Actor):
    """The job's debugger: registers the sessions of stopped actors and runs the prompt."""

    def __init__(self) -> None:
        self.sessions: Dict[Tuple[str, int], _Session] = {}
        self.some_session: Optional[asyncio.Event] = None
        self.prompt_task: Optional["asyncio.Task[None]"] = None
        self.prompt_io: Optional[DebugIO] = None
        self.locals: Dict[str, LocalIO] = {}  # the prompt's client (LOCAL, or a command's)
        self.listener = Listener()  # the debug address (endpoint.py), started on first use
        self.runner = Runner()  # podium exec (shell.py)
        self.logs = _logs.Reads()  # podium logs (logs.py)
        self.collector: Any = None  # the dashboard's (podium._src.dashboard.state)

    def _event(self) -> asyncio.Event:
        if self.some_session is None:
            self.some_session = asyncio.Event()
        return self.some_session

    async def _ensure_server(self) -> None:
        self.listener.start()  # DB-9: a failure to listen is reported once, and not fatal

    # --- what stopped actors call (session.py) ----------------------------------------------

    @concurrent_endpoint
    async def session_start(self, info: Dict[str, Any]) -> str:
        """Registers a stopped actor; returns the name it is listed under: its mesh name,
        with ".2", ".3"... when another actor mesh of that name has a session at that rank."""
        await self._ensure_server()  # a failure to listen is reported, and not fatal
        name, rank, n = info["actor_name"], int(info["rank"]), 1
        while True:
            old = self.sessions.get((name, rank))
            if old is None:
                break
            if old.actor_id == info.get("actor_id"):  # its proc died, or a restart: replaced
                old.ended = True
                old.changed.set()
                break
            n += 1
            name = f"{info['actor_name']}.{n}"
        self.sessions[(name, rank)] = _Session(dict(info, actor_name=name))
        self._event().set()
        return name

    @concurrent_endpoint
    async def session_read(self, actor_name: str, rank: int, output: str,
                           function: Optional[str], lineno: Optional[int]) -> str:
        s = self._get(actor_name, rank)
        s.output += output
        if function is not None:
            s.function, s.lineno = function, lineno
        fut: "asyncio.Future[str]" = asyncio.get_running_loop().create_future()
        s.pending = fut
        s.changed.set()
        return await fut

    @concurrent_endpoint
    async def session_end(self, actor_name: str, rank: int, output: str) -> None:
        s = self.sessions.pop((actor_name, int(rank)), None)
        if s is None:
            return
        s.output += output
        s.ended = True
        s.changed.set()
        if not self.sessions and self.some_session is not None:
            self.some_session.clear()

    def _get(self, actor_name: str, rank: int) -> _Session:
        s = self.sessions.get((actor_name, int(rank)))
        if s is None:
            names = sorted({a for a, _ in self.sessions})
            raise ValueError(f"no debug session for actor {actor_name} rank {rank} (actors "
                             f"with sessions: {', '.join(names) or 'none'})")
        return s

    # --- what programs call -------------------------------------------------------------------

    @concurrent_endpoint  # a prompt slow to read its table holds up no session
    async def list(self, print_output: bool = True) -> "List[DebugSessionInfo]":
        """The stopped actors (DB-6); with print_output (the default, as Monarch's), their
        table goes to the prompt, or to the controller's stdout when no prompt runs."""
        infos = sorted(s.info() for s in self.sessions.values())
        if print_output:
            if self.prompt_io is not None:
                await self.prompt_io.output(table(infos))
            else:
                sys.stdout.write(table(infos))
                sys.stdout.flush()
        return infos

    @concurrent_endpoint
    async def wait_pending_session(self, count: int = 1) -> int:
        """Returns the number of sessions once there are at least ``count``."""
        while len(self.sessions) < count:
            ev = self._event()
            ev.clear()
            await ev.wait()
        return len(self.sessions)

    @concurrent_endpoint
    async def server_address(self) -> Tuple[str, int, bool]:
        """(host, port, whether a client must prove the job's secret) of the debug address
        (endpoint.py); raises when it could not listen (DB-9)."""
        await self._ensure_server()
        host, port = self.listener.where()
        return host, port, has_secret()

    @concurrent_endpoint
    async def exchange(self, line: Optional[str], client: str = LOCAL) -> Tuple[str, bool]:
        """The prompt of ``client`` (podium.debug(), or a `podium debug` command): None opens
        a prompt (replacing any other); a line is its next input. Returns what the prompt
        wrote since, and whether it has finished (quit, or another prompt took over)."""
        io = self.locals.get(client)
        if line is None or io is None or (io.done and client == LOCAL):
            if line is not None and client != LOCAL:  # its prompt was replaced and told so
                return "podium debug: this prompt has ended\n", True
            for name in [n for n, old in self.locals.items() if old.done]:
                del self.locals[name]
            io = self.locals[client] = LocalIO()
            await self.run_prompt(io)
        elif not io.done:
            io.turn.clear()
            io.lines.put_nowait(line)
        await io.turn.wait()
        io.turn.clear()
        text, done = io.take(), io.done
        if done and self.locals.get(client) is io:
            del self.locals[client]
        return text, done

    @concurrent_endpoint
    async def close_prompt(self, client: str) -> None:
        """The client's terminal ended (end of input, interrupted): its prompt ends, as a
        `quit` would, wherever it was (in an attach too); stopped actors stay stopped."""
        io = self.locals.get(client)
        if io is not None and not io.done:
            io.lines.put_nowait(None)

    @concurrent_endpoint
    async def watch_prompt(self, client: str) -> Optional[str]:
        """Returns once the client's prompt has ended: what it was told last when another
        prompt took over (a `podium debug` waiting for its terminal shows it and ends), else
        None (it ended otherwise: its exchange returns the rest)."""
        io = self.locals.get(client)
        if io is None:
            return None
        await io.closed.wait()
        if not io.replaced:
            return None
        if self.locals.get(client) is io:
            del self.locals[client]
        return io.take()

    @concurrent_endpoint
    async def exec_command(self, select: str, point: Optional[str], command: str,
                           timeout: float) -> Tuple[str, int]:
        """`podium exec` (shell.py, DB-10): (its output, 0 when every command exited 0 else
        1); does not disturb the prompt."""
        return await self.runner.run(select, point, command, timeout)

    @concurrent_endpoint
    async def logs_open(self, mesh: str, rank: Optional[int], tail: int,
                        follow: bool) -> Tuple[Optional[int], str]:
        """`podium logs` (logs.py, PL-3): (a handle for logs_next with ``follow``, else None;
        the lines read, ending with the summary line when there is no handle)."""
        return await self.logs.open(mesh, rank, tail, follow)

    @concurrent_endpoint
    async def logs_next(self, handle: int) -> Tuple[str, bool]:
        """The lines the procs of a followed read added since (waits a little for some), and
        whether the read has ended."""
        return await self.logs.next(handle)

    @concurrent_endpoint
    async def logs_close(self, handle: int) -> None:
        self.logs.close(handle)

    @concurrent_endpoint
    async def dashboard_url(self) -> str:
        """`podium dashboard`: starts the dashboard in this process (podium._src.dashboard),
        on loopback, and returns its URL."""
        if start_dashboard is None:
            raise RuntimeError("podium's dashboard module is not loaded in the controller")
        dash = await asyncio.to_thread(start_dashboard)
        return dash.url

    @concurrent_endpoint
    async def dashboard_state(self) -> Dict[str, Any]:
        """One snapshot of the job for the dashboard's page (DS-1..DS-3): what every
        dashboard, the controller's or `podium dashboard --serve`'s, shows."""
        if self.collector is None:
            self.collector = Collector(self)
        return await asyncio.to_thread(self.collector.snapshot)

    # --- the prompt --------------------------------------------------------------------------

    async def run_prompt(self, io: DebugIO) -> None:
        """Starts the prompt on ``io``, replacing the one before."""
        old, self.prompt_task = self.prompt_task, None
        old_io = self.prompt_io
        if old is not None and not old.done():
            old.cancel()
            try:
                await old
            except BaseException:
                pass
            if old_io is not None:
                if isinstance(old_io, LocalIO):
                    old_io.replaced = True
                try:  # its reader learns why (podium.debug() returns)
                    await old_io.close("podium debug: another prompt took over this "
                                       "debugger\n")
                except Exception:
                    pass
        self.prompt_io = io
        self.prompt_task = asyncio.get_running_loop().create_task(self._prompt(io))

    async def _prompt(self, io: DebugIO) -> None:
        try:
            await io.output(BANNER)
            while True:
                line = await io.input(PROMPT)
                try:
                    cmd = commands.parse(line)
                    if cmd is None:
                        continue
                    if isinstance(cmd, commands.Quit):
                        await io.close("Quitting the debugger; stopped actors stay stopped "
                                       "(podium debug attaches again).\n")
                        return
                    await self._run(io, cmd)
                except CommandError as e:  # DB-1
                    await io.output(f"error: {e}\n")
                except (IOClosed, asyncio.CancelledError):
                    raise
                except Exception as e:  # a session that vanished, ...: the prompt goes on
                    await io.output(f"error: {e}\n")
        except IOClosed:
            await io.close("")
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            if self.prompt_io is io:
                self.prompt_io = None

    async def _run(self, io: DebugIO, cmd: Any) -> None:
        if isinstance(cmd, commands.Help):
            await io.output(commands.HELP)
        elif isinstance(cmd, commands.ListSessions):
            await io.output(table(sorted(s.info() for s in self.sessions.values())))
        elif isinstance(cmd, commands.Attach):
            await self._attach(io, self._get(cmd.actor_name, cmd.rank))
        elif isinstance(cmd, commands.Cast):
            chosen = [s for (a, _), s in sorted(self.sessions.items())
                      if a == cmd.actor_name and commands.selects(cmd.ranks, s.rank, s.coords)]
            if not chosen:
                raise CommandError(f"cast: no stopped rank of actor {cmd.actor_name} matches "
                                   f"{cmd.ranks}")
            await self._cast(io, chosen, cmd.command)
        elif isinstance(cmd, commands.Continue):
            chosen = [s for _, s in sorted(self.sessions.items())]
            if not chosen:
                await io.output("no stopped actors\n")
                return
            await self._cast(io, chosen, "clear", show=False)
            await self._cast(io, [s for s in chosen if not s.ended], "continue", show=False)
            await io.output(f"resumed {len(chosen)} stopped actor(s)\n")

    async def _attach(self, io: DebugIO, s: _Session) -> None:
        await io.output(f"Attached to debug session for {s.name()}\n")
        shown = 0
        while True:
            await s.settled()
            if len(s.output) > shown:
                await io.output(s.output[shown:])
                shown = len(s.output)
            if s.ended:
                await io.output(f"The debug session of {s.name()} has ended (it resumed)\n")
                return
            line = await io.input("")
            if s.ended:
                await io.output(f"The debug session of {s.name()} has ended (it resumed)\n")
                return
            if line.strip() == "detach":
                await io.output(f"Detached from debug session for {s.name()}\n")
                return
            s.send(line)
            shown = 0

    async def _cast(self, io: DebugIO, chosen: "List[_Session]", line: str,
                    show: bool = True) -> None:
        await asyncio.gather(*(s.settled() for s in chosen))
        sent = [s for s in chosen if not s.ended]
        for s in sent:
            s.send(line)
        await asyncio.gather(*(s.settled() for s in sent))
        if show:
            for s in sent:
                text = s.output
                if text.endswith("(Pdb) "):
                    text = text[: -len("(Pdb) ")]
                state = " (resumed)" if s.ended else ""
                await io.output(f"[{s.actor_name} {s.rank}]{state}\n{text}")
                if text and not text.endswith("\n"):
                    await io.output("\n")


def table(infos: "List[DebugSessionInfo]") -> str:
    """The grid of ``list``: actor, rank, coordinates, host, function, line."""
    headers = ["Actor", "Rank", "Coords", "Hostname", "Function", "Line"]
    rows = [[i.actor_name, str(i.rank),
             "{" + ", ".join(f"{k}: {v}" for k, v in i.coords.items()) + "}",
             i.hostname, i.function or "", "" if i.lineno is None else str(i.lineno)]
            for i in infos]
    widths = [max(len(h), *(len(r[c]) for r in rows)) if rows else len(h)
              for c, h in enumerate(headers)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+\n"

    def line(cells: List[str]) -> str:
        return "|" + "|".join(f" {c:<{w}} " for c, w in zip(cells, widths)) + "|\n"

    out = [rule, line(headers), rule.replace("-", "=")]
    for r in rows:
        out += [line(r), rule]
    if not rows:
        out.append(rule)
    return "".join(out) + f"{len(rows)} stopped actor(s)\n"


@functools.lru_cache(maxsize=None)
def debug_controller() -> Any:
    """The job's DebugController (an ActorMesh of one), spawned on first use, as Monarch's.
    Called in the controller process, it also starts listening on the debug address, so that
    `podium debug` and `podium exec` reach the job from then on (DB-8; an address it cannot
    listen on is reported: DB-9)."""
    mesh = get_or_spawn_controller(CONTROLLER_NAME, DebugController).get()
    if not _server.in_proc():
        try:
            mesh.server_address.call_one().get()
        except Exception:  # DB-9: warned on stderr; breakpoints and podium.debug() still work
            pass
    return mesh
