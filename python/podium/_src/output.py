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
terminal (``divert``); ``stream_to_client=True`` sends it back.
"""

from __future__ import annotations

import io
import sys
import threading
from typing import Any, Optional

from podium._src.context import actor_context

# Where this proc's lines go instead of the client's terminal (logging_option), or None.
_diverted: Optional[Any] = None
_divert_lock = threading.Lock()


def divert(path: Optional[str]) -> None:
    """Lines written from now on go to the file ``path`` (appended), or, with None, to the
    client's terminal again."""
    global _diverted
    with _divert_lock:
        old, _diverted = _diverted, (open(path, "a", encoding="utf-8", buffering=1)
                                     if path is not None else None)
    if old is not None:  # left open: a writer may still hold it (one file per switch)
        old.flush()


def _prefix() -> Optional[str]:
    ctx = actor_context()
    if ctx is None:
        return None
    inst = ctx.actor_instance
    rank = f" {inst.rank}" if len(inst.rank) else ""
    return f"[{inst.name}{rank}] "


class PrefixedStream(io.TextIOBase):
    """A text stream over ``base`` that prefixes each line written by an actor."""

    def __init__(self, base: Any) -> None:
        super().__init__()
        self._base = base
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
        if prefix is None and not pending:
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
            out = "".join(f"{p}{line}\n" for line in lines)
            with self._lock:
                base = _diverted or self._base
                base.write(out)
                base.flush()
        return len(text)

    def flush(self) -> None:
        pending = self._pending()
        if pending:
            self._local.pending = ""
            with self._lock:
                (_diverted or self._base).write(f"{_prefix() or ''}{pending}\n")
        with self._lock:
            (_diverted or self._base).flush()


def install() -> None:
    """Replaces sys.stdout and sys.stderr of this proc with prefixing streams."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, PrefixedStream):
            continue
        try:
            stream.reconfigure(line_buffering=False, write_through=False)
        except (AttributeError, ValueError):
            pass
        setattr(sys, name, PrefixedStream(stream))
