"""``ProcMesh.logging_option``: how a proc mesh's processes log, as Monarch's.

``level`` sets the root logger's level in every proc of the mesh (and gives the root logger a
handler to the proc's stderr when it has none, so that records below WARNING show at all);
``print`` is never filtered.

Where the procs' output goes (what they write through ``sys.stdout`` / ``sys.stderr``, each
line with its ``[<mesh> <rank>]`` prefix, output.py):
- a mesh that never called logging_option: the procs' own stdout and stderr (the controller's
  terminal for local procs; for procs on attached hosts, the worker's pipes, which it forwards
  to the controller, HA-6). Monarch's default streams nothing either.
- ``stream_to_client=True``: each proc sends its lines, in batches, to this process's log sink
  over the runtime (log_forward.py, log_sink.py), on any host. With
  ``aggregate_window_sec=None`` the sink prints each line at once as
  ``[<host> <pid>] <prefix><line>``; with a number of seconds W, the lines of a W-second
  window that are similar (log_aggregate.py) print once as ``[<n> similar log lines] <line>``
  between ``>>> Aggregated Logs (...) >>>`` / ``<<< Aggregated Logs (...) <<<`` lines,
  stdout's to stdout and stderr's to stderr, as Monarch prints them.
- ``stream_to_client=False``: a file per proc, ``<log dir>/proc-<pid>.log``, where the log
  dir is ``$PODIUM_LOG_DIR`` or ``<tmp>/podium-logs-<uid>``; ``aggregate_window_sec`` is then
  a ValueError, as in Monarch.

Nothing streamed is lost: a change of logging_option, the mesh's stop (``ProcMesh.stop``,
``HostMesh.stop`` / ``shutdown``), the end of a notebook cell (IPython's ``post_run_cell``, as
Monarch's) and the controller's exit print every line the procs wrote before it, windows
included. An actor's stop sends its lines before it is acknowledged, and
``stop()``'s Future resolves after the sink filed them and printed the mesh's windows.

  LG-3 logging_option(level=L, stream_to_client=S) applies to every proc of the mesh before
    its Future resolves: their root loggers have level L, and their output goes to the client
    when S, to their own log file otherwise.
  NB-1 In a notebook, what the procs of a streaming mesh printed during a cell is printed
    at the end of that cell (IPython's post_run_cell), so it shows in that cell's outputs,
    aggregated windows included; a controller that re-attached to persistent procs (a
    restarted kernel) streams their later lines the same way, without waiting for lines
    they sent to the controller before it.
  LG-7 When logging_option's Future resolves, every line the mesh's procs wrote before it
    has been printed (or written to their files), and when stop()'s Future resolves, every
    line they wrote before their actors stopped has been printed: each exactly once.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sys
import threading
import uuid
from typing import Any, Dict, List, Optional, Tuple

from podium._core import mesh as _mesh
from podium._src import log_sink, output, proc_log, server
from podium._src.endpoint import Actor, endpoint
from podium._src.future import CoroFuture, Future

# Bound on each wait for the procs' flush and for their batches to reach the sink.
FLUSH_TIMEOUT_S = 10.0

_count = 0
_lock = threading.Lock()  # guards _count, _live, every _MeshLogging.controls
_handler: Optional[logging.Handler] = None
_live: List["_MeshLogging"] = []  # meshes that stream, not stopped: flushed at exit
_exit_registered = False
_cell_flush_registered = False


def log_dir() -> str:
    """Where procs write their log files (proc_log.py)."""
    return proc_log.log_dir()


class _LogControl(Actor):
    """Applies the options in its proc, and flushes what it streams. One per proc mesh (or
    slice) that called logging_option; podium's own: no owner supervises it, and it ends
    with its proc."""

    _podium_internal = True

    @endpoint
    def set_option(self, stream_to_client: bool, level: int, port: Any,
                   log_id: str) -> Tuple[str, int, Optional[str]]:
        global _handler
        root = logging.getLogger()
        root.setLevel(level)
        if not root.handlers and _handler is None:
            _handler = logging.StreamHandler()  # sys.stderr when it writes: the prefixing one
            root.addHandler(_handler)
        if _handler is not None:  # ours: it shows records from `level` up, whatever logger
            _handler.setLevel(level)
        sys.stdout.flush()  # partial lines of this thread, before the switch
        sys.stderr.flush()
        if stream_to_client:
            proc, seq = output.forward(port, log_id, _mesh.this_proc_id(), os.getpid())
            return proc, seq, None
        proc, seq = output.divert(True)  # the proc's log file only (proc_log.py)
        return proc, seq, proc_log.log.current_path()

    @endpoint
    def flush(self) -> Tuple[str, int]:
        return output.forward_flush()


class _MeshLogging:
    """A ProcMesh's logging state in this process (its _ProcShared.log)."""

    def __init__(self, log_id: str) -> None:
        self.log_id = log_id
        self.controls: Dict[Tuple[int, ...], Any] = {}  # by the base ranks they run on
        self.streamed = False  # some logging_option streamed to the client
        self.streaming = False  # the last one applied did
        self.stopped = False


def _state(procs: Any) -> _MeshLogging:
    global _count
    shared = procs._shared
    with _lock:
        if shared.log is None:
            _count += 1
            # Unique across the job: procs keep their forwarder while the log_id is theirs.
            shared.log = _MeshLogging(f"{os.getpid()}-{_count}-{uuid.uuid4().hex[:8]}")
        return shared.log


def _control(state: _MeshLogging, procs: Any) -> Any:
    key = tuple(procs._core.region.base_ranks())
    with _lock:
        control = state.controls.get(key)
    if control is None:
        control = procs.spawn(f"podium-logging-{state.log_id}-{len(state.controls)}",
                              _LogControl)
        with _lock:
            control = state.controls.setdefault(key, control)
    return control


