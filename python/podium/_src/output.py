"""Prefixes what actors print with the actor's name and rank, in a proc.

A proc's stdout and stderr are the controller's (the runtime starts procs with the
controller's file descriptors), so what an actor writes reaches the controller's terminal. The
proc replaces ``sys.stdout`` and ``sys.stderr`` with line writers: each complete line written
while an actor's context is active (its thread, or one of its asyncio tasks) becomes
``[<mesh name> <rank>] <line>`` — ``[trainer {'gpus': 1/4}] loss 0.3`` — and goes to the file
descriptor in one write(2), so lines of different actors and procs never interleave within a
line. Lines written outside any actor (podium's own reports) pass through unchanged. The
actor is known only inside the proc's Python, which is why the prefix is added here and not by
the controller.

A partial line waits for its newline in a per-thread buffer; ``flush()`` writes it out as a
line of its own. Output that bypasses ``sys.stdout`` (C code writing to fd 1) is not prefixed.

Every line also goes to the proc's log file (proc_log.py, PL-1), whatever else happens to it:
what goes to fds 1 and 2 gets there through the pump outside the proc that reads them (PS-4),
and only the lines kept off those fds are written to the log-only pipe here, so none is
there twice.
``ProcMesh.logging_option(stream_to_client=False)`` (logs.py) keeps what this proc writes
through ``sys.stdout``/``sys.stderr`` in that file only, off the client's terminal
(``divert``); ``stream_to_client=True`` sends each line, split into its prefix and
its text, to the controller's log sink over the runtime instead (``forward``, through a
log_forward.Forwarder that batches them), whatever host the proc runs on. A mesh that never
called logging_option writes to the file descriptors, as above.
"""

from __future__ import annotations

import io
import sys
import threading
from typing import Any, Dict, Optional, Tuple

from podium._src.context import actor_context
from podium._src.log_forward import Forwarder
from podium._src.proc_log import log as _plog

# Where this proc's lines go instead of the client's terminal (logging_option): its log file
# only (_diverted) or the controller's log sink too (_forward); never both.
_diverted = False
_forward: Optional[Forwarder] = None
_divert_lock = threading.Lock()
# The proc's own stdout and stderr, by fd (install()).
_bases: Dict[int, Any] = {}
# Lines went to fds 1 and 2 since the last forward_flush(): it waits for the pump (PL-5).
_wrote_fds = False


def divert(quiet: bool) -> Tuple[str, int]:
    """Lines written from now on go to the proc's log file only (``quiet``), or to the
    client's terminal again as well; streaming to the sink stops. Returns forward_mark() of
    the streaming that stopped (its last batch sent)."""
    global _diverted, _forward
    with _divert_lock:
        _diverted = bool(quiet)
        fwd, _forward = _forward, None
    return _close(fwd)


def forward(port: Any, log_id: str, proc: str, pid: int) -> Tuple[str, int]:
    """Lines written from now on go to the log sink at ``port``, as mesh ``log_id``; returns
    forward_mark() of the streaming this replaces, if any."""
    global _diverted, _forward
    with _divert_lock:
        fwd = _forward
        if fwd is not None and fwd.log_id == log_id and fwd.port_id == port._port_id:
            fwd.flush()
            return fwd.mark()
        _diverted = False
        _forward = Forwarder(port, log_id, proc, pid, _write_direct)
    return _close(fwd)


def _close(fwd: Optional[Forwarder]) -> Tuple[str, int]:
    if fwd is None:
        return "", 0
    fwd.close()
    return fwd.mark()


def forward_flush() -> Tuple[str, int]:
    """Sends the lines waiting to stream now, and lets the pump read what went to fds 1 and 2
    (PL-5); (this proc, the last batch sent), or ("", 0) when this proc does not stream."""
    global _wrote_fds
    if _wrote_fds:
        _wrote_fds = False
        _plog.settle()
    fwd = _forward
    if fwd is None:
        return "", 0
    fwd.flush()
    return fwd.mark()


