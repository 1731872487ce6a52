"""The tensor engine's example, its dispatch benchmark, and its lazy import (docs/tensor.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from conftest import CHILD_TIMEOUT_S  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_distributed_tensors_example_runs(tmp_path):
    example = ROOT / "examples" / "distributed_tensors.py"
    r = subprocess.run([sys.executable, str(example)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=3 * CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout, r.stderr)
    out = r.stdout
    assert "value on gpus=2: [[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]" in out
    assert "remote failure on rank 0: IndexError" in out
    assert "after the failure: 24.0" in out
    assert "all-reduced: [10.0, 10.0, 10.0]" in out
    assert "along model: [1.0, 1.0, 5.0, 5.0]" in out
    assert "along both: 3.0" in out
    assert "pipeline output on stage 1: [[180.0, 180.0, 180.0, 180.0], " \
           "[210.0, 210.0, 210.0, 210.0]]" in out
    assert out.rstrip().endswith("done")


def test_measure_dispatch_reports_ops_per_second():  # TE-6
    from podium.tensor._bench import measure_dispatch

    r = measure_dispatch(300, procs=2, warmup=20)
    assert r["n_ops"] == 300 and r["procs"] == 2
    assert r["ops_per_s"] > 0 and r["seconds"] >= r["dispatch_s"] > 0
    assert r["meta_cache_misses"] == 0  # the same op over and over: all cache hits


def test_import_podium_does_not_import_torch():
    probe = ("import sys, podium\n"
             "assert 'torch' not in sys.modules, 'import podium imported torch'\n"
             "names = ['inspect', 'fetch_shard', 'show', 'remote', 'Stream', 'Tensor',\n"
             "         'get_active_stream', 'grad_generator', 'coalescing', 'reduce', 'reduce_',\n"
             "         'to_mesh', 'slice_mesh', 'get_active_mesh', 'no_mesh', 'RemoteException']\n"
             "for n in names:\n"
             "    getattr(podium, n)\n"
             "assert 'torch' in sys.modules\n"
             "import podium.tensor\n"
             "assert podium.Tensor is podium.tensor.Tensor\n"
             "try:\n"
             "    podium.not_a_name\n"
             "except AttributeError:\n"
             "    print('ok')\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       timeout=CHILD_TIMEOUT_S)
    assert r.stdout.strip() == "ok", r.stdout + r.stderr


def test_ddp_example_matches_a_single_process_run(tmp_path):  # TE-15, TE-17
    example = ROOT / "examples" / "ddp.py"
    r = subprocess.run([sys.executable, str(example), "--steps", "8"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=3 * CHILD_TIMEOUT_S,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "time per step:" in r.stdout
    assert r.stdout.rstrip().endswith("parity ok")