def _sink() -> log_sink.Sink:
    global _exit_registered
    sink = log_sink.sink()  # starts the runtime first: our atexit runs before its
    with _lock:
        if not _exit_registered:
            _exit_registered = True
            atexit.register(_at_exit)
    return sink


def _expected(marks: Any) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for mark in marks:
        proc, seq = mark[0], mark[1]
        if proc:
            out[proc] = max(out.get(proc, 0), seq)
    return out


def _settle(state: _MeshLogging, expected: Dict[str, int], window: Any = "keep") -> None:
    missing = _sink().settle(state.log_id, expected, FLUSH_TIMEOUT_S, window)
    if missing:
        print(f"podium: streamed output of proc(s) {', '.join(missing)} did not reach the "
              f"client within {FLUSH_TIMEOUT_S:g} s; it is printed when it arrives",
              file=sys.stderr, flush=True)


def logging_option(procs: Any, stream_to_client: bool = False,
                   aggregate_window_sec: Optional[float] = None,
                   level: int = logging.INFO) -> "Future[None]":
    """See the module docstring; ``procs`` is the ProcMesh. Returns a Future (await it or
    ``.get()``) that resolves once every proc applied the options (LG-3) and the output they
    wrote before is printed (LG-7)."""
    if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= 255:
        raise ValueError(f"Invalid logging level: {level!r}")
    if aggregate_window_sec is not None:
        if not stream_to_client:
            raise ValueError("logging_option: aggregate_window_sec needs stream_to_client=True")
        if (not isinstance(aggregate_window_sec, (int, float))
                or isinstance(aggregate_window_sec, bool) or aggregate_window_sec < 0):
            raise ValueError(f"logging_option: aggregate_window_sec must be a number of "
                             f"seconds >= 0, not {aggregate_window_sec!r}")
    stream = bool(stream_to_client)
    state = _state(procs)
    control = _control(state, procs)
    sink = _sink() if stream or state.streamed else None
    port = None
    if stream:
        sink.register(state.log_id)
        if not state.streaming:  # no line of the old setting to come: the new one applies now
            sink.settle(state.log_id, {}, 0.0, aggregate_window_sec)
        port = sink.port
        with _lock:
            state.streamed = True
            if state not in _live:
                _live.append(state)
        _register_cell_flush()

    was_streaming = state.streaming

    async def apply() -> None:
        marks = await control.set_option.call(stream, level, port, state.log_id)
        state.streaming = stream
        if sink is not None:
            # The lines the procs wrote before the change arrive, and print under the old
            # window; then the new one applies. Only lines streamed to this process's sink
            # are waited for: before a first streaming option here, the procs' lines went
            # elsewhere (their own output, a file, or the sink of the controller that had
            # them before this one re-attached: NB-1).
            expected = _expected(marks.values()) if was_streaming else {}
            window = aggregate_window_sec if stream else None
            await asyncio.get_running_loop().run_in_executor(
                None, _settle, state, expected, window)

    return CoroFuture(apply())


def _register_cell_flush() -> None:
    """In IPython (a notebook), prints what the streaming meshes hold at the end of each
    cell, as Monarch does: a cell's output shows under it, not a window later."""
    global _cell_flush_registered
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return
    try:
        shell = ipython.get_ipython()
    except Exception:
        return
    if shell is None:
        return
    with _lock:
        if _cell_flush_registered:
            return
        _cell_flush_registered = True
    shell.events.register("post_run_cell", _flush_after_cell)


def _flush_after_cell(*_: Any) -> None:
    with _lock:
        live = list(_live)
    for state in live:
        try:
            _flush_procs(state)
        except Exception as e:  # a notebook's cell must not fail for it
            print(f"podium: flushing streamed output after the cell failed: {e}",
                  file=sys.stderr, flush=True)


def before_kill(shared: Any) -> None:
    """The mesh's procs are about to be killed (HostMesh.shutdown): they send what waits to
    stream, and it is printed."""
    state = shared.log
    if state is None or not state.streamed or state.stopped:
        return
    _flush_procs(state)
    after_stop(shared)


def after_stop(shared: Any) -> None:
    """The mesh stopped (its actors sent their lines before they stopped): once the sink
    filed what arrived, its windows print (LG-7)."""
    state = shared.log
    if state is None or not state.streamed:
        return
    with _lock:
        state.stopped = True
        if state in _live:
            _live.remove(state)
    sink = _sink()
    sink.barrier(FLUSH_TIMEOUT_S)
    sink.print_windows(state.log_id)


def _flush_procs(state: _MeshLogging) -> None:
    with _lock:
        controls = list(state.controls.values())
    expected: Dict[str, int] = {}
    for control in controls:
        try:
            marks = control.flush.call().get(timeout=FLUSH_TIMEOUT_S)
        except Exception:  # a proc gone: what it sent is printed below, as it arrived
            continue
        for proc, seq in _expected(marks.values()).items():
            expected[proc] = max(expected.get(proc, 0), seq)
    _settle(state, expected)


def _at_exit() -> None:
    """The controller exits: the procs of meshes still streaming send what waits, and every
    window prints. Registered after the runtime's exit handler, so it runs before it."""
    sink = log_sink.existing()
    if sink is None:
        return
    if not server.in_proc():  # a proc's runtime has stopped before its atexit handlers run
        with _lock:
            live = list(_live)
        for state in live:
            try:
                _flush_procs(state)
            except Exception:
                pass
        sink.barrier(FLUSH_TIMEOUT_S)
    sink.close()
