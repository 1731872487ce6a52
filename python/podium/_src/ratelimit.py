"""Warnings podium prints that can repeat (once per call, per failed actor, per message).

``warn(kind, text)`` writes ``text`` to stderr (never stdout: stdout is the program's) unless a
warning of the same ``kind`` was written less than ``INTERVAL_S`` seconds ago; then it only
counts it. The next warning of that kind written says how many were left out, and so does the
process's exit (atexit) for counts still pending. A mesh of a thousand actors that all fail,
or an endpoint that fails on every call, prints one report and a count per interval instead
of a flood (issue 16).

Per process: each proc limits its own warnings. Thread-safe.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from typing import Dict, List

# Seconds between two warnings of one kind; PODIUM_WARN_INTERVAL_S overrides (0: no limit).
INTERVAL_S = float(os.environ.get("PODIUM_WARN_INTERVAL_S", "10"))

_lock = threading.Lock()
_kinds: Dict[str, List[float]] = {}  # kind -> [time of the last one written, left out since]


def warn(kind: str, text: str) -> None:
    """Writes ``podium: <text>`` to stderr, at most once per ``INTERVAL_S`` per ``kind``."""
    now = time.monotonic()
    with _lock:
        seen = _kinds.get(kind)
        if seen is not None and now - seen[0] < INTERVAL_S:
            seen[1] += 1
            return
        left_out = int(seen[1]) if seen is not None else 0
        _kinds[kind] = [now, 0]
    if left_out:
        text += f"\n{_left_out_line(kind, left_out)}"
    _write(f"podium: {text}")


def _left_out_line(kind: str, n: int) -> str:
    s = "" if n == 1 else "s"
    return (f"podium: {n} more warning{s} of this kind ({kind}) left out "
            f"(at most one per {INTERVAL_S:g} s)")


def _write(text: str) -> None:
    try:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # stderr closed or gone: nowhere to say it
        pass


@atexit.register
def _flush_counts() -> None:
    """Says how many warnings were left out since the last one of each kind."""
    with _lock:
        pending = [(k, int(v[1])) for k, v in _kinds.items() if v[1]]
        for k, _ in pending:
            _kinds[k][1] = 0
    for kind, n in pending:
        _write(_left_out_line(kind, n))
