"""Every numbered invariant (CH-14, ME-11, ...) is defined once and cited by a test:
tools/check_invariants.py decides, and its docstring says what counts as a definition.
This test needs no podium: it reads the source tree the test file sits in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "check_invariants.py"


def test_every_invariant_is_defined_once_and_cited_by_a_test():
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, f"{SCRIPT} exited {r.returncode}:\n{r.stdout}{r.stderr}"
    assert r.stdout.splitlines()[-1].startswith("invariants: "), r.stdout
