"""The tensor engine with CUDA tensors on the workers (docs/tensor.md): ops created on the GPU
from the controller, computed there, fetched back; a CUDA handle moved between meshes over
the data plane. Needs a GPU and torch with CUDA: skipped where torch sees none (CI has no GPU).
A collective over NCCL needs one GPU per rank; with one GPU, NCCL refuses two ranks on it, so
the NCCL path is not exercised here."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import podium  # noqa: E402
from podium.actor import this_host  # noqa: E402

T = 60  # seconds: bound on every wait below

if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)


@pytest.fixture(scope="module")
def mesh():
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        yield pm
    finally:
        pm.stop().get(timeout=T)


def test_cuda_ops_run_on_the_workers_gpus_and_fetch_back(mesh):
    with mesh.activate():
        a = torch.ones(64, 64, device="cuda")
        assert a.device.type == "cuda"
        a.add_(mesh.rank_tensor("gpus").to("cuda"))
        b = (a @ a).sum()
        for g in range(2):
            got = podium.inspect(b, gpus=g)
            assert got.item() == pytest.approx(64 * 64 * 64 * (1 + g) ** 2)


def test_a_cuda_value_moves_to_another_mesh(mesh):
    other = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        with mesh.activate():
            x = torch.arange(1 << 20, dtype=torch.float32, device="cuda") + mesh.rank_tensor(
                "gpus").to("cuda")
            y = podium.to_mesh(x, other)
        with other.activate():
            got = [podium.inspect(y, gpus=g) for g in range(2)]
        for g in range(2):
            assert torch.equal(got[g].cpu(), torch.arange(1 << 20, dtype=torch.float32) + g)
    finally:
        other.stop().get(timeout=T)
