"""The proc side of the debugger: ``breakpoint()`` in an actor endpoint, and post-mortem.

Every proc installs ``hook`` as ``sys.breakpointhook`` when it starts (proc.py). Called on an
actor's thread, it opens a pdb session whose input and output travel as calls to the debug
controller (an actor of the controller process: controller.py), over podium's authenticated
channels. Called outside an endpoint (a proc's own code), it does what Python's default hook
does.

  DB-2 ``breakpoint()`` in an endpoint stops that actor's thread only: its other calls queue
    in its inbox and run, in order, once it resumes; other actors of the same proc and
    other ranks run on. The session it opens is listed by the controller with the actor's
    mesh name, the rank and coordinates of the message, the host, and the function and line
    it stopped at.
  DB-3 pdb's output is sent with each read of its next command (one round trip per command),
    and what is left with the end of the session: nothing it prints is lost.
  DB-4 A session ends when pdb resumes with no breakpoint left (``continue``), quits, or the
    call returns or raises; the controller then no longer lists it. If the controller cannot
    be reached, the actor resumes (a warning on stderr names the actor and why); it never
    stays stopped with nobody to talk to.
  DB-5 Post-mortem: with PODIUM_DEBUG_POST_MORTEM=1 in a proc's environment (or inside a
    session already open in the call), an endpoint's Exception opens a post-mortem session
    at the frame that raised, before its caller gets the ActorError; the call fails as it
    would have once the session ends.
"""

from __future__ import annotations

import bdb
import os
import sys
from types import TracebackType
from typing import Any, Optional

from podium._src import context as _context
from podium._src import server as _server
from podium.debugger.session import current_session, DebugPdb, open_sessions

POST_MORTEM_ENV = "PODIUM_DEBUG_POST_MORTEM"


def hook(*args: Any, **kwargs: Any) -> Any:
    """sys.breakpointhook of a proc (DB-2)."""
    ctx = _context.actor_context()
    if ctx is None:
        return sys.__breakpointhook__(*args, **kwargs)
    if os.environ.get("PYTHONBREAKPOINT") == "0":
        return None
    frame = sys._getframe(1)
    current = current_session()
    if current is not None:
        current.set_trace(frame)  # another breakpoint() in the same session
        return None
    session = DebugPdb(ctx)
    if session.start(frame):
        session.set_trace(frame)
    return None


def post_mortem(e: BaseException) -> None:
    """Called by the actor's thread with what an endpoint raised, in the call's context (DB-5).
    Never raises."""
    try:
        if not isinstance(e, Exception) or isinstance(e, bdb.BdbQuit):
            return
        current = current_session()
        if current is None and os.environ.get(POST_MORTEM_ENV) != "1":
            return
        ctx = _context.actor_context()
        tb: Optional[TracebackType] = e.__traceback__
        if ctx is None or tb is None:
            return
        if current is not None:
            current.set_continue_quietly()
        last = tb
        while last.tb_next is not None:
            last = last.tb_next
        session = DebugPdb(ctx)
        if not session.start(last.tb_frame):
            return
        session.message(f"podium: post-mortem of {type(e).__name__}: {e}")
        session.reset()
        session.interaction(None, tb)
        session.end()
    except BaseException as err:  # the call still fails with e
        sys.stderr.write(f"podium: debugger: post-mortem failed: {type(err).__name__}: {err}\n")


def call_finished() -> None:
    """The call that ran on this thread returned or raised: a session still open ends (DB-4)."""
    if not open_sessions[0]:
        return
    current = current_session()
    if current is not None:
        current.set_continue_quietly()


def install() -> None:
    """Makes breakpoint() in this proc's endpoints open debug sessions."""
    sys.breakpointhook = hook
    _server.debug_hooks = (post_mortem, call_finished)
