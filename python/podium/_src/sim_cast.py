"""`podium sim cast`: a model of call() through the cast tree, calibrated by `podium bench cast`.

The model (docs/cast.md) follows the tree the C++ relay builds (relay.h, CT-2): a node that
receives chunk [lo, hi) delivers to rank lo and forwards [lo+1, hi) split into at most k
near-equal chunks; the root splits [0, n) into at most k chunks. Costs come from the bench's
"calibration" (measured on this machine, never invented; cpp/tools/bench_cast.cc):

  hop_us     a message's trip from one proc to another (half a measured round trip)
  send_us    a node's CPU time per message it sends
  recv_us    a node's CPU time per reply it receives and merges
  member_us  the root's CPU time per rank of the cast, measured alone by the bench ("root":
             each rank's AC-11 number; the rank tables and the replies are runs, ME-9); a
             relay's work does not grow with its chunk (compact rank tables and reply
             ranges, docs/cast.md)
  proc_us    a proc's CPU time to take a call, run the handler and reply
  relay_us   a relay's extra CPU time for being one (decoding the plan, its gather port)

Each proc is assumed to have a core of its own (the cluster case): a node's sends leave one
after another; each child answers its parent one hop after its own subtree is done; the
replies are handled one after another in arrival order. Replies are assumed equal (one run
per message, CT-3), as in the bench. The time of a subtree depends on its size only, so the
model is exact for the tree shape and costs O(depth * k) per size.

On a machine with fewer cores than procs, wall time is bounded by the CPU work of all procs
over the cores instead; "validation" compares both with the bench's own rows.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import subprocess
import sys
from typing import Any

from podium._src import find_binary

DEFAULT_FANOUTS = (2, 4, 8, 16, 32, 64)
CURVE_SIZES = (1, 8, 64, 256, 1000, 10_000, 100_000)


def split_chunks(lo: int, hi: int, k: int) -> list[tuple[int, int]]:
    """The chunks of [lo, hi) for k children, as relay.cc's split_chunks makes them."""
    n = hi - lo
    if n <= 0 or k <= 0:
        return []
    parts = min(k, n)
    base, extra = divmod(n, parts)
    out = []
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append((lo, lo + size))
        lo += size
    return out


class Model:
    def __init__(self, cal: dict[str, float], fanout: int, member_us: float | None = None):
        self.s = float(cal["send_us"])
        self.r = float(cal["recv_us"])
        # hop_us is half a measured round trip, which already holds one send and one receive;
        # what is left is the wire and the wake-up (so that star(1) is the measured round trip).
        self.h = max(0.0, float(cal["hop_us"]) - (self.s + self.r) / 2)
        self.m = float(cal["member_us"]) if member_us is None else member_us
        self.p = float(cal["proc_us"])
        self.relay = float(cal["relay_us"])
        self.k = fanout
        self._node = functools.lru_cache(maxsize=None)(self._node_uncached)

    def _gather(self, start: float, arrivals: list[float]) -> float:
        """When the last of `arrivals` has been handled, one at a time from `start` on."""
        t = start
        for a in sorted(arrivals):
            t = max(t, a) + self.r
        return t

    def _children(self, t: float, kids: list[tuple[int, int]]) -> tuple[list[float], int, int]:
        arrivals = []
        depth = 0
        load = 0
        for j, (lo, hi) in enumerate(kids, 1):
            done, d, l = self._node(hi - lo)
            arrivals.append(t + j * self.s + self.h + done + self.h)
            depth = max(depth, d)
            load = max(load, l)
        return arrivals, depth, load

    def _node_uncached(self, size: int) -> tuple[float, int, int]:
        """A relay with a chunk of `size` ranks: (time from its receipt to its reply leaving,
        depth of its subtree, most messages any node of it handles per call)."""
        t = self.relay
        kids = split_chunks(1, size, self.k)
        arrivals, depth, load = self._children(t, kids)
        t += len(kids) * self.s
        arrivals.append(t + self.p)  # its own actor's reply (in-proc)
        done = self._gather(t, arrivals) + self.s
        own = 1 + len(kids) + len(kids) + 1  # chunk in, sends, replies in, reply out
        return done, depth + 1, max(load, own)

    def star(self, n: int) -> float:
        arrivals = [j * self.s + 2 * self.h for j in range(1, n + 1)]
        return self._gather(n * self.s, arrivals)

    def tree(self, n: int) -> dict[str, Any]:
        if n <= self.k:  # the runtime sends a star at or below the fan-out (CT-1)
            return {"latency_us": self.star(n), "depth": 1, "root_msgs": 2 * n,
                    "max_node_msgs": 2 * n}
        t = self.m * n
        kids = split_chunks(0, n, self.k)
        arrivals, depth, load = self._children(t, kids)
        t += len(kids) * self.s
        return {
            "latency_us": self._gather(t, arrivals),
            "depth": depth,
            "root_msgs": 2 * len(kids),
            "max_node_msgs": max(load, 2 * len(kids)),
        }


