"""What procs write never lands inside a line the controller is writing.

A controller's procs write to its terminal: their output pumps pass whole lines on to the
controller's fds 1 and 2 (C++, ``ProcSpawner::emit``), and the log sink prints streamed lines
from its own thread (log_sink.py). ``print("results", xs)`` reaches the fd as several writes
when stdout is unbuffered (``PYTHONUNBUFFERED``, ``python -u``), and block-buffered output
reaches it in chunks that end anywhere: a proc line written between them split the
controller's line in two.

So the runtime wraps the controller's own ``sys.stdout`` and ``sys.stderr`` (the process's
streams; a capture that replaced them, a notebook's or a test's, is left alone) in a
``LineGuard`` when it starts. Before a write it marks the fd open in the C++ gate
(``cpp/podium/host/stdio_gate.h``); after a write that ends a line it flushes the stream and
marks the fd closed. While the fd is open the gate holds the procs' lines, and writes them
after the line that closes it, or once the line has been open for the gate's hold (0.5 s: a
prompt or a progress bar without a newline does not hold proc output back longer). The log
sink writes its lines through ``emit()``, into the same gate. A side effect: the controller's
stdout is written line by line, as on a terminal, while procs run.

  LG-8 (with SG-1, SG-2) A line the controller writes through its sys.stdout or sys.stderr,
    in as many pieces as it likes, is never split by a proc's line, pumped or streamed,
    unless it stays open for the gate's hold.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, List

from podium._core import host as _host


class LineGuard:
    """A text stream as it was, whose writes reach fd ``fd`` at line boundaries as the gate
    knows them.

    Unbuffered or line-buffered (``write_through``, ``line_buffering``: a terminal,
    ``python -u``): each piece goes out as it comes, the fd marked open before it, and a piece
    that ends a line is flushed and marks the fd closed. Block-buffered (a pipe or a file):
    the guard buffers itself and hands the stream whole lines only, at most ``_CHUNK``
    characters at a time and flushed, so the fd never ends inside a line but after an
    explicit ``flush()`` of a partial one (marked open until a later line ends it)."""

    _CHUNK = 8192  # what io.TextIOWrapper gathers before it writes

    def __init__(self, inner: Any, fd: int) -> None:
        self._inner = inner
        self._fd = fd
        self._open = False  # the fd may end inside a line of ours
        self._pending: List[str] = []  # block-buffered: text not yet handed to the stream
        # (never replaced, only cut from its front under the lock)
        self._pending_len = 0
        self._lock = threading.RLock()  # a signal handler may print inside a write
        self._block = self._buffered()  # looked at again at each hand-over and flush
        # held here: module globals may be gone when the interpreter's last lines are written
        self._mark, self._write_lines = _host.stdio_mark, _host.stdio_write_lines

    def _buffered(self) -> bool:
        inner = self._inner
        return not (getattr(inner, "line_buffering", True) or getattr(inner, "write_through", True))

    def write(self, s: str) -> int:
        if type(s) is not str:
            if not isinstance(s, str):
                return self._inner.write(s)  # the stream's own TypeError
            s = str(s)
        if self._block:
            # No lock for an append (the list is never replaced: an append racing a hand-over
            # lands behind what it takes); the count only says when to hand over.
            self._pending.append(s)
            self._pending_len += len(s)
            if self._pending_len >= self._CHUNK and "\n" in s:
                with self._lock:
                    self._out(self._take_lines())
                    self._block = self._buffered()  # a reconfigure() since
            return len(s)
        # Unbuffered: no lock (threads printing at once interleave their pieces anyway).
        self._out(s)
        return len(s)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with self._lock:
            self._out(self._take())
            self._inner.flush()
            self._block = self._buffered()

    def close(self) -> None:
        self.flush()
        self._inner.close()

    def emit(self, text: str) -> None:
        """Whole lines of a proc's (the log sink's): after the whole lines the controller
        wrote before them, at a line's start (the gate holds them while a line is open)."""
        if self._pending:  # block-buffered: behind the whole lines before them
            with self._lock:
                self._out(self._take_lines())
        self._write_lines(self._fd, text)  # the gate orders them against our marks

    def _take(self) -> str:
        """All the pending text (the lock is held)."""
        p = self._pending
        n = len(p)
        if n == 0:
            return ""
        text = "".join(p[:n])
        del p[:n]  # one step: what another thread appended meanwhile stays
        self._pending_len = 0
        return text

    def _take_lines(self) -> str:
        """The pending text up to its last newline; the partial line after it stays pending,
        ahead of anything appended since (the lock is held)."""
        text = self._take()
        cut = text.rfind("\n") + 1
        if cut < len(text):
            rest = text[cut:]
            self._pending.insert(0, rest)
            self._pending_len = len(rest)
        return text[:cut]

    def _out(self, text: str) -> None:
        """Writes ``text`` through, the fd marked open before it; a write that ends a line is
        flushed and marks the fd closed, and the lines the gate held meanwhile follow it."""
        if not text:
            return
        if not self._open:
            self._open = True
            self._mark(self._fd, True)  # before the first byte can reach the fd
        self._inner.write(text)
        if text[-1] == "\n":
            self._inner.flush()
            self._open = False
            self._mark(self._fd, False)

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer, ...
        return getattr(self._inner, name)


_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Wraps this process's own stdout and stderr, once (the controller's runtime starts)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        _installed = True
        if sys.stdout is not None and sys.stdout is sys.__stdout__ and _fd_of(sys.stdout) == 1:
            sys.stdout = LineGuard(sys.stdout, 1)
        if sys.stderr is not None and sys.stderr is sys.__stderr__ and _fd_of(sys.stderr) == 2:
            sys.stderr = LineGuard(sys.stderr, 2)


def _fd_of(stream: Any) -> int:
    try:
        return int(stream.fileno())
    except Exception:  # no file descriptor: nothing shares it with the procs
        return -1

