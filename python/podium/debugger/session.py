"""The pdb of a debug session on a proc: its input and output are calls to the debug controller
(remote.py says when a session opens and ends: DB-2 to DB-5)."""

from __future__ import annotations

import os
import pdb
import socket
import sys
import threading
from types import FrameType
from typing import Any, Dict, Optional

from podium.debugger.controller import debug_controller

_local = threading.local()  # .session: the DebugPdb open on this thread, if any
open_sessions = [0]  # how many are open in this process (a list: remote.py reads it)


def _controller() -> Any:
    return debug_controller()


def _location(frame: Optional[FrameType]) -> tuple:
    if frame is None:
        return None, None
    code = frame.f_code
    module = os.path.splitext(os.path.basename(code.co_filename))[0]
    return f"{module}.{code.co_name}", frame.f_lineno


def current_session() -> Optional["DebugPdb"]:
    return getattr(_local, "session", None)


class _Output:
    """pdb's stdout: kept until the next read or the end of the session (DB-3)."""

    def __init__(self) -> None:
        self.parts: list = []

    def write(self, s: str) -> int:
        self.parts.append(s)
        return len(s)

    def flush(self) -> None:
        pass

    def take(self) -> str:
        text = "".join(self.parts)
        self.parts.clear()
        return text


class _Input:
    """pdb's stdin: each readline is a call to the controller."""

    def __init__(self, session: "DebugPdb") -> None:
        self.session = session

    def readline(self) -> str:
        return self.session._read()


class DebugPdb(pdb.Pdb):
    """pdb on an actor's thread, its stdin and stdout the debug controller's session."""

    def __init__(self, ctx: Any) -> None:
        self._out = _Output()
        super().__init__(stdin=_Input(self), stdout=self._out, nosigint=True)
        self.use_rawinput = False
        self.prompt = "(Pdb) "
        point = ctx.message_rank
        ins = ctx.actor_instance
        self.actor_name = str(ins.name)
        self.rank = int(point.rank)
        self.info: Dict[str, Any] = {
            "actor_name": self.actor_name, "rank": self.rank,
            "coords": {k: int(point[k]) for k in point},
            "hostname": socket.gethostname(), "actor_id": str(ins.actor_id),
            "pid": os.getpid(),
        }
        self._ctrl: Any = None
        self._started = False
        self._lost = False

    # --- the controller ---------------------------------------------------------------------

    def start(self, frame: Optional[FrameType]) -> bool:
        """Registers the session; False (with a warning) when the controller is out of reach."""
        function, lineno = _location(frame)
        try:
            self._ctrl = _controller()
            name = self._ctrl.session_start.call_one(dict(self.info, function=function,
                                                          lineno=lineno)).get()
        except Exception as e:
            self._warn("cannot register its debug session", e)
            return False
        self.actor_name = self.info["actor_name"] = str(name)  # unique among the sessions
        self._started = True
        _local.session = self
        open_sessions[0] += 1
        return True

    def _warn(self, what: str, e: BaseException) -> None:
        sys.stderr.write(f"podium: debugger: actor {self.info['actor_id']} (mesh "
                         f"{self.actor_name}, rank {self.rank}, host {self.info['hostname']}) "
                         f"{what}: {type(e).__name__}: {e}; it resumes\n")
        sys.stderr.flush()

    def _read(self) -> str:
        if self._lost:
            return "c\n"
        function, lineno = _location(self.curframe)
        try:
            line = self._ctrl.session_read.call_one(
                self.actor_name, self.rank, self._out.take(), function, lineno).get()
        except Exception as e:  # DB-4: resume rather than stay stopped with nobody to ask
            self._lost = True
            self._warn("lost the debug controller", e)
            self.clear_all_breaks()
            return "c\n"
        return str(line).rstrip("\n") + "\n"

    def end(self) -> None:
        """DB-4: the controller stops listing this session; the rest of its output goes."""
        if not self._started:
            return
        self._started = False
        if getattr(_local, "session", None) is self:
            _local.session = None
        open_sessions[0] -= 1
        if self._lost:
            return
        try:
            self._ctrl.session_end.call_one(self.actor_name, self.rank, self._out.take()).get()
        except Exception as e:
            self._warn("could not end its debug session", e)

    # --- pdb --------------------------------------------------------------------------------

    def do_clear(self, arg: str) -> Optional[bool]:
        if not arg:  # pdb would ask for a confirmation through input(): clear them all
            self.clear_all_breaks()
            self.message("Deleted all breakpoints")
            return None
        return super().do_clear(arg)

    do_cl = do_clear

    def set_continue(self) -> None:
        super().set_continue()
        if not self.breaks:  # nothing will stop it again: the session is over (DB-4)
            self.end()

    def set_quit(self) -> None:
        super().set_quit()
        self.end()

    def set_continue_quietly(self) -> None:
        """Ends a session whose call is over (or that a post-mortem replaces) without asking
        anything more: no breakpoint left, no tracing on this thread."""
        self.clear_all_breaks()
        self.set_continue()  # with no breakpoint: stops tracing, and end()s
        self.end()
