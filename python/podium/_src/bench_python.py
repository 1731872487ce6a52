"""`podium bench python [--json] [--iters N] [--rounds R] [--quick]`: the Python API benchmark.

One run measures, for podium and (when importable) Monarch (`monarch.actor`, PyPI
torchmonarch) and Ray, the same workloads:

- the round trip of `call_one` to an actor in another process (median, p99);
- pipelined calls per second to one actor (all `call_one` futures sent, then all gathered);
- the latency of `call` on a mesh of 8 actors, one per process (median, p99);
- the time from `spawn_procs` of 8 (and 32) procs to the first reply of all of them;

and, in the same run, two floors: a small pickled message and its pickled reply over a plain
Unix socketpair between two Python processes (os.fork; this is the benchmark's reference, not
how podium moves messages), once with blocking reads and once with both sides busy-polling
non-blocking reads (the lowest round trip the machine allows). Each framework runs in its own
child interpreter (`python -m podium._src.bench_python --worker NAME`), so that their runtimes
never share a process and a framework that hangs is cut off by a timeout. Monarch and Ray are
never dependencies of podium: a framework that is not importable is reported as unavailable.

Figures on a shared machine swing from run to run, so podium and the floors are measured in
`--rounds` alternating rounds (floors, then podium, then floors again...). The report gives
the median of the rounds' figures, their spread, and every round; the targets compare medians
of the same run, except the pipelined one, which must hold in every round (its minimum).
Monarch and Ray, when present, are measured once, after the first round.
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


def _recv_exact_spin(sock: socket.socket, n: int) -> bytes:
    """_recv_exact with a non-blocking read retried in a loop: the reader never sleeps."""
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf), socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        if not chunk:
            raise EOFError("peer closed")
        buf += chunk
    return bytes(buf)


def _recv_msg_spin(sock: socket.socket) -> Any:
    (n,) = _HEADER.unpack(_recv_exact_spin(sock, _HEADER.size))
    return pickle.loads(_recv_exact_spin(sock, n))


def measure_floor(iters: int, busy: bool = False) -> Dict[str, float]:
    """Median and p99 round trip of a pickled ((i,), {}) -> (True, i) exchange with a forked
    echo process over an AF_UNIX socketpair: the same Python work per message as a call.
    With busy=True both sides busy-poll non-blocking reads instead of sleeping in recv."""
    recv_msg = _recv_msg_spin if busy else _recv_msg
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
                    args, _kwargs = recv_msg(child)
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
            recv_msg(parent)
        samples = []
        for i in range(iters):
            t0 = time.perf_counter_ns()
            _send_msg(parent, ((i,), {}))
            ok, value = recv_msg(parent)
            samples.append(time.perf_counter_ns() - t0)
            assert ok and value == i
    finally:
        parent.close()
        os.waitpid(pid, 0)
    med, p99 = _median_p99_us(samples)
    key = "socketpair_pickle_busy_rtt" if busy else "socketpair_pickle_rtt"
    return {f"{key}_us": _round(med), f"{key}_p99_us": _round(p99)}


def _descendants_cpu_ns() -> Optional[int]:
    """CPU time (ns, /proc/PID/task/TID/schedstat) of every process below this one, i.e. the
    framework's procs (and its idle helpers); None where /proc does not tell."""
    def children(pid: int) -> List[int]:
        out: List[int] = []
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    out += [int(c) for c in f.read().split()]
        except OSError:
            pass
        return out

    total, stack, seen = 0, children(os.getpid()), set()
    if not os.path.exists(f"/proc/{os.getpid()}/task"):
        return None
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # it ended meanwhile
        stack += children(pid)
    return total


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
    procs_cpu0 = _descendants_cpu_ns()
    for i in range(n8):
        t0 = time.perf_counter_ns()
        mesh8.ping.call(i).get()
        samples.append(time.perf_counter_ns() - t0)
    procs_cpu1 = _descendants_cpu_ns()
    out["call_8_us"], out["call_8_p99_us"] = _median_p99_us(samples)
    if procs_cpu0 is not None and procs_cpu1 is not None:
        # The CPU the 8 procs spent per call (each unpickles, runs, pickles, answers), and
        # that CPU spread over every core: no schedule answers all 8 sooner on this machine.
        per_call_us = (procs_cpu1 - procs_cpu0) / n8 / 1e3
        out["call_8_procs_cpu_us"] = per_call_us
        out["call_8_cpu_bound_us"] = per_call_us / (os.cpu_count() or 1)
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


