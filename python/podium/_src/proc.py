"""The entry point of a proc: ``python -m podium._src.proc`` (started by the C++ runtime with
PODIUM_BOOT set). It serves Python actors until the controller says exit, or dies.

A proc told to exit ends as a Python program does (BT-4, cpp/podium/mesh/bootstrap.h):
serve_proc() stops the procs this one spawned and the C++ runtime, and returns; the actor
threads are stopped; then the interpreter finalizes (atexit handlers, ``__del__`` of module
objects, flushed output). A C++ watchdog ends the process if that takes longer than
``PODIUM_PROC_EXIT_GRACE_MS`` (default 3000, below ProcMesh.stop's kill grace)."""

from __future__ import annotations

import faulthandler
import os
import sys

from podium._core import mesh as _mesh
from podium._src import output, server
from podium.debugger import remote as debug_remote


def main() -> int:
    if not _mesh.is_proc():
        print("podium._src.proc is started by podium's runtime, not by hand", file=sys.stderr)
        return 2
    # Output reaches the controller's terminal line by line, each line in one write(2) and,
    # when an actor wrote it, prefixed with the actor's name and rank (see output.py).
    output.install()
    # A fatal signal (a segfault in an extension, an abort) writes every thread's Python stack
    # to fd 2, which reaches the controller's terminal and the proc's log file, then ends the
    # proc by the same signal: its exit status, and so the cause callers see, is unchanged.
    faulthandler.enable(all_threads=True)
    # serve_proc() reads PODIUM_BOOT, PODIUM_SPAWN, PODIUM_LINEAGE and PODIUM_DEATH_WATCH from
    # the C environment and unsets them (BT-1, BT-3, BT-5, DW-1); os.environ, read at start,
    # must not keep them either, or a program an actor starts with a copy of it
    # (env={**os.environ, ...}) would think it is a proc, or death-watched.
    for key in ("PODIUM_BOOT", "PODIUM_SPAWN", "PODIUM_LINEAGE", "PODIUM_DEATH_WATCH"):
        value = os.environ.pop(key, None)
        if value is not None:
            os.putenv(key, value)  # the C environment only, for serve_proc
    server.mark_proc()
    # breakpoint() in an endpoint opens a session with the job's debugger (DB-2).
    debug_remote.install()
    server.start()
    rc = 0
    try:
        _mesh.serve_proc()
    except BaseException as e:  # a bad PODIUM_BOOT, a failed listen, Ctrl-C
        print(f"podium proc {os.getpid()}: {e}", file=sys.stderr)
        rc = 2
    output.stop_streaming()  # the runtime is gone: pending streamed lines go to our fds
    server.stop()
    return rc


if __name__ == "__main__":
    # The interpreter finalizes (BT-4); actor threads still inside user code are daemons and
    # do not hold it up, and the watchdog bounds what does.
    sys.exit(main())
