"""`podium bench rdma --quick`: one run prints one JSON object with, per size, read and write
bandwidth next to memcpy's, the small-read latency next to call_one's, the call_one round trip
while a transfer reads and while one writes next to the idle one (issue 19 item 6), the time
to make a buffer of each size next to a memcpy of its bytes, tensor
arguments next to RDMABuffer writes of the same bytes, and the registrations around the
create/drop cycles. The test checks the report's shape, and that the cycles leave no
registration behind (DA-8), never the figures (a benchmark, not a test)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def test_bench_rdma_json_report():  # DA-8
    r = subprocess.run(
        [sys.executable, "-m", "podium", "bench", "rdma", "--quick", "--json"],
        env=os.environ.copy(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=100)
    assert r.returncode == 0, r.stderr
    (line,) = [l for l in r.stdout.splitlines() if l.strip()]  # one JSON object, nothing else
    report = json.loads(line)
    assert report["benchmark"] == "rdma"
    assert report["backend"] in ("tcp", "ibverbs")
    assert report["same_host_path"] in ("cma", "ucx")
    assert report["copiers"] in (1, 2)
    assert [row["bytes"] for row in report["sizes"]] == [4096, 16384, 65536, 262144, 1048576]
    for row in report["sizes"]:
        assert set(row) == {"bytes", "read_gbps", "write_gbps", "memcpy_gbps", "read_vs_memcpy",
                            "write_vs_memcpy", "create_us", "owner_memcpy_us",
                            "one_read_shared_us", "one_read_private_us"}
        assert all(_number(v) and v > 0 for v in row.values()), row
    assert _number(report["read_4k_median_us"]) and _number(report["call_one_rtt_median_us"])
    assert [u["kind"] for u in report["rtt_under_bulk"]] == ["read", "write"]
    for u in report["rtt_under_bulk"]:
        assert u["bulk_bytes"] == 16 << 20 and u["transfers_during"] >= 1, u
        assert u["samples"] >= 1 and _number(u["rtt_median_us"]) and _number(u["ratio"]), u
        assert all(_number(u[k]) for k in ("idle_rtt_median_us", "idle_rtt_p90_us",
                                           "rtt_p90_us")), u
    one = report["rtt_one_cpu"]  # item 6's floor: a controller and its proc on one CPU
    if len(os.sched_getaffinity(0)) >= 2:
        assert one["cpus"] == len(os.sched_getaffinity(0)), one
        assert all(_number(one[k]) and one[k] > 0
                   for k in ("idle_rtt_median_us", "rtt_median_us", "rtt_p90_us", "ratio")), one
        assert report["targets"]["rtt_one_cpu_ratio"] == one["ratio"]
    else:
        assert one is None and report["targets"]["rtt_one_cpu_ratio"] is None
    torch_here = importlib.util.find_spec("torch") is not None
    if torch_here:
        assert report["tensor_args_skipped"] is None
        (row,) = report["tensor_args"]
        assert row["bytes"] == 1 << 20
        assert all(_number(row[k]) and row[k] > 0
                   for k in ("endpoint_arg_ms", "rdma_write_ms", "endpoint_vs_rdma"))
        o = report["rtt_other_link_under_tensor_arg"]
        assert o["tensor_bytes"] == 1 << 20 and o["calls_during"] >= 1, o
        assert o["samples"] >= 1 and _number(o["rtt_median_us"]) and _number(o["ratio"]), o
    else:
        assert report["tensor_args"] == [] and "torch" in report["tensor_args_skipped"]
        assert report["rtt_other_link_under_tensor_arg"] is None
    targets = report["targets"]
    assert set(targets) == {"min_read_vs_memcpy_1mib_up", "min_write_vs_memcpy_1mib_up",
                            "largest_tensor_endpoint_vs_rdma", "max_rtt_under_bulk_ratio",
                            "rtt_one_cpu_ratio"}
    assert targets["min_read_vs_memcpy_1mib_up"] == report["sizes"][-1]["read_vs_memcpy"]
    assert report["create_drop_cycles"] == 200
    d = report["drop_4k"]  # DA-42: a drop after a read, next to one never read
    assert d["drops"] == 5 and d["lease_ms"] > 0
    assert all(d[k] > 0 for k in ("after_read_median_ms", "after_read_max_ms",
                                  "unread_median_ms"))
    assert report["registrations_after"] == report["registrations_before"]
    assert "rdma" in r.stderr  # progress goes to stderr