# The issue-17 targets, all comparisons within one run.
CALL_ONE_MAX_X_BUSY_FLOOR = 3.0
PIPELINED_MIN_PER_S = 60_000
CALL_8_MAX_X_CALL_ONE = 2.5
# Each framework's figures rounded to these digits (the rest to 2).
_DIGITS = {"pipelined_calls_per_s": 0, "pipelined_calls_per_s_min": 0,
           "spawn_8_first_reply_s": 3, "spawn_32_first_reply_s": 3}


def _rounded(figures: dict) -> dict:
    return {k: _round(v, _DIGITS.get(k, 2)) for k, v in figures.items()}


def _median_of(rounds: List[dict], key: str) -> Optional[float]:
    values = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(values) if values else None


def _spread(rounds: List[dict], keys: List[str]) -> dict:
    """{key: [min, max]} over the rounds, for the figures whose spread the report shows."""
    out = {}
    for key in keys:
        values = [r[key] for r in rounds if r.get(key) is not None]
        if values:
            out[key] = [_round(min(values), _DIGITS.get(key, 2)),
                        _round(max(values), _DIGITS.get(key, 2))]
    return out


def _floors(iters: int) -> dict:
    floor = measure_floor(iters)
    floor.update(measure_floor(iters, busy=True))
    return floor


