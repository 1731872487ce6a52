"""`podium bench python`: one run prints one JSON object with podium's figures, the socketpair
floor and, for Monarch and Ray, either their figures or why they were not measured. The test
checks the shape of the report and that every figure is positive, never how fast it is."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

PODIUM_FIELDS = {
    "call_one_rtt_us",
    "call_one_rtt_p99_us",
    "pipelined_calls_per_s",
    "call_8_us",
    "call_8_p99_us",
    "spawn_8_first_reply_s",
    "spawn_32_first_reply_s",
    "call_one_vs_floor",
}


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def test_bench_python_json_report():
    r = subprocess.run(
        [sys.executable, "-m", "podium", "bench", "python", "--json", "--iters", "200"],
        env=os.environ.copy(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert r.returncode == 0, r.stderr
    (line,) = [l for l in r.stdout.splitlines() if l.strip()]  # one JSON object, nothing else
    report = json.loads(line)
    assert report["benchmark"] == "python"
    assert report["iters"] == 200
    floor = report["floor"]
    assert _positive(floor["socketpair_pickle_rtt_us"])
    assert floor["socketpair_pickle_rtt_p99_us"] >= floor["socketpair_pickle_rtt_us"]

    podium = report["podium"]
    assert set(podium) == PODIUM_FIELDS
    for key, value in podium.items():
        assert _positive(value), (key, value)
    assert podium["call_one_rtt_p99_us"] >= podium["call_one_rtt_us"]
    assert report["ratios"]["podium_call_one_vs_floor"] == podium["call_one_vs_floor"]
    assert set(report["targets_met"]) >= {
        "call_one_le_3x_floor", "pipelined_ge_50k_per_s", "spawn_8_le_1s", "spawn_32_le_3s"
    }

    for other in ("monarch", "ray"):
        if report[other] is None:  # not importable here, or failed: the report says why
            reason = report.get(f"{other}_unavailable") or report.get(f"{other}_error")
            assert isinstance(reason, str) and reason
        else:
            assert set(report[other]) == PODIUM_FIELDS
            assert _positive(report[other]["call_one_rtt_us"])
            assert f"podium_call_one_vs_{other}" in report["ratios"]


def test_bench_python_rejects_bad_iters():
    r = subprocess.run(
        [sys.executable, "-m", "podium", "bench", "python", "--iters", "0"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert "--iters must be >= 1" in r.stderr
