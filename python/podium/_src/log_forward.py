"""A proc's end of streamed output: its lines, in batches, to the controller's log sink.

When the proc's mesh streams to the client (``logging_option(stream_to_client=True)``),
output.py hands each complete line written through ``sys.stdout`` / ``sys.stderr`` to this
proc's Forwarder instead of writing it to the file descriptor. The forwarder's thread
(``podium-log-forward``) sends what gathered as one message to the sink's port (log_sink.py)
through the runtime: a burst waits up to ``LINGER_S`` for more lines, and a batch holds at
most ``MAX_BATCH_BYTES``, so a chatty actor sends a few messages a second, not one per line.

A flush of ``sys.stdout`` / ``sys.stderr`` (``print(..., flush=True)``, a logging handler)
makes the thread send without waiting (``hurry``), and the end of each endpoint call sends
what is pending before the call's answer (server.py), so a caller that got its answer finds
the call's lines on their way, and a proc that then dies hard loses none of them.

``flush()`` sends what is pending at once, on the calling thread, and returns the number of
the last batch sent: the controller then waits until the sink has filed that batch (LG-5),
which is how a mesh's stop, a change of logging_option and the controller's exit lose no
line. An actor's stop sends its lines before the stop is acknowledged (server.py). A batch the
runtime refuses (the proc is leaving) is written to the proc's own stdout / stderr instead,
with the prefix, so nothing is dropped without a trace.

  LG-6 A proc's batches carry consecutive numbers from 1, are sent in that order, and each
    line handed to add() is in exactly one batch, or written to the proc's own stream when
    its batch could not be sent.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, Callable, List, Tuple

LINGER_S = 0.02
MAX_BATCH_BYTES = 256 * 1024

_HOST = socket.gethostname()


class Forwarder:
    """Batches this proc's lines to the sink's ``port`` under the mesh's ``log_id``.
    ``fallback(fd, text)`` writes to the proc's own stream. Thread-safe."""

    def __init__(self, port: Any, log_id: str, proc: str, pid: int,
                 fallback: Callable[[int, str], None]) -> None:
        self._port, self._log_id, self._proc, self._pid = port, log_id, proc, pid
        self._fallback = fallback
        self._cv = threading.Condition(threading.Lock())  # guards _lines, _bytes, _closed
        self._lines: List[Tuple[int, str, str]] = []
        self._bytes = 0
        self._closed = False
        self._hurry = False  # an explicit flush(): send without waiting for more
        self._send_lock = threading.Lock()  # one batch at a time; guards _seq
        self._seq = 0  # the last batch sent
        self._thread = threading.Thread(target=self._main, name="podium-log-forward",
                                        daemon=True)
        self._thread.start()

    @property
    def log_id(self) -> str:
        return self._log_id

    @property
    def port_id(self) -> str:
        return self._port._port_id

    def add(self, fd: int, prefix: str, text: str) -> None:
        with self._cv:
            if self._closed:
                closed = True
            else:
                closed = False
                self._lines.append((fd, prefix, text))
                self._bytes += len(prefix) + len(text)
                if len(self._lines) == 1 or self._bytes >= MAX_BATCH_BYTES:
                    self._cv.notify()
        if closed:
            self._fallback(fd, f"{prefix}{text}\n")

    def _main(self) -> None:
        while True:
            with self._cv:
                while not self._lines and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                # A burst: let it gather, unless the batch is full already or the writer
                # flushed its stream.
                self._cv.wait_for(lambda: (self._bytes >= MAX_BATCH_BYTES or self._closed
                                           or self._hurry), LINGER_S)
                self._hurry = False
            self.flush()

    def hurry(self) -> None:
        """A writer flushed its stream: what is pending goes without waiting for more."""
        with self._cv:
            if self._lines and not self._hurry:
                self._hurry = True
                self._cv.notify()

    def flush(self) -> int:
        """Sends what is pending now; returns the number of the last batch sent."""
        with self._send_lock:
            with self._cv:
                batch, self._lines, self._bytes = self._lines, [], 0
            if batch:
                seq = self._seq + 1
                try:
                    self._port.send((self._log_id, self._proc, _HOST, self._pid, seq, batch))
                    self._seq = seq
                except Exception as e:  # the runtime is leaving: the proc's own streams
                    self._fallback(2, f"podium: proc {self._proc} could not stream "
                                      f"{len(batch)} lines to the client ({e}); here:\n")
                    for fd, prefix, text in batch:
                        self._fallback(fd, f"{prefix}{text}\n")
            return self._seq

    def close(self) -> int:
        """Stops the thread and sends what is pending; a line added later goes to the
        fallback. Returns the number of the last batch sent."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        return self.flush()

    def abandon(self) -> None:
        """The runtime is gone: stops the thread and writes what is pending to the
        fallback (no send); later lines go there too."""
        with self._cv:
            self._closed = True
            pending, self._lines, self._bytes = self._lines, [], 0
            self._cv.notify_all()
        for fd, prefix, text in pending:
            self._fallback(fd, f"{prefix}{text}\n")

    def mark(self) -> Tuple[str, int]:
        """(this proc, the last batch sent): what the controller waits for."""
        return self._proc, self._seq