def run(iters: int, pipelined: int, quick: bool, frameworks: List[str], rounds: int = 5) -> dict:
    started = time.perf_counter()
    report: dict = {
        "benchmark": "python",
        "iters": iters,
        "pipelined_calls": pipelined,
        "rounds": rounds,
        "quick": quick,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                 "machine": platform.machine()},
    }
    # podium and the floors, alternating; each round's podium figures from a fresh child.
    floor_rounds: List[dict] = []
    podium_rounds: List[dict] = []
    podium_error: Optional[str] = None
    want_podium = "podium" in frameworks
    podium_reason = _unavailable_reason("podium") if want_podium else "not requested (--only)"
    peers_done = False
    for r in range(rounds):
        floor_rounds.append(_floors(iters))
        if podium_reason is None and podium_error is None:
            figures, podium_error = _measure_framework("podium", iters, pipelined, quick)
            if figures is not None:
                podium_rounds.append(figures)
        if not peers_done:
            peers_done = True
            for name in ("monarch", "ray"):
                _measure_peer(report, name, frameworks, iters, pipelined, quick)

    floor_keys = list(floor_rounds[0])
    report["floor"] = {k: _round(_median_of(floor_rounds, k)) for k in floor_keys}
    report["floor_spread"] = _spread(floor_rounds, floor_keys)
    busy_floor_us = report["floor"]["socketpair_pickle_busy_rtt_us"]
    floor_us = report["floor"]["socketpair_pickle_rtt_us"]

    if podium_reason is not None:
        report["podium"] = None
        report["podium_unavailable"] = podium_reason
    elif not podium_rounds:
        report["podium"] = None
        report["podium_error"] = podium_error
    else:
        keys = list(podium_rounds[0])
        pod = {k: _median_of(podium_rounds, k) for k in keys}
        pod["call_one_vs_floor"] = pod["call_one_rtt_us"] / floor_us
        pod["call_one_vs_busy_floor"] = pod["call_one_rtt_us"] / busy_floor_us
        pod["call_8_vs_call_one"] = pod["call_8_us"] / pod["call_one_rtt_us"]
        if pod.get("call_8_cpu_bound_us") is not None:
            # The lowest call_8_vs_call_one this machine allows: the procs' CPU over the cores.
            pod["call_8_vs_call_one_cpu_bound"] = pod["call_8_cpu_bound_us"] / pod["call_one_rtt_us"]
        pod["pipelined_calls_per_s_min"] = min(r["pipelined_calls_per_s"] for r in podium_rounds)
        report["podium"] = _rounded(pod)
        report["podium_spread"] = _spread(
            podium_rounds, ["call_one_rtt_us", "pipelined_calls_per_s", "call_8_us"])
        report["podium_rounds"] = [
            dict(_rounded(p), floor_us=f["socketpair_pickle_rtt_us"],
                 busy_floor_us=f["socketpair_pickle_busy_rtt_us"])
            for p, f in zip(podium_rounds, floor_rounds)]
        if podium_error is not None:
            report["podium_error"] = f"after {len(podium_rounds)} rounds: {podium_error}"

    ratios: dict = {}
    pod = report.get("podium")
    if pod:
        ratios["podium_call_one_vs_floor"] = pod["call_one_vs_floor"]
        ratios["podium_call_one_vs_busy_floor"] = pod["call_one_vs_busy_floor"]
        ratios["podium_call_8_vs_call_one"] = pod["call_8_vs_call_one"]
        for other in ("monarch", "ray"):
            if report.get(other):
                ratios[f"podium_call_one_vs_{other}"] = _round(
                    pod["call_one_rtt_us"] / report[other]["call_one_rtt_us"], 3)
        targets = {
            "call_one_le_3x_busy_floor": pod["call_one_vs_busy_floor"] <= CALL_ONE_MAX_X_BUSY_FLOOR,
            "pipelined_ge_60k_every_round": pod["pipelined_calls_per_s_min"] >= PIPELINED_MIN_PER_S,
            "call_8_le_2_5x_call_one": pod["call_8_vs_call_one"] <= CALL_8_MAX_X_CALL_ONE,
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


def _measure_peer(report: dict, name: str, frameworks: List[str], iters: int, pipelined: int,
                  quick: bool) -> None:
    """Monarch's or Ray's figures (once per run), or why they were not measured."""
    if name not in frameworks:
        report[name] = None
        report[f"{name}_unavailable"] = "not requested (--only)"
        return
    reason = _unavailable_reason(name)
    if reason is not None:
        report[name] = None
        report[f"{name}_unavailable"] = reason
        return
    figures, error = _measure_framework(name, iters, pipelined, quick)
    if figures is None:
        report[name] = None
        report[f"{name}_error"] = error
        return
    report[name] = _rounded(figures)


def _print_text(report: dict) -> None:
    f = report["floor"]
    print(f"podium bench python: {report['iters']} round trips, {report['pipelined_calls']} "
          f"pipelined calls, {report['rounds']} rounds (medians shown), "
          f"{report['host']['cpus']} cpus, Python {report['host']['python']}")
    print(f"  floor, pickled ping-pong over a socketpair, blocking reads: "
          f"{f['socketpair_pickle_rtt_us']} us median, {f['socketpair_pickle_rtt_p99_us']} us p99")
    print(f"  floor, the same with both sides busy-polling: "
          f"{f['socketpair_pickle_busy_rtt_us']} us median, "
          f"{f['socketpair_pickle_busy_rtt_p99_us']} us p99")
    for name in _FRAMEWORKS:
        figures = report.get(name)
        if figures is None:
            why = report.get(f"{name}_unavailable") or report.get(f"{name}_error")
            print(f"  {name}: not measured ({why})")
            continue
        print(f"  {name}:")
        for key, value in figures.items():
            print(f"    {key}: {value}")
        if name == "podium":
            for key, (lo, hi) in report.get("podium_spread", {}).items():
                print(f"    {key} over the rounds: {lo} .. {hi}")
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
    p.add_argument("--rounds", type=int, default=5,
                   help="alternating rounds of the floors and podium (medians reported)")
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
    if args.rounds < 1:
        print("podium bench python: --rounds must be >= 1", file=sys.stderr)
        return 2
    if args.worker:
        return _run_worker(args.worker, args.iters, pipelined, args.quick)
    report = run(args.iters, pipelined, args.quick, list(args.only or _FRAMEWORKS), args.rounds)
    if args.json:
        print(json.dumps(report))
    else:
        _print_text(report)
    podium_failed = report.get("podium") is None and "podium_error" in report
    return 1 if podium_failed else 0


if __name__ == "__main__":
    sys.exit(main())
