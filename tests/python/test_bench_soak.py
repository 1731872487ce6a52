"""`podium bench soak`: one run prints one JSON object with, per phase (this host, an attached
worker), the controller's and the worker's growth per cycle and their fd and thread counts.
The test checks the report's shape only, never the figures (a benchmark, not a test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

GROWTH = {"rss_bytes_per_cycle", "rss_before", "rss_after",
          "fds_before", "fds_after", "threads_before", "threads_after"}


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def test_bench_soak_json_report():
    r = subprocess.run(
        [sys.executable, "-m", "podium", "bench", "soak", "--cycles", "20", "--warmup", "2",
         "--settle", "0", "--json"],
        env=os.environ.copy(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=100)
    assert r.returncode == 0, r.stderr
    (line,) = [l for l in r.stdout.splitlines() if l.strip()]  # one JSON object, nothing else
    report = json.loads(line)
    assert report["benchmark"] == "soak"
    assert report["cycles"] == 20 and report["procs"] == 1
    assert "soak: this host 20/20" in r.stderr  # progress goes to stderr
    assert set(report["phases"]) == {"local", "worker"}
    for phase in report["phases"].values():
        assert _number(phase["ms_per_cycle"]) and phase["ms_per_cycle"] > 0
        assert set(phase) == {"ms_per_cycle", "controller", "worker"}
        controller, worker = phase["controller"], phase["worker"]
        assert set(controller) == GROWTH | {"heap_bytes_per_cycle", "heap_before", "heap_after"}
        assert set(worker) == GROWTH
        for figures in (controller, worker):
            assert all(_number(v) for v in figures.values()), figures
            assert figures["fds_before"] > 0 and figures["threads_before"] > 0
