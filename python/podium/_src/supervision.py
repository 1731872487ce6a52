"""Supervision on the Python side: MeshFailure, running ``__supervise__`` on the owner of a
failed mesh, and ``unhandled_fault_hook`` for failures that reach the root of a process.

Detection and routing are C++ (cpp/podium/supervision/supervisor.h): the proc of a failed actor, or
the controller that saw a proc die, tells the process that owns the mesh; its Supervisor
raises the failure once (SV-2) to the owner (SV-3). An owner actor gets it in its Inbox as an
item of kind "supervise" (server.py calls ``__supervise__``); the root gets it through
``podium._core.mesh.next_fault``, which the thread started here pops to run
``podium.actor.unhandled_fault_hook``.

See docs/supervision.md for the model and the texts users see.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
import weakref
from typing import Any, Dict, Optional

from podium._core import mesh as _mesh

# The fault thread's wait: the binding's longest (about 11 days), so that only a failure or
# interrupt_faults() (at exit) ends it; the thread loops only then.
_UNTIL_WOKEN_S = 1e6
_EXIT_DRAIN_S = 0.05  # at exit: how long to wait for a failure still on its way

_lock = threading.Lock()
_busy = threading.Lock()  # held by the fault thread while it waits for or runs a failure
_thread: Optional[threading.Thread] = None
_stopping = False
_exiting = False
_exit_thread: Optional[int] = None  # the thread ending the process (_exit_process)
# podium.actor, handed in by it on import (bind_hook_module): the user may replace its
# unhandled_fault_hook, so the hook is looked up there each time.
_hook_module: Any = None
# Actor meshes spawned from this process, by name (MeshFailure.mesh).
_meshes: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


class MeshFailure:
    """A failure of one actor of a mesh, as its owner sees it (``__supervise__``) and as
    ``unhandled_fault_hook`` receives it. Attributes: ``mesh_name``, ``actor_id`` (full
    ActorId text), ``rank`` and ``point`` (in the region the mesh was spawned on), ``host``,
    ``pid``, ``cause`` (the exception with its remote traceback, the exit status, or the
    report of a failed child), ``kind`` ("actor": the actor failed, its proc lives; "proc":
    the proc ended), ``signal`` (e.g. "SIGKILL", or None) and ``exit_code`` (or None)."""

    __slots__ = ("kind", "mesh_name", "actor_id", "rank", "point", "host", "pid", "signal",
                 "exit_code", "cause", "_report")

    def __init__(self, d: Dict[str, Any]) -> None:
        self.kind: str = d["kind"]
        self.mesh_name: str = d["mesh_name"]
        self.actor_id: str = d["actor_id"]
        self.rank: int = d["rank"]
        self.point: str = d["point"]
        self.host: str = d["host"]
        self.pid: int = d["pid"]
        self.signal: Optional[str] = d["signal"]
        self.exit_code: Optional[int] = d["exit_code"]
        self.cause: str = d["cause"]
        self._report: str = d["report"]

    @property
    def mesh(self) -> Any:
        """The ActorMesh that failed, when this process spawned it and still holds it."""
        return _meshes.get(self.mesh_name)

    def report(self) -> str:
        """The text a user reads: mesh, actor, rank and coordinates, host, pid, cause."""
        return self._report

    def __str__(self) -> str:
        # As Monarch's: names MeshFailure, the mesh and the crashed ranks, then the event
        # (MW-2); report() stays the text alone.
        return (f"MeshFailure(mesh_name={self.mesh_name}, crashed_ranks=[{self.rank}], "
                f"event=The actor {self.mesh_name}{self.point} and all its descendants have "
                f"failed: {self._report})")

    def __repr__(self) -> str:
        return f"<MeshFailure {self._report.splitlines()[0]}>"

    def __reduce__(self):
        return (_rebuild, ({k: getattr(self, k) for k in self.__slots__ if k != "_report"}
                           | {"report": self._report},))


def _rebuild(d: Dict[str, Any]) -> MeshFailure:
    return MeshFailure(d)


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """The default ``podium.actor.unhandled_fault_hook``: prints the report and exits the
    process with status 1 (atexit handlers run). A replacement that returns normally drops the
    fault; one that raises SystemExit(n) exits with n, any other exception with 1."""
    sys.stderr.write(f"podium: unhandled failure, exiting with status 1:\n{failure.report()}\n")
    sys.stderr.flush()
    sys.exit(1)


def bind_hook_module(module: Any) -> None:
    """Called by podium.actor on import with itself: where ``unhandled_fault_hook`` lives."""
    global _hook_module
    _hook_module = module


def register_mesh(mesh: Any) -> None:
    _meshes[mesh.name] = mesh


def start() -> None:
    """Failures of meshes owned by this process's root go to the hook thread (idempotent)."""
    global _thread
    with _lock:
        if _thread is not None:
            return
        _mesh.serve_faults()
        _thread = threading.Thread(target=_fault_main, name="podium-faults", daemon=True)
        _thread.start()


def _fault_main() -> None:
    while True:
        with _busy:
            if _stopping:
                return
            d = _mesh.next_fault(_UNTIL_WOKEN_S)
            if d is not None:
                _run_hook(MeshFailure(d))


def _run_hook(failure: MeshFailure) -> None:
    hook = getattr(_hook_module, "unhandled_fault_hook", unhandled_fault_hook)
    try:
        hook(failure)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        _exit_process(code)
    except BaseException:
        sys.stderr.write("podium: unhandled_fault_hook raised; exiting with status 1:\n")
        traceback.print_exc()
        _exit_process(1)


def _exit_process(code: int) -> None:
    """Ends this process with `code` after its atexit handlers (podium's own stop the procs)."""
    global _exiting, _exit_thread
    with _lock:
        first = not _exiting
        if first:
            _exiting, _exit_thread = True, threading.get_ident()
    if not first:
        _wait_for_exit_elsewhere()
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait_for_exit_elsewhere() -> None:
    """Another thread is ending the process (_exit_process): its atexit handlers stop the
    procs, then it calls os._exit with the hook's status. This thread (typically the main
    thread, finishing the program or unwinding a SupervisionError at the same moment) must
    neither finish first with its own status, which would lose the failure, nor run the
    interpreter's finalization under that thread's shutdown. So it waits for that thread's
    os._exit, which is the one exit path: there is no second timer here. The exiting thread's
    own waits are bounded where they are timed, in C++ (stopping procs: ME-8, the
    runtime's shutdown: ME-10)."""
    if _exit_thread == threading.get_ident():
        return  # this thread is the one ending the process
    threading.Event().wait()  # os._exit on the exiting thread ends this wait with the process


def at_exit() -> None:
    """Called by podium's atexit handler first: stops the hook thread and runs the hook for
    failures raised before the program ended (they may arrive just after the caller saw its
    SupervisionError), so a fault is never lost to a race with the exit. If another thread
    is already ending the process for a failure, this waits for it to do so."""
    global _stopping
    with _lock:
        exiting = _exiting
        if not exiting and _thread is None:
            return
        if not exiting:
            _stopping = True
    if exiting:
        _wait_for_exit_elsewhere()
        return
    _mesh.interrupt_faults()
    with _busy:  # a failure the thread holds is run (or ends the process) first
        pass
    while True:
        d = _mesh.next_fault(_EXIT_DRAIN_S)
        if d is None:
            return
        _run_hook(MeshFailure(d))
