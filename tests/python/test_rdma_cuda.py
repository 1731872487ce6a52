"""podium.rdma with CUDA memory (issue 19 part 8; RD-7, DA-23; docs/data.md, "GPU memory"):
CUDA tensors as buffers and as the local side, GPU to GPU and between GPU and host memory,
between procs of one host, through a UCX built with CUDA support.

These tests need a GPU, torch with CUDA, and podium built against a CUDA UCX
(PODIUM_UCX_ROOT): the module skips, naming what is missing, where any of them is absent
(CI has no GPU). What runs everywhere: the refusal of CUDA memory by a UCX without CUDA
support (data_test's CudaMemoryIsRefusedWithoutCudaSupport, and the last test here where
torch sees a GPU but UCX has no CUDA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import podium.actor as pa  # noqa: E402
from podium._core import data as _data  # noqa: E402
from podium.rdma import RDMAAction, RDMABuffer  # noqa: E402

T = 60  # seconds: bound on every get() below

if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)


def _cuda_ucx() -> bool:
    pa.this_proc()  # the runtime: the data plane starts with it
    return bool(_data.cuda_supported())


needs_cuda_ucx = pytest.mark.skipif(
    "not _cuda_ucx()", reason="this UCX has no CUDA support (build with PODIUM_UCX_ROOT)")


def pattern(n: int, salt: int, device: str = "cuda"):
    return ((torch.arange(n, dtype=torch.int64, device=device) * 131 + salt) % 256).to(
        torch.uint8)


class GpuOwner(pa.Actor):
    """Owns CUDA tensors and hands out buffers over them."""

    def __init__(self) -> None:
        self.mem = {}
        self.bufs = {}

    @pa.endpoint
    def make(self, key: str, n: int, salt: int) -> RDMABuffer:
        self.mem[key] = pattern(n, salt)
        self.bufs[key] = RDMABuffer(self.mem[key])
        return self.bufs[key]

    @pa.endpoint
    def contents(self, key: str) -> bytes:
        return bytes(self.mem[key].cpu().numpy())

    @pa.endpoint
    def device(self, key: str) -> str:
        return str(self.mem[key].device)

    @pa.endpoint
    def registrations(self) -> int:
        return _data.registration_count()

    @pa.endpoint
    def drop_all(self) -> int:
        for b in self.bufs.values():
            b.drop().get(timeout=T)
        self.bufs.clear()
        self.mem.clear()
        return _data.registration_count()


class GpuPeer(pa.Actor):
    """Reads and writes buffers into and from CUDA tensors of its own proc."""

    @pa.endpoint
    def read(self, buf: RDMABuffer) -> bytes:
        dst = torch.zeros(buf.size(), dtype=torch.uint8, device="cuda")
        buf.read_into(dst).get(timeout=T)
        return bytes(dst.cpu().numpy())

    @pa.endpoint
    def write(self, buf: RDMABuffer, n: int, salt: int) -> None:
        buf.write_from(pattern(n, salt)).get(timeout=T)


@pytest.fixture(scope="module")
def gpu_procs():
    pm = pa.this_host().spawn_procs(per_host={"procs": 2})
    try:
        pm.initialized.get(timeout=T)
        yield pm
    finally:
        pm.stop().get(timeout=T)


@pytest.fixture
def pair(gpu_procs, request):
    name = request.node.name.replace("[", "_").replace("]", "_")
    owner = gpu_procs.spawn(f"gpu_owner_{name}", GpuOwner).slice(procs=0)
    peer = gpu_procs.spawn(f"gpu_peer_{name}", GpuPeer).slice(procs=1)
    yield owner, peer
    owner.drop_all.call_one().get(timeout=T)


@needs_cuda_ucx
def test_a_cuda_buffer_is_read_into_host_and_gpu_memory(pair):
    owner, _ = pair
    n = 3 << 20
    buf = owner.make.call_one("a", n, 7).get(timeout=T)
    assert owner.device.call_one("a").get(timeout=T).startswith("cuda")
    want = pattern(n, 7)
    on_gpu = torch.zeros(n, dtype=torch.uint8, device="cuda")
    buf.read_into(on_gpu).get(timeout=T)  # GPU -> GPU
    assert torch.equal(on_gpu, want)
    on_host = torch.zeros(n, dtype=torch.uint8)
    buf.read_into(on_host).get(timeout=T)  # GPU -> host
    assert torch.equal(on_host, want.cpu())
    mv = bytearray(n)
    buf.read_into(memoryview(mv)).get(timeout=T)  # GPU -> a plain host buffer
    assert bytes(mv) == bytes(want.cpu().numpy())


@needs_cuda_ucx
def test_a_cuda_buffer_is_written_from_host_and_gpu_memory(pair):
    owner, _ = pair
    n = 1 << 20
    buf = owner.make.call_one("w", n, 0).get(timeout=T)
    buf.write_from(pattern(n, 3)).get(timeout=T)  # GPU -> GPU
    assert owner.contents.call_one("w").get(timeout=T) == bytes(pattern(n, 3).cpu().numpy())
    buf.write_from(pattern(n, 5, "cpu")).get(timeout=T)  # host -> GPU
    assert owner.contents.call_one("w").get(timeout=T) == bytes(pattern(n, 5, "cpu").numpy())


@needs_cuda_ucx
def test_gpu_to_gpu_between_actors_of_two_procs(pair):
    owner, peer = pair
    n = 5 << 20
    buf = owner.make.call_one("g", n, 11).get(timeout=T)
    assert peer.read.call_one(buf).get(timeout=T) == bytes(pattern(n, 11).cpu().numpy())
    peer.write.call_one(buf, n, 13).get(timeout=T)
    assert owner.contents.call_one("g").get(timeout=T) == bytes(pattern(n, 13).cpu().numpy())


@needs_cuda_ucx
def test_a_large_cuda_transfer_runs_in_chunks_and_arrives_whole(pair):
    owner, _ = pair
    n = 96 << 20  # 24 chunks of the default 4 MiB (DA-3)
    buf = owner.make.call_one("big", n, 21).get(timeout=T)
    before = _data.stats()["chunks"]
    dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
    buf.read_into(dst).get(timeout=T)
    assert _data.stats()["chunks"] - before >= n // (4 << 20)
    assert torch.equal(dst, pattern(n, 21))


@needs_cuda_ucx
def test_an_action_mixes_cuda_and_host_operations(pair):
    owner, _ = pair
    n = 1 << 20
    a = owner.make.call_one("x", n, 1).get(timeout=T)
    b = owner.make.call_one("y", n, 2).get(timeout=T)
    dst = torch.zeros(n, dtype=torch.uint8)
    RDMAAction().read_remote(dst, a).write_remote(b, pattern(n, 9)).submit(timeout=T).get(
        timeout=T)
    assert torch.equal(dst, pattern(n, 1).cpu())
    assert owner.contents.call_one("y").get(timeout=T) == bytes(pattern(n, 9).cpu().numpy())


@needs_cuda_ucx
def test_cuda_registrations_are_released_on_drop(pair):
    owner, _ = pair
    base = owner.registrations.call_one().get(timeout=T)
    bufs = [owner.make.call_one(f"r{i}", 1 << 16, i).get(timeout=T) for i in range(8)]
    assert owner.registrations.call_one().get(timeout=T) == base + 8
    for b in bufs:
        b.drop().get(timeout=T)
    assert owner.registrations.call_one().get(timeout=T) == base
    with pytest.raises(RuntimeError, match="dropped"):
        bufs[0].read_into(torch.zeros(1 << 16, dtype=torch.uint8, device="cuda"))


@needs_cuda_ucx
def test_cuda_arguments_are_checked_before_anything_moves(pair):
    owner, _ = pair
    buf = owner.make.call_one("c", 1 << 20, 0).get(timeout=T)
    with pytest.raises(ValueError, match="1-D and contiguous"):
        buf.read_into(torch.zeros(512, 2048, dtype=torch.uint8, device="cuda").t())
    with pytest.raises(ValueError, match="fewer than"):
        buf.read_into(torch.zeros(1 << 10, dtype=torch.uint8, device="cuda"))
    with pytest.raises(ValueError, match="size 0"):
        RDMABuffer(torch.zeros(0, dtype=torch.uint8, device="cuda"))


def test_without_a_cuda_ucx_a_cuda_tensor_is_refused_naming_the_ucx():
    if _cuda_ucx():
        pytest.skip("this UCX has CUDA support: the refusal cannot happen here")
    with pytest.raises(NotImplementedError, match=r"UCX \(\d+\.\d+\.\d+\) has none"):
        RDMABuffer(torch.zeros(16, dtype=torch.uint8, device="cuda"))
