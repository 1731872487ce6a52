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
    """A text stream as it was, whose writes mark fd ``fd`` open or closed in the gate."""

    def __init__(self, inner: Any, fd: int) -> None:
        self._inner = inner
        self._fd = fd
        self._open = False  # the last write did not end a line (or failed)
        # held here: module globals may be gone when the interpreter's last lines are written
        self._mark, self._write_lines = _host.stdio_mark, _host.stdio_write_lines

    def write(self, s: str) -> int:
        if not s:
            return self._inner.write(s)
        if not self._open:
            self._open = True
            self._mark(self._fd, True)  # before the first byte can reach the fd
        n = self._inner.write(s)
        if s.endswith("\n"):
            self._inner.flush()
            self._open = False
            self._mark(self._fd, False)  # the lines held meanwhile follow this one
        return n

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def emit(self, text: str) -> None:
        """Whole lines of a proc's (the log sink's): at a line's start of this stream."""
        self._write_lines(self._fd, text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, buffer, ...
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


def guards() -> List[LineGuard]:
    return [s for s in (sys.stdout, sys.stderr) if isinstance(s, LineGuard)]
