"""The controller's end of streamed proc output (``logging_option(stream_to_client=True)``).

Procs whose mesh streams to the client send what they write (output.py, in batches: one
message per burst, never one per line) to a port of this process: the sink's. A batch is
``(log_id, proc, host, pid, seq, [(fd, prefix, text), ...])``: which mesh, which proc, its
host and pid, the batch's number in that proc's sequence, and the lines (fd 1 or 2; the
``[<mesh> <rank>] `` prefix that output.py adds, "" outside actors; the text as written).

Per mesh (``log_id``), the sink either prints each line at once, as
``[<host> <pid>] <prefix><text>`` on the controller's stdout or stderr (no aggregation), or
folds the lines of a window into groups of similar lines (log_aggregate.py) and prints each
group once with its count when the window closes. A window opens with the first line after
the last print and closes ``aggregate_window_sec`` later; stdout and stderr are aggregated
apart and printed to the controller's stdout and stderr.

The sink's threads: ``podium-log-sink`` reads the port (it waits in ``select()`` on an eventfd
that the receive's completion writes, so that it never drives the runtime's loop) and files
each batch; ``podium-log-window`` prints windows when they
close. A lock guards the meshes' state; printing happens under it, so a window's block is
never interleaved with another's; the controller's own writes are not under it, and the
sink's lines never land inside one of them (line_guard.py, LG-8).

  LG-5 settle(log_id, expected) returns only once every batch up to expected[proc] of every
    listed proc has been filed (or the timeout passed, and then it names the procs whose
    batches did not arrive), and it prints everything the mesh's windows hold: a line a proc
    wrote before it answered a flush is printed exactly once, before settle returns.
"""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from podium._core import mesh as _mesh
from podium._src.errors import CoreError
from podium._src import line_guard
from podium._src.log_aggregate import MAX_GROUPS, Aggregator
from podium._src.ports import Channel

_BARRIER = "podium-log-barrier"  # a marker the sink sends itself (barrier())


class _MeshLog:
    """One proc mesh's stream at the sink (guarded by the sink's lock)."""

    def __init__(self) -> None:
        self.window: Optional[float] = None  # None: print each line at once
        self.aggs: Dict[int, Aggregator] = {1: Aggregator(), 2: Aggregator()}
        self.deadline: Optional[float] = None  # monotonic; when the open window closes
        self.received: Dict[str, int] = {}  # proc -> highest batch number filed


