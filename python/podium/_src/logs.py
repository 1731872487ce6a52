"""``ProcMesh.logging_option``: how a proc mesh's processes log, as Monarch's.

``level`` sets the root logger's level in every proc of the mesh (and gives the root logger a
handler to the proc's stderr when it has none, so that records below WARNING show at all).
``stream_to_client=True`` sends what the procs write (print, logging to stderr) to the
client's terminal, prefixed by actor and rank (output.py): podium's default. ``False`` sends
it to a file per proc instead, ``<log dir>/proc-<pid>.log``, where the log dir is
``$PODIUM_LOG_DIR`` or ``<tmp>/podium-logs-<uid>``. ``aggregate_window_sec`` (Monarch folds
similar lines of several ranks into one within that window) is checked as Monarch checks it
(ValueError without ``stream_to_client``) but does not aggregate yet: each line is shown as
written.

  LG-3 logging_option(level=L, stream_to_client=S) applies to every proc of the mesh before
    its Future resolves: their root loggers have level L, and their output goes to the client
    when S, to their own log file otherwise.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from typing import Any, Optional

from podium._src import output
from podium._src.endpoint import Actor, endpoint
from podium._src.future import CoroFuture, Future

_logger = logging.getLogger("podium")
_count = 0
_count_lock = threading.Lock()
_handler: Optional[logging.Handler] = None


def log_dir() -> str:
    """Where procs write their output when they do not stream it to the client."""
    return os.environ.get("PODIUM_LOG_DIR") or os.path.join(
        tempfile.gettempdir(), f"podium-logs-{os.getuid()}")


class _LogControl(Actor):
    """Applies the options in its proc."""

    @endpoint
    def set_option(self, stream_to_client: bool, level: int) -> Optional[str]:
        global _handler
        root = logging.getLogger()
        root.setLevel(level)
        if not root.handlers and _handler is None:
            _handler = logging.StreamHandler()  # sys.stderr when it writes: the prefixing one
            root.addHandler(_handler)
        if _handler is not None:  # ours: it shows records from `level` up, whatever logger
            _handler.setLevel(level)
        if stream_to_client:
            output.divert(None)
            return None
        folder = log_dir()
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, f"proc-{os.getpid()}.log")
        sys.stdout.flush()
        sys.stderr.flush()
        output.divert(path)
        return path


def logging_option(procs: Any, stream_to_client: bool = False,
                   aggregate_window_sec: Optional[int] = None,
                   level: int = logging.INFO) -> "Future[None]":
    """See the module docstring; ``procs`` is the ProcMesh. Returns a Future (await it or
    ``.get()``) that resolves once every proc applied the options."""
    global _count
    if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= 255:
        raise ValueError(f"Invalid logging level: {level!r}")
    if aggregate_window_sec is not None:
        if not stream_to_client:
            raise ValueError("logging_option: aggregate_window_sec needs stream_to_client=True")
        if not isinstance(aggregate_window_sec, (int, float)) or aggregate_window_sec < 0:
            raise ValueError(f"logging_option: aggregate_window_sec must be a number of "
                             f"seconds >= 0, not {aggregate_window_sec!r}")
        _logger.info("logging_option(aggregate_window_sec=%s): podium does not aggregate "
                     "similar lines yet; each line is shown as written", aggregate_window_sec)
    with _count_lock:
        _count += 1
        name = f"podium-logging-{os.getpid()}-{_count}"
    control = procs.spawn(name, _LogControl)

    async def apply() -> None:
        try:
            await control.set_option.call(bool(stream_to_client), level)
        finally:
            await control.stop()

    return CoroFuture(apply())
