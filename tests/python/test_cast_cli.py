"""`podium sim cast` and `podium bench cast-python` (docs/cast.md): the model follows the tree
the relays build, and the benchmark reports the controller's messages per call. Shapes and
counts only: benchmarks print figures, the suite does not time them."""

from __future__ import annotations

import json

from podium._src import sim_cast

# Calibration in the form `podium bench cast --json` prints (figures from one run here; member_us
# from the bench's "root" rows since replies travel as runs).
BENCH = {
    "fanout": 16,
    "sizes": [
        {"procs": 1, "tree_us": 35.3, "star_us": 34.5},
        {"procs": 256, "tree_us": 29256.1, "star_us": 21167.0},
    ],
    "calibration": {"hop_us": 17.25, "send_us": 8.427, "recv_us": 20.354, "member_us": 0.0016,
                    "proc_us": 16.31, "relay_us": 7.77, "contention": 8.35},
    "cores": 2,
}


def test_the_model_splits_like_the_relays():
    assert sim_cast.split_chunks(1, 64, 16)[0] == (1, 5)
    assert sum(hi - lo for lo, hi in sim_cast.split_chunks(0, 100_000, 16)) == 100_000
    assert len(sim_cast.split_chunks(0, 3, 16)) == 3


def test_sim_cast_at_100000_procs(run_podium, tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(BENCH))
    r = run_podium("sim", "cast", "--procs", "100000", "--bench", str(bench), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    by_k = {row["fanout"]: row for row in out["fanouts"]}
    assert set(by_k) == {2, 4, 8, 16, 32, 64}
    assert by_k[16]["root_msgs"] == 32 and by_k[16]["depth"] == 5
    assert [by_k[k]["depth"] for k in (2, 4, 8, 16, 32, 64)] == sorted(
        [by_k[k]["depth"] for k in (2, 4, 8, 16, 32, 64)], reverse=True)
    # The model reproduces the measured one-proc round trip it was calibrated on.
    assert out["curve"][0]["procs"] == 1 and abs(out["curve"][0]["star_us"] - 34.5) < 0.5
    # Relays and the root cost O(runs) per call (compact rank tables, replies as runs, ME-9),
    # so past the fan-out each 16-fold growth of the mesh adds one level: about the same time
    # per step, where a linear term would add 16 times more at each step than at the last.
    steps = out["growth"]["per_16x"]
    assert [(st["from"], st["to"]) for st in steps] == [(256, 4096), (4096, 65536)]
    assert 0 < steps[1]["added_us"] < 2 * steps[0]["added_us"]
    curve = {row["procs"]: row["tree_k16_us"] for row in out["curve"]}
    assert curve[100_000] < 2 * curve[10_000] < 4 * curve[1000]
    # The root's own per-rank term (member_us, one AC-11 number per rank) is what share it is.
    share = BENCH["calibration"]["member_us"] * 100_000 / by_k[16]["latency_us"]
    assert abs(out["growth"]["root_per_rank_share"] - share) < 1e-3
    assert out["star_us"] > 10 * by_k[16]["latency_us"]


def test_bench_cast_python_counts_the_controllers_messages(run_podium):
    r = run_podium("bench", "cast-python", "--json", "--sizes", "1,17", "--iters", "4",
                   "--fanout", "4")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["fanout"] == 4 and [row["procs"] for row in out["sizes"]] == [1, 17]
    big = out["sizes"][1]
    assert big["controller_sends"] <= 5 and big["controller_recvs"] <= 5  # CT-1: k + 1
    assert big["star_controller_sends"] == 17 and big["star_controller_recvs"] == 17