class Sink:
    def __init__(self) -> None:
        self.port, self._receiver = Channel.open()  # starts the runtime if need be
        self._cv = threading.Condition(threading.Lock())
        self._meshes: Dict[str, _MeshLog] = {}
        self._closed = False
        self._barrier_sent = self._barrier_seen = 0
        self._wake = os.pipe()  # close() wakes the reading thread
        self._threads = [
            threading.Thread(target=self._read, name="podium-log-sink", daemon=True),
            threading.Thread(target=self._windows, name="podium-log-window", daemon=True)]
        for t in self._threads:
            t.start()

    # --- what logs.py asks ------------------------------------------------------------------

    def register(self, log_id: str) -> None:
        with self._cv:
            self._meshes.setdefault(log_id, _MeshLog())

    def settle(self, log_id: str, expected: Dict[str, int], timeout: float,
               window: Any = "keep") -> List[str]:
        """Waits until the batches ``expected`` (proc -> batch number) were filed, prints
        the mesh's windows, then sets its window (seconds, or None: no aggregation) unless
        ``window`` is "keep". Returns the procs whose batches did not arrive in time (LG-5)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            m = self._meshes.get(log_id)
            if m is None:
                return []

            def arrived() -> bool:
                return all(m.received.get(p, 0) >= n for p, n in expected.items())

            while not arrived():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            missing = [p for p, n in expected.items() if m.received.get(p, 0) < n]
            self._print_windows(m)
            if window != "keep":
                m.window = window
            return missing

    def barrier(self, timeout: float) -> bool:
        """Waits until every batch this process had received when called is filed: sends a
        marker to the sink's own port, behind them, and waits for it (False: not in
        ``timeout``)."""
        with self._cv:
            if self._closed:
                return False
            self._barrier_sent += 1
            token = self._barrier_sent
        self.port.send((_BARRIER, token))
        with self._cv:
            return self._cv.wait_for(lambda: self._barrier_seen >= token, timeout)

    def print_windows(self, log_id: str) -> None:
        with self._cv:
            m = self._meshes.get(log_id)
            if m is not None:
                self._print_windows(m)

    def flush_all(self) -> None:
        """Prints every mesh's open windows."""
        with self._cv:
            for m in self._meshes.values():
                self._print_windows(m)

    def close(self) -> None:
        """The process exits: prints every open window and ends the sink's threads."""
        self.flush_all()
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        os.write(self._wake[1], b"x")
        for t in self._threads:
            t.join(timeout=2.0)

    # --- the threads ------------------------------------------------------------------------

    def _read(self) -> None:
        # The receive's completion writes an eventfd; this thread waits in select(), never
        # inside the runtime, so that no thread of ours is in it when it shuts down.
        notifier = _mesh.Notifier()
        fut = self._receiver.recv()
        fut._core.notify(notifier, 0)
        while True:
            select.select([notifier.fileno(), self._wake[0]], [], [])
            with self._cv:
                if self._closed:
                    return
            notifier.drain()
            if not fut.done():
                continue
            try:
                batch = fut.get(0)
            except CoreError:  # the receiver closed: the runtime stops
                return
            except Exception as e:  # a batch that does not decode: say so, keep reading
                batch = None
                _write(2, f"podium: a batch of streamed proc output could not be read: {e}\n")
            fut = self._receiver.recv()
            fut._core.notify(notifier, 0)
            if batch is None:
                continue
            try:
                self._file(batch)
            except Exception as e:
                _write(2, f"podium: a batch of streamed proc output was malformed: {e!r}\n")

    def _file(self, batch: Tuple[Any, ...]) -> None:
        if batch[0] == _BARRIER:
            with self._cv:
                self._barrier_seen = max(self._barrier_seen, batch[1])
                self._cv.notify_all()
            return
        log_id, proc, host, pid, seq, lines = batch
        with self._cv:
            m = self._meshes.get(log_id)
            if m is None:  # a mesh this sink does not know (not expected): print as is
                m = self._meshes[log_id] = _MeshLog()
            if m.window is None:
                out: Dict[int, List[str]] = {1: [], 2: []}
                for fd, prefix, text in lines:
                    out[2 if fd == 2 else 1].append(f"[{host} {pid}] {prefix}{text}\n")
                for fd in (1, 2):
                    if out[fd]:
                        _write(fd, "".join(out[fd]))
            else:
                for fd, prefix, text in lines:
                    agg = m.aggs[2 if fd == 2 else 1]
                    agg.add(prefix, text)
                    if len(agg) >= MAX_GROUPS:  # a window this varied is printed early
                        self._print_windows(m)
                if m.deadline is None and any(len(a) for a in m.aggs.values()):
                    m.deadline = time.monotonic() + m.window
                if m.deadline is not None and m.deadline <= time.monotonic():
                    self._print_windows(m)  # a window of 0 s: each batch at once
            if seq > m.received.get(proc, 0):
                m.received[proc] = seq
            self._cv.notify_all()  # settle() waits for batches; the window thread for closes

    def _windows(self) -> None:
        with self._cv:
            while not self._closed:
                now = time.monotonic()
                due = [m for m in self._meshes.values()
                       if m.deadline is not None and m.deadline <= now]
                for m in due:
                    self._print_windows(m)
                closes = [m.deadline for m in self._meshes.values() if m.deadline is not None]
                self._cv.wait(min(closes) - now if closes else None)

    def _print_windows(self, m: _MeshLog) -> None:
        """Prints the mesh's open windows (the lock is held)."""
        m.deadline = None
        for fd in (1, 2):
            agg = m.aggs[fd]
            if len(agg):
                _write(fd, agg.render(_isatty(fd)))


def _stream(fd: int) -> Any:
    return sys.stderr if fd == 2 else sys.stdout


def _isatty(fd: int) -> bool:
    try:
        return bool(_stream(fd).isatty())
    except Exception:
        return False


def _write(fd: int, text: str) -> None:
    stream = _stream(fd)
    if stream is None:
        return
    try:
        if isinstance(stream, line_guard.LineGuard):
            stream.emit(text)  # never inside a line the controller is writing (LG-8)
            return
        stream.write(text)
        stream.flush()
    except Exception:  # a closed stream at exit: the lines can go nowhere else
        pass


_sink: Optional[Sink] = None
_sink_lock = threading.Lock()


def sink() -> Sink:
    """This process's sink, started on first use."""
    global _sink
    with _sink_lock:
        if _sink is None:
            _sink = Sink()
        return _sink


def existing() -> Optional[Sink]:
    return _sink
