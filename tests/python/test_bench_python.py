"""`podium bench python`: one run prints one JSON object with podium's figures (medians of
alternating rounds, each round listed), the two socketpair floors (blocking and busy-polling)
and, for Monarch and Ray, either their figures or why they were not measured. The test checks
the shape of the report, that every figure is positive and that the medians and targets are
computed from the rounds it lists, never how fast anything is."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

PEER_FIELDS = {
    "call_one_rtt_us",
    "call_one_rtt_p99_us",
    "pipelined_calls_per_s",
    "call_8_us",
    "call_8_p99_us",
    "spawn_8_first_reply_s",
    "spawn_32_first_reply_s",
}
PODIUM_FIELDS = PEER_FIELDS | {
    "call_8_procs_cpu_us",
    "call_8_cpu_bound_us",
    "call_8_vs_call_one_cpu_bound",
    "call_one_vs_floor",
    "call_one_vs_busy_floor",
    "call_8_vs_call_one",
    "pipelined_calls_per_s_min",
}


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def test_bench_python_json_report():
    r = subprocess.run(
        [sys.executable, "-m", "podium", "bench", "python", "--json", "--iters", "200",
         "--rounds", "3"],
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
    assert report["rounds"] == 3
    floor = report["floor"]
    for kind in ("socketpair_pickle_rtt", "socketpair_pickle_busy_rtt"):
        assert _positive(floor[f"{kind}_us"])
        assert floor[f"{kind}_p99_us"] >= floor[f"{kind}_us"]

    podium = report["podium"]
    assert set(podium) == PODIUM_FIELDS
    for key, value in podium.items():
        assert _positive(value), (key, value)
    assert podium["call_one_rtt_p99_us"] >= podium["call_one_rtt_us"]
    rounds = report["podium_rounds"]
    assert len(rounds) == 3
    # The reported figures are the medians of the listed rounds; the pipelined target's
    # figure is their minimum.
    for key in ("call_one_rtt_us", "call_8_us"):
        assert podium[key] == sorted(r[key] for r in rounds)[1], key
        lo, hi = report["podium_spread"][key]
        assert lo == min(r[key] for r in rounds) and hi == max(r[key] for r in rounds)
    assert podium["call_8_cpu_bound_us"] <= podium["call_8_procs_cpu_us"]
    assert podium["pipelined_calls_per_s_min"] == min(r["pipelined_calls_per_s"] for r in rounds)
    ratio = podium["call_8_us"] / podium["call_one_rtt_us"]  # of rounded figures: within 1%
    assert abs(podium["call_8_vs_call_one"] - ratio) <= 0.01 * ratio + 0.01
    assert report["ratios"]["podium_call_one_vs_floor"] == podium["call_one_vs_floor"]
    assert report["ratios"]["podium_call_one_vs_busy_floor"] == podium["call_one_vs_busy_floor"]
    targets = report["targets_met"]
    assert set(targets) >= {
        "call_one_le_3x_busy_floor", "pipelined_ge_60k_every_round", "call_8_le_2_5x_call_one",
        "spawn_8_le_1s", "spawn_32_le_3s",
    }
    assert targets["pipelined_ge_60k_every_round"] == (podium["pipelined_calls_per_s_min"] >= 60_000)
    assert targets["call_8_le_2_5x_call_one"] == (podium["call_8_vs_call_one"] <= 2.5)

    for other in ("monarch", "ray"):
        if report[other] is None:  # not importable here, or failed: the report says why
            reason = report.get(f"{other}_unavailable") or report.get(f"{other}_error")
            assert isinstance(reason, str) and reason
        else:
            assert set(report[other]) >= PEER_FIELDS
            assert _positive(report[other]["call_one_rtt_us"])
            assert f"podium_call_one_vs_{other}" in report["ratios"]


@pytest.mark.parametrize("flag", ["--iters", "--rounds"])
def test_bench_python_rejects_a_count_below_one(flag):
    r = subprocess.run(
        [sys.executable, "-m", "podium", "bench", "python", flag, "0"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert f"{flag} must be >= 1" in r.stderr
