"""`podium bench python [--json] [--iters N] [--quick]`: the Python API benchmark.

One run measures, for podium and (when importable) Monarch (`monarch.actor`, PyPI
torchmonarch) and Ray, the same workloads:

- the round trip of `call_one` to an actor in another process (median, p99);
- pipelined calls per second to one actor (all `call_one` futures sent, then all gathered);
- the latency of `call` on a mesh of 8 actors, one per process (median, p99);
- the time from `spawn_procs` of 8 (and 32) procs to the first reply of all of them;

and, in the same run, the floor: a small pickled message and its pickled reply over a plain
Unix socketpair between two Python processes (os.fork; this is the benchmark's reference, not
how podium moves messages). Each framework runs in its own child interpreter
(`python -m podium._src.bench_python --worker NAME`), so that their runtimes never share a
process and a framework that hangs is cut off by a timeout. Monarch and Ray are never
dependencies of podium: a framework that is not importable is reported as unavailable.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import pickle
import platform
import socket
import statistics
import struct
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

_RESULT_MARK = "@@podium-bench-python@@ "
_HEADER = struct.Struct("<I")
_FRAMEWORKS = ("podium", "monarch", "ray")
_MODULES = {"podium": "podium.actor", "monarch": "monarch.actor", "ray": "ray"}
# Bound on one framework's child interpreter (the whole run stays well under it on podium).
_WORKER_TIMEOUT_S = 120.0


# --- statistics ----------------------------------------------------------------------------


def _median_p99_us(samples_ns: List[int]) -> tuple[float, float]:
    ordered = sorted(samples_ns)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return statistics.median(ordered) / 1e3, p99 / 1e3


def _round(x: Optional[float], digits: int = 2) -> Optional[float]:
    return None if x is None else round(x, digits)


# --- the floor: pickled ping-pong over a socketpair ----------------------------------------


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("peer closed")
        buf += chunk
    return bytes(buf)


def _send_msg(sock: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=5)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_msg(sock: socket.socket) -> Any:
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return pickle.loads(_recv_exact(sock, n))


def measure_floor(iters: int) -> Dict[str, float]:
    """Median and p99 round trip of a pickled ((i,), {}) -> (True, i) exchange with a forked
    echo process over an AF_UNIX socketpair: the same Python work per message as a call."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the echo process
        code = 0
        try:
            parent.close()
            while True:
                try:
                    args, _kwargs = _recv_msg(child)
                except EOFError:
                    break
                _send_msg(child, (True, args[0]))
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    child.close()
    try:
        for i in range(max(iters // 10, 10)):
            _send_msg(parent, ((i,), {}))
            _recv_msg(parent)
        samples = []
        for i in range(iters):
            t0 = time.perf_counter_ns()
            _send_msg(parent, ((i,), {}))
            ok, value = _recv_msg(parent)
            samples.append(time.perf_counter_ns() - t0)
            assert ok and value == i
    finally:
        parent.close()
        os.waitpid(pid, 0)
    med, p99 = _median_p99_us(samples)
    return {"socketpair_pickle_rtt_us": _round(med), "socketpair_pickle_rtt_p99_us": _round(p99)}


# --- workloads through the Monarch-style actor API (podium.actor, monarch.actor) -----------


def _actor_api_workloads(module_name: str, iters: int, pipelined: int, quick: bool) -> dict:
    mod = importlib.import_module(module_name)

    # Defined here so that it derives from this framework's Actor; cloudpickle sends it by
    # value, so the procs need not import this module.
    class Echo(mod.Actor):
        @mod.endpoint
        def ping(self, x):
            return x

    host = mod.this_host()
    out: dict = {}

    # One proc and its actor; this also starts the framework's runtime, which the spawn
    # figures below then do not include.
    procs1 = host.spawn_procs(per_host={"gpus": 1})
    echo = procs1.spawn("echo", Echo)
    echo.ping.call_one(0).get()
    for i in range(max(iters // 10, 10)):
        echo.ping.call_one(i).get()
    samples = []
    for i in range(iters):
        t0 = time.perf_counter_ns()
        echo.ping.call_one(i).get()
        samples.append(time.perf_counter_ns() - t0)
    out["call_one_rtt_us"], out["call_one_rtt_p99_us"] = _median_p99_us(samples)

    t0 = time.perf_counter()
    futures = [echo.ping.call_one(i) for i in range(pipelined)]
    for i, f in enumerate(futures):
        if f.get() != i:
            raise AssertionError("pipelined reply out of order")
    out["pipelined_calls_per_s"] = pipelined / (time.perf_counter() - t0)
    procs1.stop().get()

    def spawn_and_answer(n: int):
        t0 = time.perf_counter()
        procs = host.spawn_procs(per_host={"gpus": n})
        mesh = procs.spawn("echo", Echo)
        values = mesh.ping.call(1).get()
        elapsed = time.perf_counter() - t0
        if len(list(values.values())) != n:
            raise AssertionError(f"expected {n} replies")
        return elapsed, procs, mesh

    out["spawn_8_first_reply_s"], procs8, mesh8 = spawn_and_answer(8)
    n8 = max(iters // 4, 20)
    for i in range(max(n8 // 10, 5)):
        mesh8.ping.call(i).get()
    samples = []
    for i in range(n8):
        t0 = time.perf_counter_ns()
        mesh8.ping.call(i).get()
        samples.append(time.perf_counter_ns() - t0)
    out["call_8_us"], out["call_8_p99_us"] = _median_p99_us(samples)
    procs8.stop().get()

    if quick:
        out["spawn_32_first_reply_s"] = None
    else:
        out["spawn_32_first_reply_s"], procs32, _ = spawn_and_answer(32)
        procs32.stop().get()
    return out


def _ray_workloads(iters: int, pipelined: int, quick: bool) -> dict:
    import ray

    ray.init(num_cpus=64, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:

        @ray.remote
        class Echo:
            def ping(self, x):
                return x

        out: dict = {}
        echo = Echo.remote()
        ray.get(echo.ping.remote(0))
        for i in range(max(iters // 10, 10)):
            ray.get(echo.ping.remote(i))
        samples = []
        for i in range(iters):
            t0 = time.perf_counter_ns()
            ray.get(echo.ping.remote(i))
            samples.append(time.perf_counter_ns() - t0)
        out["call_one_rtt_us"], out["call_one_rtt_p99_us"] = _median_p99_us(samples)

        t0 = time.perf_counter()
        values = ray.get([echo.ping.remote(i) for i in range(pipelined)])
        out["pipelined_calls_per_s"] = pipelined / (time.perf_counter() - t0)
        if values != list(range(pipelined)):
            raise AssertionError("pipelined reply out of order")
        ray.kill(echo)

        def spawn_and_answer(n: int):
            t0 = time.perf_counter()
            actors = [Echo.remote() for _ in range(n)]
            ray.get([a.ping.remote(1) for a in actors])
            return time.perf_counter() - t0, actors

        out["spawn_8_first_reply_s"], actors8 = spawn_and_answer(8)
        n8 = max(iters // 4, 20)
        samples = []
        for i in range(n8):
            t0 = time.perf_counter_ns()
            ray.get([a.ping.remote(i) for a in actors8])
            samples.append(time.perf_counter_ns() - t0)
        out["call_8_us"], out["call_8_p99_us"] = _median_p99_us(samples)
        for a in actors8:
            ray.kill(a)
        if quick:
            out["spawn_32_first_reply_s"] = None
        else:
            out["spawn_32_first_reply_s"], actors32 = spawn_and_answer(32)
            for a in actors32:
                ray.kill(a)
        return out
    finally:
        ray.shutdown()


def _run_worker(name: str, iters: int, pipelined: int, quick: bool) -> int:
    if name == "ray":
        result = _ray_workloads(iters, pipelined, quick)
    else:
        result = _actor_api_workloads(_MODULES[name], iters, pipelined, quick)
    sys.stdout.write(_RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    # Leave without the frameworks' exit hooks: the procs are stopped already, and the run's
    # figures are out.
    os._exit(0)


# --- the parent: floor, then one child interpreter per framework ---------------------------


def _unavailable_reason(name: str) -> Optional[str]:
    module = _MODULES[name]
    try:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return f"{module} is not importable (not installed)"
    except (ImportError, ValueError) as e:
        return f"{module} is not importable: {e}"
    return None


def _measure_framework(name: str, iters: int, pipelined: int, quick: bool) -> tuple[Optional[dict], Optional[str]]:
    cmd = [sys.executable, "-m", "podium._src.bench_python", "--worker", name,
           "--iters", str(iters), "--pipelined", str(pipelined)]
    if quick:
        cmd.append("--quick")
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=_WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {_WORKER_TIMEOUT_S:.0f} s"
    for line in reversed(r.stdout.splitlines()):
        if line.startswith(_RESULT_MARK):
            return json.loads(line[len(_RESULT_MARK):]), None
    tail = (r.stderr or r.stdout).strip().splitlines()[-5:]
    return None, f"exit code {r.returncode}: " + " | ".join(tail)


def run(iters: int, pipelined: int, quick: bool, frameworks: List[str]) -> dict:
    started = time.perf_counter()
    floor = measure_floor(iters)
    report: dict = {
        "benchmark": "python",
        "iters": iters,
        "pipelined_calls": pipelined,
        "quick": quick,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                 "machine": platform.machine()},
        "floor": floor,
    }
    floor_us = floor["socketpair_pickle_rtt_us"]
    for name in _FRAMEWORKS:
        if name not in frameworks:
            report[name] = None
            report[f"{name}_unavailable"] = "not requested (--only)"
            continue
        reason = _unavailable_reason(name)
        if reason is not None:
            report[name] = None
            report[f"{name}_unavailable"] = reason
            continue
        figures, error = _measure_framework(name, iters, pipelined, quick)
        if figures is None:
            report[name] = None
            report[f"{name}_error"] = error
            continue
        figures["call_one_vs_floor"] = figures["call_one_rtt_us"] / floor_us
        digits = {"pipelined_calls_per_s": 0, "spawn_8_first_reply_s": 3,
                  "spawn_32_first_reply_s": 3}
        report[name] = {k: _round(v, digits.get(k, 2)) for k, v in figures.items()}

    ratios: dict = {}
    pod = report.get("podium")
    if pod:
        ratios["podium_call_one_vs_floor"] = pod["call_one_vs_floor"]
        for other in ("monarch", "ray"):
            if report.get(other):
                ratios[f"podium_call_one_vs_{other}"] = _round(
                    pod["call_one_rtt_us"] / report[other]["call_one_rtt_us"], 3)
        targets = {
            "call_one_le_3x_floor": pod["call_one_vs_floor"] <= 3,
            "pipelined_ge_50k_per_s": pod["pipelined_calls_per_s"] >= 50_000,
            "spawn_8_le_1s": pod["spawn_8_first_reply_s"] <= 1.0,
        }
        if pod["spawn_32_first_reply_s"] is not None:
            targets["spawn_32_le_3s"] = pod["spawn_32_first_reply_s"] <= 3.0
        if "podium_call_one_vs_monarch" in ratios:
            targets["call_one_le_third_of_monarch"] = ratios["podium_call_one_vs_monarch"] <= 1 / 3
        if "podium_call_one_vs_ray" in ratios:
            targets["call_one_le_tenth_of_ray"] = ratios["podium_call_one_vs_ray"] <= 0.1
        report["targets_met"] = targets
    report["ratios"] = ratios
    report["wall_s"] = _round(time.perf_counter() - started, 2)
    return report


def _print_text(report: dict) -> None:
    f = report["floor"]
    print(f"podium bench python: {report['iters']} round trips, {report['pipelined_calls']} "
          f"pipelined calls, {report['host']['cpus']} cpus, Python {report['host']['python']}")
    print(f"  floor (pickled ping-pong over a socketpair): "
          f"{f['socketpair_pickle_rtt_us']} us median, {f['socketpair_pickle_rtt_p99_us']} us p99")
    for name in _FRAMEWORKS:
        figures = report.get(name)
        if figures is None:
            why = report.get(f"{name}_unavailable") or report.get(f"{name}_error")
            print(f"  {name}: not measured ({why})")
            continue
        print(f"  {name}:")
        for key, value in figures.items():
            print(f"    {key}: {value}")
    for key, value in report.get("ratios", {}).items():
        print(f"  {key}: {value}")
    for key, value in report.get("targets_met", {}).items():
        print(f"  target {key}: {'met' if value else 'NOT met'}")
    print(f"  wall: {report['wall_s']} s")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="podium bench python",
                                description="Benchmark of the Python actor API against a "
                                "socketpair floor, Monarch and Ray (when importable).")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--iters", type=int, default=2000,
                   help="timed round trips per latency figure (call on 8: iters/4)")
    p.add_argument("--pipelined", type=int, default=None,
                   help="calls in the pipelined figure (default 10 x iters, at most 20000)")
    p.add_argument("--quick", action="store_true", help="skip the 32-proc spawn")
    p.add_argument("--only", action="append", choices=_FRAMEWORKS,
                   help="measure only this framework (repeatable)")
    p.add_argument("--worker", choices=_FRAMEWORKS, help=argparse.SUPPRESS)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.iters < 1:
        print("podium bench python: --iters must be >= 1", file=sys.stderr)
        return 2
    pipelined = args.pipelined if args.pipelined is not None else min(10 * args.iters, 20_000)
    if pipelined < 1:
        print("podium bench python: --pipelined must be >= 1", file=sys.stderr)
        return 2
    if args.worker:
        return _run_worker(args.worker, args.iters, pipelined, args.quick)
    report = run(args.iters, pipelined, args.quick, list(args.only or _FRAMEWORKS))
    if args.json:
        print(json.dumps(report))
    else:
        _print_text(report)
    podium_failed = report.get("podium") is None and "podium_error" in report
    return 1 if podium_failed else 0


if __name__ == "__main__":
    sys.exit(main())
