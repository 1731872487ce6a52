"""`podium bench rdma-net`: podium.rdma between two network-namespace hosts, next to raw TCP
between the same namespaces. One run prints one JSON object; the test checks its shape, that
each side's UCX was restricted to its veth (DA-21), that podium's TCP path moved every
transfer it times (DA-49), and that the namespaces it made are gone
afterwards, never the figures (a benchmark, not a test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import skip_or_fail
from podium._src import netns


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _namespaces() -> set:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def test_bench_rdma_net_json_report():  # DA-21
    reason = netns.unavailable_reason()
    if reason is not None:
        skip_or_fail(reason)
    before = _namespaces()
    r = subprocess.run(
        [sys.executable, "-m", "podium", "bench", "rdma-net", "--max-mib", "1", "--reps", "1",
         "--json"],
        env=os.environ.copy(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120)
    assert r.returncode == 0, r.stderr
    (line,) = [l for l in r.stdout.splitlines() if l.strip()]  # one JSON object, nothing else
    report = json.loads(line)
    assert report["benchmark"] == "rdma-net"
    assert report["pump"] == "c++ (podium-tcp-pump)"
    owner, reader = report["owner"], report["reader"]
    assert owner[0].startswith("tcp:10.77.") and reader[0].startswith("tcp:10.77.")
    assert owner[0].split(":")[1] != reader[0].split(":")[1]  # two hosts
    assert owner[1] == reader[1] == "eth0"
    assert [row["bytes"] for row in report["sizes"]] == [4096, 16384, 65536, 262144, 1048576]
    for row in report["sizes"]:
        for key in ("read_gbps", "write_gbps", "tcp_gbps", "read_vs_tcp", "write_vs_tcp",
                    "ucx_read_gbps", "ucx_write_gbps"):
            assert _number(row[key]) and row[key] > 0, row
        # Timed runs (as `podium bench rdma`'s): per kind, the requests of a run, and the best
        # single request beside it.
        assert set(row["calls"]) == set(row["single_us"]) == {
            "tcp", "read", "write", "ucx_read", "ucx_write"}, row
        for kind, calls in row["calls"].items():
            assert len(calls) == 1 and all(isinstance(c, int) and c >= 1 for c in calls), row
            assert _number(row["single_us"][kind]) and row["single_us"][kind] > 0, row
            # CPU per request of each side of a timed run (a run of one request has none)
            if max(calls) > 1:
                both = row["cpu_us"][kind]
                assert len(both) == 2 and all(_number(c) and c > 0 for c in both), row
    # podium's TCP path moved every transfer it timed (DA-49): 2 warm-up ones, then per size a
    # single read and write and, where a run is more than that one, the run's; UCX's beside
    # them did not count.
    timed = sum(1 + (c if c > 1 else 0)
                for row in report["sizes"] for k in ("read", "write") for c in row["calls"][k])
    tcp = report["reader_tcp"]
    assert tcp["transfers"] == 2 + timed and tcp["failed"] == 0, (tcp, timed)
    assert not {n for n in _namespaces() - before if n.startswith("pbn")}
