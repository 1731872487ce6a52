"""`podium bench cast-python [--json] [--fanout K] [--sizes 1,8,64] [--iters N]`: call() on
meshes of Python procs through the cast tree and through the star, in the same run.

The Python counterpart of `podium bench cast` (cpp/tools/bench_cast.cc, docs/cast.md): per
size, the median latency of `call().get()` of a trivial endpoint with the tree (fan-out K,
default 16) and with the star (fan-out 0: the controller sends to every actor itself),
alternating, and the controller proc's envelopes to and from other procs per call, counted by
the runtime (`Proc::traffic`), the largest seen. Procs do not poll (PODIUM_POLL_US=0 unless
set): 64 Python procs share this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import List, Optional

from podium._core import mesh as _mesh
from podium.actor import Actor, endpoint, this_host


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="podium bench cast-python")
    p.add_argument("--json", action="store_true")
    p.add_argument("--fanout", type=int, default=16)
    p.add_argument("--sizes", default="1,8,64")
    p.add_argument("--iters", type=int, default=20)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("PODIUM_POLL_US", "0")  # before the zygote starts: every proc
    class Echo(Actor):
        @endpoint
        def ping(self, x: int) -> int:
            return x

    def measure(mesh, fanout: int, iters: int):
        _mesh.set_cast_fanout(fanout)
        lat, sends, recvs = [], 0, 0
        for i in range(iters + 2):
            s0, r0 = _mesh.traffic()
            t0 = time.perf_counter()
            mesh.ping.call(1).get(timeout=60)
            dt = time.perf_counter() - t0
            s1, r1 = _mesh.traffic()
            if i < 2:
                continue  # warm-up
            lat.append(dt * 1e6)
            sends, recvs = max(sends, s1 - s0), max(recvs, r1 - r0)
        return lat, sends, recvs

    rows = []
    for n in [int(s) for s in args.sizes.split(",") if s]:
        procs = this_host().spawn_procs(per_host={"procs": n})
        try:
            mesh = procs.spawn("echo", Echo)
            mesh.initialized.get(timeout=120)
            tree, star = [], []
            ts = tr = ss = sr = 0
            for half in (args.iters // 2, args.iters - args.iters // 2):
                lat, s, r = measure(mesh, args.fanout, half)
                tree += lat
                ts, tr = max(ts, s), max(tr, r)
                lat, s, r = measure(mesh, 0, half)
                star += lat
                ss, sr = max(ss, s), max(sr, r)
            rows.append({"procs": n, "tree_us": round(statistics.median(tree), 1),
                         "star_us": round(statistics.median(star), 1),
                         "controller_sends": ts, "controller_recvs": tr,
                         "star_controller_sends": ss, "star_controller_recvs": sr})
            if not args.json:
                print(f"procs {n:4}: tree {rows[-1]['tree_us']:9.1f} us  "
                      f"star {rows[-1]['star_us']:9.1f} us  sends {ts} recvs {tr}")
        finally:
            _mesh.set_cast_fanout(args.fanout)
            procs.stop().get(timeout=60)
    if args.json:
        print(json.dumps({"fanout": args.fanout, "python_procs": True, "sizes": rows,
                          "iters": args.iters}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