def _calibrate(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    if args.bench:
        with open(args.bench) as f:
            bench = json.load(f)
        return bench, args.bench
    path = find_binary("podium-bench-cast")
    if path is None:
        raise SystemExit("podium sim cast: podium-bench-cast not found; pass --bench FILE")
    # Two tree sizes (64 and 256 > the fan-out) let the bench take the root's per-rank CPU from
    # their difference, free of the per-call and per-message costs (member_us).
    cmd = [str(path), "--json", "--sizes", "1,64,256", "--iters", "20"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1]), "measured: " + " ".join(cmd[1:])


def run(args: argparse.Namespace) -> int:
    bench, source = _calibrate(args)
    cal = bench["calibration"]
    fanouts = [int(k) for k in args.fanouts.split(",")] if args.fanouts else list(DEFAULT_FANOUTS)
    models = {k: Model(cal, k) for k in fanouts}
    at_n = []
    for k in fanouts:
        t = models[k].tree(args.procs)
        at_n.append({"fanout": k, **{key: round(v, 1) if isinstance(v, float) else v
                                      for key, v in t.items()}})
    sizes = sorted({*CURVE_SIZES, args.procs})
    sizes = [n for n in sizes if n <= max(args.procs, 256)]
    curve = []
    for n in sizes:
        row: dict[str, Any] = {"procs": n, "star_us": round(models[fanouts[0]].star(n), 1)}
        for k in fanouts:
            row[f"tree_k{k}_us"] = round(models[k].tree(n)["latency_us"], 1)
        curve.append(row)
    # The model against the bench's own sizes, at the bench's fan-out.
    validation = []
    bk = int(bench.get("fanout", 16))
    vm = Model(cal, bk)
    for row in bench.get("sizes", []):
        n = int(row["procs"])
        cores = max(1, int(bench.get("cores", 1)))
        v = {"procs": n, "fanout": bk, "measured_tree_us": row["tree_us"],
             "model_tree_us": round(vm.tree(n)["latency_us"], 1),
             "measured_star_us": row["star_us"], "model_star_us": round(vm.star(n), 1)}
        if "tree_procs_cpu_us" in row:
            # Fewer cores than procs: all the CPU work of a call, spread over the cores.
            v["cpu_bound_tree_us"] = round(
                (row["tree_controller_cpu_us"] + row["tree_procs_cpu_us"]) / cores, 1)
            v["cpu_bound_star_us"] = round(
                (row["star_controller_cpu_us"] + row["star_procs_cpu_us"]) / cores, 1)
        validation.append(v)
    # How the latency grows: the time each 16-fold growth of the mesh adds, at the default
    # fan-out (log N: about the same for every step; N: 16 times the step before), and the
    # share of the root's per-rank term in the latency at --procs.
    gk = 16 if 16 in models else fanouts[0]
    steps = []
    n = 256
    while n * 16 <= max(args.procs, 256 * 16):
        a, b = models[gk].tree(n)["latency_us"], models[gk].tree(n * 16)["latency_us"]
        steps.append({"from": n, "to": n * 16, "added_us": round(b - a, 1)})
        n *= 16
    at = models[gk].tree(args.procs)["latency_us"]
    growth = {"fanout": gk, "per_16x": steps,
              "root_per_rank_share": round(float(cal["member_us"]) * args.procs / at, 4)}
    best = min(at_n, key=lambda r: r["latency_us"])
    out = {
        "procs": args.procs,
        "calibration": cal,
        "calibration_source": source,
        "fanouts": at_n,
        "fastest_fanout": best["fanout"],
        "star_us": round(models[fanouts[0]].star(args.procs), 1),
        "curve": curve,
        "growth": growth,
        "validation": validation,
        "log16_procs": round(math.log(args.procs, 16), 2) if args.procs > 1 else 0,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"cast model for {args.procs} procs (calibration: {source})")
        print(f"{'fanout':>7} {'latency_us':>12} {'depth':>6} {'root_msgs':>10} {'node_msgs':>10}")
        for r in at_n:
            print(f"{r['fanout']:>7} {r['latency_us']:>12.1f} {r['depth']:>6} "
                  f"{r['root_msgs']:>10} {r['max_node_msgs']:>10}")
        print(f"star: {out['star_us']:.1f} us")
        for st in steps:
            print(f"fan-out {gk}: {st['from']} -> {st['to']} procs adds {st['added_us']:.1f} us")
        print(f"root's per-rank share at {args.procs} procs: "
              f"{100 * growth['root_per_rank_share']:.2f}%")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sim", help="models of podium at scale (podium sim cast ...)")
    sims = p.add_subparsers(dest="sim", metavar="MODEL", required=True)
    c = sims.add_parser("cast", help="call() latency and per-node load through the cast tree")
    c.add_argument("--procs", type=int, default=100_000, help="mesh size (default 100000)")
    c.add_argument("--fanouts", default="", help="comma-separated fan-outs (default 2..64)")
    c.add_argument("--bench", default="", help="a `podium bench cast --json` output to "
                   "calibrate from (default: run a short bench now)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(run=run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="podium")
    register(parser.add_subparsers(dest="command", required=True))
    a = parser.parse_args(sys.argv[1:])
    sys.exit(a.run(a))