def _write_direct(fd: int, text: str) -> None:
    """Writes a line that could not stream to the proc's own fd (it is in the log file
    already, PL-1; with fds 1 and 2 pumped to the file (PS-4) this failure case puts it there
    a second time, which beats losing it from the terminal)."""
    base = None if _diverted else _bases.get(fd)
    if base is None:
        return
    try:
        base.write(text)
        base.flush()
    except Exception:  # a closed stream while the proc leaves
        pass


def _note_fds() -> None:
    global _wrote_fds
    _wrote_fds = True


def _prefix() -> Optional[str]:
    ctx = actor_context()
    if ctx is None:
        return None
    inst = ctx.actor_instance
    rank = f" {inst.rank}" if len(inst.rank) else ""
    return f"[{inst.name}{rank}] "


class PrefixedStream(io.TextIOBase):
    """A text stream over ``base`` that prefixes each line written by an actor."""

    def __init__(self, base: Any, fd: int = 1) -> None:
        super().__init__()
        self._base = base
        self._fd = fd
        self._local = threading.local()
        self._lock = threading.Lock()  # one line at a time into `base`

    # What code asks of sys.stdout besides write(): the underlying stream's answers.
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._base.encoding

    @property
    def errors(self) -> Optional[str]:  # type: ignore[override]
        return self._base.errors

    @property
    def buffer(self) -> Any:
        return self._base.buffer

    def fileno(self) -> int:
        return self._base.fileno()

    def isatty(self) -> bool:
        return self._base.isatty()

    def writable(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:  # line_buffering, mode, name, reconfigure, ...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._base, name)

    def _pending(self) -> str:
        return getattr(self._local, "pending", "")

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        prefix = _prefix()
        pending = self._pending()
        fwd = _forward
        captured = _plog.captured  # fds 1 and 2 reach the log file through the pump (PL-1)
        if prefix is None and not pending and fwd is None:
            with self._lock:
                if _diverted or not captured:
                    _plog.write(text)  # PL-1
                if not _diverted:
                    _plog.switch_to(self._fd)  # PL-5
                    self._base.write(text)
                    if "\n" in text:
                        self._base.flush()
                        _note_fds()
            return len(text)
        data = pending + text
        lines = data.split("\n")
        self._local.pending = lines.pop()  # after the last newline ("" if it ended one)
        if lines:
            p = prefix or ""
            out = "".join(f"{p}{line}\n" for line in lines)
            if fwd is not None or _diverted or not captured:
                _plog.write(out)  # PL-1
            if fwd is not None:
                for line in lines:
                    fwd.add(self._fd, p, line)
                return len(text)
            if not _diverted:
                with self._lock:
                    _plog.switch_to(self._fd)  # PL-5
                    self._base.write(out)
                    self._base.flush()
                _note_fds()
        return len(text)

    def flush(self) -> None:
        pending = self._pending()
        fwd = _forward
        if pending:
            self._local.pending = ""
            if fwd is not None or _diverted or not _plog.captured:
                _plog.write(f"{_prefix() or ''}{pending}\n")  # PL-1
            if fwd is not None:
                fwd.add(self._fd, _prefix() or "", pending)
            elif not _diverted:
                with self._lock:
                    _plog.switch_to(self._fd)  # PL-5
                    self._base.write(f"{_prefix() or ''}{pending}\n")
        if fwd is not None:
            fwd.hurry()
            return
        if not _diverted:
            with self._lock:
                self._base.flush()
            _note_fds()


def install() -> None:
    """Replaces sys.stdout and sys.stderr of this proc with prefixing streams."""
    _plog.captured  # takes PODIUM_PROC_LOG_FD now: what the proc starts does not inherit it
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, PrefixedStream):
            continue
        try:
            stream.reconfigure(line_buffering=False, write_through=False)
        except (AttributeError, ValueError):
            pass
        _bases[fd] = stream
        setattr(sys, name, PrefixedStream(stream, fd))


def stop_streaming() -> None:
    """The proc's runtime has stopped: what still waits to stream is written to the proc's
    own streams, and so are later lines (interpreter finalization's)."""
    global _forward
    with _divert_lock:
        fwd, _forward = _forward, None
    if fwd is not None:
        fwd.abandon()
