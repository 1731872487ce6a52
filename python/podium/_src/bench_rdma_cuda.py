"""`podium bench rdma --cuda [--max-mib 1024] [--reps 3] [--json]`: podium.rdma with CUDA
memory between two procs of one host, each figure next to its floor measured in the same run
(docs/data.md, "GPU memory").

An actor on a spawned proc (the owner) registers one CUDA tensor per size (4 KiB, then x4 up
to ``--max-mib``); the controller, on the same GPU, moves it:

- GPU to GPU: ``read_into`` a CUDA tensor of its own and ``write_from`` it back, next to a
  device-to-device copy of the same size in the controller (``Tensor.copy_``, which is
  ``cudaMemcpyAsync`` plus a synchronize);
- GPU to host and host to GPU: ``read_into`` a CPU tensor and ``write_from`` it back, next to
  the same copies between a CPU and a CUDA tensor in the controller.

Best of ``--reps`` each. Needs torch with CUDA and a UCX with CUDA support (RD-7, DA-23); where
either is missing it says which and measures nothing. A benchmark, not a test.
"""

from __future__ import annotations

import sys
from typing import Any, Dict

import podium.actor as pa
from podium._core import data as _data
from podium._src.bench_measure import best as _best, gbps as _gbps, sizes as _sizes
from podium.rdma import RDMABuffer

_TIMEOUT_S = 300.0
_MIB = 1 << 20


def _torch() -> Any:
    import torch  # optional: only this benchmark and CUDA tensors need it

    return torch


class _GpuOwner(pa.Actor):
    def __init__(self) -> None:
        self.mem: Dict[int, Any] = {}

    @pa.endpoint
    def make(self, n: int) -> RDMABuffer:
        torch = _torch()
        self.mem[n] = torch.zeros(n, dtype=torch.uint8, device="cuda")
        return RDMABuffer(self.mem[n])

    @pa.endpoint
    def checksum(self, n: int) -> int:
        return int(self.mem[n].sum(dtype=_torch().int64).item())

    @pa.endpoint
    def free(self, n: int) -> None:
        self.mem.pop(n, None)


def _say(text: str) -> None:
    print(f"rdma cuda {text}", file=sys.stderr, flush=True)


def unavailable() -> str:
    """Why this benchmark cannot run here, or ''."""
    try:
        torch = _torch()
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    pa.this_proc()  # the runtime, so the data plane can start
    if not _data.cuda_supported():
        return f"this UCX ({_data.ucx_version()}) has no CUDA support"
    return ""


def run(max_mib: int, reps: int) -> Dict[str, Any]:
    why = unavailable()
    if why:
        return {"benchmark": "rdma_cuda", "skipped": why}
    torch = _torch()
    pm = pa.this_host().spawn_procs(per_host={"procs": 1})
    rows = []
    try:
        pm.initialized.get(timeout=_TIMEOUT_S)
        owner = pm.spawn("rdma_cuda_owner", _GpuOwner).slice(procs=0)
        for n in _sizes(4096, max_mib * _MIB):
            buf = owner.make.call_one(n).get(timeout=_TIMEOUT_S)
            gpu = torch.arange(n, dtype=torch.int64, device="cuda").to(torch.uint8)
            gpu2 = torch.empty_like(gpu)
            cpu = torch.empty(n, dtype=torch.uint8)
            # Correctness first: what goes in comes back, on both paths.
            buf.write_from(gpu).get(timeout=_TIMEOUT_S)
            buf.read_into(gpu2).get(timeout=_TIMEOUT_S)
            buf.read_into(cpu).get(timeout=_TIMEOUT_S)
            intact = bool(torch.equal(gpu, gpu2)) and bool(torch.equal(gpu.cpu(), cpu))
            expected = int(gpu.sum(dtype=torch.int64).item())
            intact = intact and owner.checksum.call_one(n).get(timeout=_TIMEOUT_S) == expected

            def d2d() -> None:
                gpu2.copy_(gpu)
                torch.cuda.synchronize()

            def d2h() -> None:
                cpu.copy_(gpu)
                torch.cuda.synchronize()

            def h2d() -> None:
                gpu2.copy_(cpu)
                torch.cuda.synchronize()

            r_gg = _best(lambda: buf.read_into(gpu2).get(timeout=_TIMEOUT_S), reps)
            w_gg = _best(lambda: buf.write_from(gpu).get(timeout=_TIMEOUT_S), reps)
            r_gh = _best(lambda: buf.read_into(cpu).get(timeout=_TIMEOUT_S), reps)
            w_hg = _best(lambda: buf.write_from(cpu).get(timeout=_TIMEOUT_S), reps)
            f_dd, f_dh, f_hd = _best(d2d, reps), _best(d2h, reps), _best(h2d, reps)
            row = {
                "bytes": n, "intact": intact,
                "gpu_to_gpu_read_gbps": _gbps(n, r_gg), "gpu_to_gpu_write_gbps": _gbps(n, w_gg),
                "d2d_copy_gbps": _gbps(n, f_dd),
                "gpu_to_host_read_gbps": _gbps(n, r_gh), "d2h_copy_gbps": _gbps(n, f_dh),
                "host_to_gpu_write_gbps": _gbps(n, w_hg), "h2d_copy_gbps": _gbps(n, f_hd),
            }
            rows.append(row)
            _say(f"{n:>11} B: GPU->GPU read {row['gpu_to_gpu_read_gbps']:7.2f} write "
                 f"{row['gpu_to_gpu_write_gbps']:7.2f} (D2D copy {row['d2d_copy_gbps']:7.2f}); "
                 f"GPU->host {row['gpu_to_host_read_gbps']:6.2f} (D2H {row['d2h_copy_gbps']:6.2f}); "
                 f"host->GPU {row['host_to_gpu_write_gbps']:6.2f} (H2D {row['h2d_copy_gbps']:6.2f}) "
                 f"GB/s{'' if intact else '  BYTES DIFFER'}")
            buf.drop().get(timeout=_TIMEOUT_S)
            owner.free.call_one(n).get(timeout=_TIMEOUT_S)
    finally:
        pm.stop().get(timeout=_TIMEOUT_S)
    return {
        "benchmark": "rdma_cuda",
        "device": torch.cuda.get_device_name(0),
        "ucx_version": _data.ucx_version(),
        "sizes": rows,
        "all_intact": all(r["intact"] for r in rows),
    }


def show(result: Dict[str, Any]) -> None:
    if result.get("skipped"):
        print(f"rdma --cuda skipped: {result['skipped']}")
        return
    print(f"{result['device']}, UCX {result['ucx_version']}")
    for r in result["sizes"]:
        print(f"{r['bytes']:>11} B  GPU->GPU read {r['gpu_to_gpu_read_gbps']:7.2f} "
              f"write {r['gpu_to_gpu_write_gbps']:7.2f} GB/s (D2D {r['d2d_copy_gbps']:7.2f})  "
              f"GPU->host {r['gpu_to_host_read_gbps']:6.2f} (D2H {r['d2h_copy_gbps']:6.2f})  "
              f"host->GPU {r['host_to_gpu_write_gbps']:6.2f} (H2D {r['h2d_copy_gbps']:6.2f})"
              f"{'' if r['intact'] else '  BYTES DIFFER'}")
