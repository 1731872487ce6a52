"""Shared helpers of podium's Python tests. Tests run against the installed package
(`make setup` installs it), never against python/ of the source tree."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Bound on every child process a test starts (pytest-timeout bounds the test as a whole).
CHILD_TIMEOUT_S = 60


@pytest.fixture
def run_podium():
    """Runs `python -m podium ARGS...` in a child process; returns the CompletedProcess."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "podium", *args],
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )

    return run
