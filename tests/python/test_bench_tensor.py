"""`podium bench tensor --quick --json` (the torchrun DDP baseline of issue 20 item 9) and the
DDP example's shared definitions (examples/ddp_common.py, installed as podium._src.ddp_common).
The test checks the report's shape and that the baseline trains what the single-process
reference trains, never the timings (a benchmark, not a test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from podium._src import ddp_common  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_common.py"


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def test_bench_tensor_json_report():
    r = subprocess.run(
        [sys.executable, "-m", "podium", "bench", "tensor", "--quick", "--json"],
        env=os.environ.copy(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=300)
    assert r.returncode == 0, r.stderr
    (line,) = [l for l in r.stdout.splitlines() if l.strip()]  # one JSON object, nothing else
    report = json.loads(line)
    assert report["benchmark"] == "tensor" and report["device"] == "cpu"
    assert report["model"]["parameters"] == sum(
        p.numel() for p in ddp_common.make_model().parameters())
    t = report["torchrun_ddp"]
    assert (t["launcher"], t["backend"], t["procs"], t["steps"], t["warmup"]) == \
        ("torchrun", "gloo", 2, 3, 1)
    for key in ("step_ms_median", "step_ms_p90", "loop_ms_per_step", "launch_s"):
        assert _number(t[key]) and t[key] > 0, key
    # torchrun's DDP ends where the single-process reference on the same global batches ends
    assert t["max_abs_diff_vs_single_process"] < 1e-5
    # ... and so does the same training driven from the controller, on every rank
    c = report["controller_ddp"]
    assert (c["backend"], c["procs"], c["steps"], c["warmup"]) == ("gloo", 2, 3, 1)
    for key in ("step_ms_median", "step_ms_p90", "loop_ms_per_step"):
        assert _number(c[key]) and c[key] > 0, key
    assert c["max_abs_diff_vs_single_process"] < 1e-5
    d = report["dispatch"]
    assert (d["n_ops"], d["procs"]) == (500, 2) and d["ops_per_s"] > 0
    assert d["meta_cache_misses"] == 0
    assert set(report["ratios"]) == {"step_median_vs_torchrun", "loop_vs_torchrun"}


def test_the_installed_copy_is_the_example():
    if not EXAMPLE.exists():
        pytest.skip("not run from a source tree")
    assert Path(ddp_common.__file__).read_text() == EXAMPLE.read_text()


def test_rank_shards_average_to_the_global_gradient():
    """What makes data parallel match the reference: the ranks' shards are the global batch,
    and the mean of their gradients is the global batch's gradient."""
    world, step = 4, 7
    x, y = ddp_common.global_batch(step, world)
    shards = [ddp_common.rank_batch(step, r, world) for r in range(world)]
    assert torch.equal(torch.cat([s[0] for s in shards]), x)
    assert torch.equal(torch.cat([s[1] for s in shards]), y)

    def grads(xb, yb):
        model = ddp_common.make_model()
        ddp_common.loss_fn(model(xb), yb).backward()
        return [p.grad for p in model.parameters()]

    full = grads(x, y)
    per_rank = [grads(*s) for s in shards]
    for i, g in enumerate(full):
        avg = sum(r[i] for r in per_rank) / world
        assert torch.allclose(avg, g, atol=1e-6)
    a = ddp_common.train_single_process(2, world)
    b = ddp_common.train_single_process(2, world)
    assert ddp_common.max_abs_diff(a, b) == 0.0  # deterministic
