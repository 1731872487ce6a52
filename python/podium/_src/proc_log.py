"""Per-proc log files: every line a proc writes (through ``sys.stdout`` / ``sys.stderr``, its
actors' prints, Python ``logging``, podium's own reports, and straight to fds 1 and 2: C code,
subprocesses, a fault handler's backtrace) goes to a file of its own on its host,
``<log dir>/proc-<pid>.log`` (the log dir is ``$PODIUM_LOG_DIR`` or
``<tmp>/podium-logs-<uid>``), whatever ``logging_option`` says about the terminal;
``podium logs`` and ``ProcMesh.logs()`` read it back through the running job.

The file is written from outside the proc (PS-4, cpp/podium/host/output_pump.h): the proc's
fds 1 and 2 are pipes whose read ends its spawner (the controller, or the host's worker)
holds, and a pump there appends their lines to the file, then passes them on to where they
went before (the terminal, the controller). A kernel pipe keeps what was written when the
writer dies, so a proc killed by SIGKILL, a segfault or ``os._exit`` right after a write
loses none of its last lines. Lines that do not go to fds 1 and 2 (kept off the terminal by
``logging_option(stream_to_client=False)``, or streamed to the client) are written by this
module to a third pipe, the proc's ``$PODIUM_PROC_LOG_FD``, which the pump writes to the file
only: each line lands in the file once. A proc started without that fd (none of podium's)
writes its file itself, as before.

The file is capped: past ``$PODIUM_PROC_LOG_MAX_BYTES`` (default 64 MiB) it is renamed
``proc-<pid>.log.1`` (replacing the one before) and a new one starts, so a proc keeps at most
about twice the cap.

  PL-1 Every complete line written through a proc's sys.stdout or sys.stderr, with its actor
    prefix, reaches the proc's log file exactly once: with the terminal (or a diverted file),
    or while it streams to the client.
  PL-2 A proc's log file never grows past the cap: at the cap it becomes ``.log.1`` (the
    older ``.1`` goes) and a new file starts; reading the tail reads ``.1`` first when the
    current file has fewer lines than asked.
  PL-4 What a proc writes straight to fds 1 and 2 (``os.write``, C code, a subprocess it
    starts) is in its log file too, and so are the last lines of a proc that dies right
    after writing them (SIGKILL, a segfault, ``os._exit``): the file outlives the proc and
    is read back through its host.
  PL-5 A read of a live proc's log file sees every line the proc wrote before the read
    began: the reader waits until the proc's pipes are empty (FIONREAD), then reads under a
    shared flock, which the pump holds exclusively from a pipe read to its file write. Lines
    the proc writes through sys.stdout, sys.stderr and the log-only pipe keep their order in
    the file: before it writes to another of the three, a proc waits (bounded) until the one
    it used last is drained; and an endpoint call that printed to fds 1 and 2 answers once
    the pump has read those lines, so they reach the terminal ahead of the answer.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import struct
import tempfile
import termios
import threading
import time
from typing import Dict, List, Optional, Tuple

DEFAULT_MAX_BYTES = 64 << 20
_HOST = socket.gethostname()


def log_dir() -> str:
    return os.environ.get("PODIUM_LOG_DIR") or os.path.join(
        tempfile.gettempdir(), f"podium-logs-{os.getuid()}")


def path(pid: Optional[int] = None) -> str:
    return os.path.join(log_dir(), f"proc-{os.getpid() if pid is None else pid}.log")


LOG_STREAM = 0  # the log-only pipe, beside fds 1 and 2
DRAIN_WAIT_S = 1.0  # how long a switch of stream waits for the one before to drain (PL-5)


def _pending(fd: int) -> int:
    """Bytes waiting in the pipe ``fd`` (either end) for its reader."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def wait_drained(fds: List[int], timeout: float) -> bool:
    """Waits (bounded) until the pipes ``fds`` hold nothing for their reader: the pump outside
    the proc has read all of it (PL-5). True when they did within ``timeout``."""
    fds = [fd for fd in fds if _is_pipe(fd)]
    deadline = time.monotonic() + timeout
    pause = 0.0002
    while any(_pending(fd) for fd in fds):
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
    return True


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
        self._captured = False  # fds 1, 2 and self._fd are pipes a pump outside reads
        self._last: Optional[int] = None  # the stream written last (PL-5)
        self._pipes: Dict[int, int] = {}  # stream -> fd, those that are pipes

    def _open(self) -> bool:
        if self._fd >= 0 and self._pid == os.getpid():
            return True
        if self._failed is not None and self._pid == os.getpid():
            return False
        self._pid = os.getpid()  # a fork (the zygote's children) opens a file of its own
        self._fd, self._failed = -1, None
        self._captured = False
        given = os.environ.pop("PODIUM_PROC_LOG_FD", "")  # its children do not inherit it
        if given.isdigit() and _is_pipe(int(given)):
            self._fd = int(given)
            os.set_inheritable(self._fd, False)
            self._captured = True
            self._pipes = {s: fd for s, fd in ((1, 1), (2, 2), (LOG_STREAM, self._fd))
                           if _is_pipe(fd)}
            return True
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

    @property
    def captured(self) -> bool:
        """Whether a pump outside this proc writes its log file from its fds 1 and 2 (PS-4);
        then only lines that do not go to those fds are written here."""
        with self._lock:
            self._open()
            return self._captured

    def switch_to(self, stream: int) -> None:
        """About to write to ``stream`` (1, 2 or LOG_STREAM): when the stream written last
        was another pipe, waits (bounded) until the pump has drained it (PL-5)."""
        last, self._last = self._last, stream
        if last is None or last == stream or not self._captured:
            return
        fd = self._pipes.get(last)
        if fd is not None and _pending(fd):
            wait_drained([fd], DRAIN_WAIT_S)

    def drain(self, timeout: float = 5.0) -> bool:
        """Waits (bounded) until the pump has read everything this proc wrote to its pipes."""
        with self._lock:
            self._open()
            fds = list(self._pipes.values()) if self._captured else []
        return wait_drained(fds, timeout)

    def settle(self, timeout: float = DRAIN_WAIT_S) -> None:
        """Waits (bounded) until the pump has read what this proc wrote to fds 1 and 2, so
        that it is on its way to the terminal before the call's answer (PL-5)."""
        if self._captured:
            wait_drained([fd for s, fd in self._pipes.items() if s != LOG_STREAM], timeout)

    def write(self, text: str) -> None:
        if not text:
            return
        data = text.encode("utf-8", "replace")
        with self._lock:
            if not self._open():
                return
            if self._captured:
                self.switch_to(LOG_STREAM)
                view = memoryview(data)
                try:
                    while view:
                        view = view[os.write(self._fd, view):]
                except OSError:
                    pass
                return
            if self._size and self._size + len(data) > self._max:
                self._rotate()
            try:
                os.write(self._fd, data)
                self._size += len(data)
            except OSError:
                pass

    def _rotate(self) -> None:  # only when this proc writes its file itself
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
            return self._path if not self._captured else path()


log = ProcLog()


class _ReadLock:
    """A shared flock on the current ``file`` while it is read: a pump writing it holds the
    lock exclusively from the pipe read to the file write (PL-5, OP-3). A file rotated while
    we waited is locked again under its name."""

    def __init__(self, file: str) -> None:
        self._file = file
        self._fd = -1

    def __enter__(self) -> "_ReadLock":
        for _ in range(100):
            try:
                fd = os.open(self._file, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return self
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.stat(self._file).st_ino == os.fstat(fd).st_ino
            except OSError:
                same = False
            if same:
                self._fd = fd
                return self
            os.close(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # drops the lock


def tail(file: str, n: int) -> List[str]:
    """The last ``n`` lines of ``file`` and, when it has fewer, of ``file.1`` before them."""
    with _ReadLock(file):
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
        with _ReadLock(file), open(file, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < offset:
                offset = 0
            f.seek(offset)
            data = f.read(min(size - offset, 4 << 20))
    except FileNotFoundError:
        return offset, []
    cut = data.rfind(b"\n") + 1
    return offset + cut, data[:cut].decode("utf-8", "replace").splitlines()
