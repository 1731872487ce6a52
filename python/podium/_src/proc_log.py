"""Per-proc log files: every line a proc writes through ``sys.stdout`` / ``sys.stderr`` (its
actors' prints, Python ``logging``, podium's own reports) also goes to a file of its own on its
host, ``<log dir>/proc-<pid>.log`` (the log dir is ``$PODIUM_LOG_DIR`` or
``<tmp>/podium-logs-<uid>``), whatever ``logging_option`` says about the terminal;
``podium logs`` and ``ProcMesh.logs()`` read it back through the running job.

Each write is one ``write(2)`` on a file opened with O_APPEND, on the writing thread, under a
lock: nothing waits in a buffer, so nothing is lost when the proc stops or exits, and no timer
or thread of its own is needed. The file is capped: past ``$PODIUM_PROC_LOG_MAX_BYTES``
(default 64 MiB) it is renamed ``proc-<pid>.log.1`` (replacing the one before) and a new one
starts, so a proc keeps at most about twice the cap.

  PL-1 Every complete line written through a proc's sys.stdout or sys.stderr, with its actor
    prefix, is appended to the proc's log file by the write that completes it, before the
    write returns: with the terminal (or a diverted file), or while it streams to the client.
  PL-2 A proc's log file never grows past the cap: at the cap it becomes ``.log.1`` (the
    older ``.1`` goes) and a new file starts; reading the tail reads ``.1`` first when the
    current file has fewer lines than asked.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from typing import List, Optional, Tuple

DEFAULT_MAX_BYTES = 64 << 20
_HOST = socket.gethostname()


def log_dir() -> str:
    return os.environ.get("PODIUM_LOG_DIR") or os.path.join(
        tempfile.gettempdir(), f"podium-logs-{os.getuid()}")


def path() -> str:
    return os.path.join(log_dir(), f"proc-{os.getpid()}.log")


def _max_bytes() -> int:
    try:
        return max(1024, int(os.environ.get("PODIUM_PROC_LOG_MAX_BYTES") or DEFAULT_MAX_BYTES))
    except ValueError:
        return DEFAULT_MAX_BYTES


class ProcLog:
    """This proc's log file (PL-1, PL-2). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd = -1
        self._size = 0
        self._path = ""
        self._max = _max_bytes()
        self._failed: Optional[str] = None
        self._pid = -1

    def _open(self) -> bool:
        if self._fd >= 0 and self._pid == os.getpid():
            return True
        if self._failed is not None and self._pid == os.getpid():
            return False
        self._pid = os.getpid()  # a fork (the zygote's children) opens a file of its own
        self._fd, self._failed = -1, None
        try:
            os.makedirs(log_dir(), mode=0o700, exist_ok=True)
            self._path = path()
            self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                               0o600)
            self._size = os.fstat(self._fd).st_size
            return True
        except OSError as e:  # said once, on the proc's own stderr; the terminal still works
            self._failed = f"{type(e).__name__}: {e}"
            try:
                os.write(2, f"podium: proc {os.getpid()} on {_HOST}: cannot write its log file "
                            f"in {log_dir()}: {self._failed}\n".encode())
            except OSError:
                pass
            return False

    def write(self, text: str) -> None:
        if not text:
            return
        data = text.encode("utf-8", "replace")
        with self._lock:
            if not self._open():
                return
            if self._size and self._size + len(data) > self._max:
                self._rotate()
            try:
                os.write(self._fd, data)
                self._size += len(data)
            except OSError:
                pass

    def _rotate(self) -> None:
        try:
            os.replace(self._path, self._path + ".1")
        except OSError:
            pass
        os.close(self._fd)
        self._fd = -1
        self._failed = None
        self._open()

    def current_path(self) -> str:
        with self._lock:
            self._open()
            return self._path


log = ProcLog()


def tail(file: str, n: int) -> List[str]:
    """The last ``n`` lines of ``file`` and, when it has fewer, of ``file.1`` before them."""
    lines = _last_lines(file, n)
    if len(lines) < n:
        lines = _last_lines(file + ".1", n - len(lines)) + lines
    return lines


def _last_lines(file: str, n: int) -> List[str]:
    if n <= 0:
        return []
    try:
        with open(file, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            block, data = 65536, b""
            pos = end
            while pos > 0 and data.count(b"\n") <= n:
                step = min(block, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    except FileNotFoundError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-n:]


def read_from(file: str, offset: int) -> Tuple[int, List[str]]:
    """The complete lines of ``file`` from byte ``offset`` on, and the offset after them; a
    file that shrank (rotated) is read from its start."""
    try:
        with open(file, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < offset:
                offset = 0
            f.seek(offset)
            data = f.read(min(size - offset, 4 << 20))
    except FileNotFoundError:
        return offset, []
    cut = data.rfind(b"\n") + 1
    return offset + cut, data[:cut].decode("utf-8", "replace").splitlines()
