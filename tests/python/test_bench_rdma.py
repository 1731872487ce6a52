"""`podium bench rdma`: one run prints one JSON object with, per size, read and write bandwidth
next to memcpy's, the small-read latency next to call_one's, and the registrations around
the create/drop cycles. The test checks the report's shape, and that the cycles leave no
registration behind (DA-8), never the figures (a benchmark, not a test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def test_bench_rdma_json_report():  # DA-8
    r = subprocess.run(
        [sys.executable, "-m", "podium", "bench", "rdma", "--max-mib", "1", "--reps", "2",
         "--cycles", "200", "--json"],
        env=os.environ.copy(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=100)
    assert r.returncode == 0, r.stderr
    (line,) = [l for l in r.stdout.splitlines() if l.strip()]  # one JSON object, nothing else
    report = json.loads(line)
    assert report["benchmark"] == "rdma"
    assert report["backend"] in ("tcp", "ibverbs")
    assert report["same_host_path"] in ("cma", "ucx")
    assert [row["bytes"] for row in report["sizes"]] == [4096, 16384, 65536, 262144, 1048576]
    for row in report["sizes"]:
        assert set(row) == {"bytes", "read_gbps", "write_gbps", "memcpy_gbps", "read_vs_memcpy",
                            "write_vs_memcpy"}
        assert all(_number(v) and v > 0 for v in row.values()), row
    assert _number(report["read_4k_median_us"]) and _number(report["call_one_rtt_median_us"])
    assert _number(report["call_one_rtt_under_bulk_median_us"])
    assert report["bulk_bytes"] == 1048576 and report["bulk_reads_during"] >= 1
    assert report["create_drop_cycles"] == 200
    assert report["registrations_after"] == report["registrations_before"]
    assert "rdma" in r.stderr  # progress goes to stderr
