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

``ProcMesh.logging_option(stream_to_client=False)`` (logs.py) sends what this proc writes
through ``sys.stdout``/``sys.stderr`` to a file of the proc's own instead of the client's
terminal (``divert``); ``stream_to_client=True`` sends each line, split into its prefix and
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

# Where this proc's lines go instead of the client's terminal (logging_option), or None:
# a file (_diverted) or the controller's log sink (_forward); never both.
_diverted: Optional[Any] = None
_forward: Optional[Forwarder] = None
_divert_lock = threading.Lock()
# The proc's own stdout and stderr, by fd (install()).
_bases: Dict[int, Any] = {}


def divert(path: Optional[str]) -> Tuple[str, int]:
    """Lines written from now on go to the file ``path`` (appended), or, with None, to the
    client's terminal again; streaming to the sink stops. Returns forward_mark() of the
    streaming that stopped (its last batch sent)."""
    global _diverted, _forward
    with _divert_lock:
        old, _diverted = _diverted, (open(path, "a", encoding="utf-8", buffering=1)
                                     if path is not None else None)
        fwd, _forward = _forward, None
    if old is not None:  # left open: a writer may still hold it (one file per switch)
        old.flush()
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
        old, _diverted = _diverted, None
        _forward = Forwarder(port, log_id, proc, pid, _write_direct)
    if old is not None:
        old.flush()
    return _close(fwd)


def _close(fwd: Optional[Forwarder]) -> Tuple[str, int]:
    if fwd is None:
        return "", 0
    fwd.close()
    return fwd.mark()


def forward_flush() -> Tuple[str, int]:
    """Sends the lines waiting to stream now; (this proc, the last batch sent), or ("", 0)
    when this proc does not stream."""
    fwd = _forward
    if fwd is None:
        return "", 0
    fwd.flush()
    return fwd.mark()


def _write_direct(fd: int, text: str) -> None:
    """Writes to where a line goes when it does not stream: the file, or the proc's own fd."""
    base = _diverted or _bases.get(fd)
    if base is None:
        return
    try:
        base.write(text)
        base.flush()
    except Exception:  # a closed stream while the proc leaves
        pass


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
        if prefix is None and not pending and fwd is None:
            with self._lock:
                base = _diverted or self._base
                base.write(text)
                if "\n" in text:
                    base.flush()
            return len(text)
        data = pending + text
        lines = data.split("\n")
        self._local.pending = lines.pop()  # after the last newline ("" if it ended one)
        if lines:
            p = prefix or ""
            if fwd is not None:
                for line in lines:
                    fwd.add(self._fd, p, line)
                return len(text)
            out = "".join(f"{p}{line}\n" for line in lines)
            with self._lock:
                base = _diverted or self._base
                base.write(out)
                base.flush()
        return len(text)

    def flush(self) -> None:
        pending = self._pending()
        fwd = _forward
        if pending:
            self._local.pending = ""
            if fwd is not None:
                fwd.add(self._fd, _prefix() or "", pending)
            else:
                with self._lock:
                    (_diverted or self._base).write(f"{_prefix() or ''}{pending}\n")
        if fwd is not None:
            fwd.hurry()
            return
        with self._lock:
            (_diverted or self._base).flush()


def install() -> None:
    """Replaces sys.stdout and sys.stderr of this proc with prefixing streams."""
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
