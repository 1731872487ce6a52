"""`podium bench rdma-net [--max-mib 1024] [--reps 3] [--json]` (as root): podium.rdma between
two hosts, each a network namespace of this machine, with raw TCP socket throughput between
the same two namespaces, measured in the same run, as the floor (docs/data.md, "Across
hosts").

The benchmark makes two namespaces, each with a veth link to a bridge in the root namespace on
a free 10.77.X.0/24 (the controller, this process, is .1 on the bridge; host A is .2, host B
.3), and deletes them at the end. It starts a `podium worker` in each namespace and attaches
them over TCP with a fresh secret: an actor on host A owns one buffer per size, an actor on
host B reads it (``read_into``) and writes it (``write_from``). podium's own TCP path moves the
bytes between the veth addresses (RD-6: the namespaces are different hosts for the data
plane; DA-45..DA-50: the owner's TCP bulk server), and, in the same rounds unless
``--no-ucx``, UCX over its tcp transport, the path it replaced (``_data.set_tcp_path(False)``
in the reader; DA-21: UCX restricted to each proc's veth; DA-22: 1 MiB TCP segments).

The floor: a TCP server in host A sends N bytes on request over one connection to a client in
host B (kernel-autotuned socket buffers, TCP_NODELAY, send and receive calls of up to 4 MiB):
`podium-tcp-pump` (cpp/tools/tcp_pump.cc, plain sockets), or where it is not built the same
protocol in Python sockets.

Timed runs, as `podium bench rdma` times its figures (``bench_measure.best_per_call``): per
size, ``--reps`` rounds each time, for the floor and for each kind of transfer, one single
request (request to last byte: ``single_us`` in the report), then a run of as many requests
one after the other as take at least ``--run-ms`` (5) ms at the fastest pace that kind
reached yet, its single requests and earlier runs (one where a request takes longer, so from
a few MiB up a run is the single request; ``calls`` in the report, per round). A figure is
the time per request of the best run. A request of tens of microseconds timed alone measures
how quickly a VM's CPU comes back from idle as much as the request (a 4 KiB request of the
pump, timed alone after 5 ms pauses: a median of 140 us; one after the other: 14 to 33 us),
and the pump's few instructions come back from it quicker than a transfer through Python;
runs put the figure and its floor under the same conditions. Within a round the floor,
podium's read and write, and (unless ``--no-ucx``) UCX's read and write take turns, so all
see the same machine load.

CPU per request: around each timed run the benchmark reads the CPU time of every thread of the
requesting process (the pump's client, the reader's proc) and of the serving one (the pump's
server, the owner's proc) from ``/proc/PID/task/*/schedstat``; ``cpu_us`` in the report is
that time over the run's requests, of the best run. On a machine whose cores are all taken
(two namespace hosts on two cores), CPU per request is what a transfer costs the other side's
throughput, and it says where podium's time goes next to the floor's: the pump's client is
one blocking ``recv`` loop, the reader a Python call, a future and a non-blocking socket.
(The kernel's network work runs partly in softirq context on whichever thread sent the packet,
so a side's figure includes some of the other side's receiving.)

Sizes: 4 KiB, then x4, up to ``--max-mib``. Progress goes to stderr; ``--json`` prints one
JSON object. A benchmark, not a test: it asserts nothing about the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import textwrap
import time
from typing import Any, Dict, List, Optional

import podium.actor as pa
from podium._core import data as _data
from podium._core import mesh as _mesh
from podium._src import find_binary, netns
from podium._src.bench_measure import calls_per_run
from podium.rdma import RDMABuffer

_TIMEOUT_S = 300.0
_RUN_MS = 5.0  # the shortest timed run (the module's docstring), as bench rdma's
_PUMP_PORT = 7100


_SERVER = textwrap.dedent("""
    import socket, struct, sys
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2])))
    s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = memoryview(bytearray(int(sys.argv[3])))
    step = 4 << 20
    while True:
        head = c.recv(8, socket.MSG_WAITALL)
        if len(head) < 8:
            break
        n = struct.unpack("<Q", head)[0]
        for off in range(0, n, step):
            c.sendall(data[off:min(n, off + step)])
    """)

_CLIENT = textwrap.dedent("""
    import socket, struct, sys, time
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = memoryview(bytearray(int(sys.argv[3])))
    step = 4 << 20
    print("ready", flush=True)
    for line in sys.stdin:  # "N K": K requests of N bytes; the seconds per request
        n, k = (int(x) for x in (line.split() + ["1"])[:2])
        t0 = time.perf_counter()
        for _ in range(k):
            c.sendall(struct.pack("<Q", n))
            got = 0
            while got < n:
                r = c.recv_into(buf[got:min(n, got + step)])
                if r == 0:
                    raise SystemExit("the server closed the connection")
                got += r
        print((time.perf_counter() - t0) / k, flush=True)
    """)


class _Pump:
    """The floor: a TCP server in host A sends N bytes on request over one connection to a
    client in host B, which times requests one after the other, request to last byte
    received."""

    def __init__(self, net: netns.Network, max_bytes: int) -> None:
        # podium-tcp-pump (cpp/tools/tcp_pump.cc) where built; else the same protocol in
        # Python, whose sendall/recv_into are one system call per 4 MiB.
        binary = find_binary("podium-tcp-pump")
        where = [net.hosts[0].addr, str(_PUMP_PORT), str(max_bytes)]
        if binary is not None:
            self.kind = "c++ (podium-tcp-pump)"
            serve, fetch = [str(binary), "serve", *where], [str(binary), "fetch", *where]
        else:
            self.kind = "python sockets"
            serve = [sys.executable, "-c", _SERVER, *where]
            fetch = [sys.executable, "-c", _CLIENT, *where]
        self.client: Optional[subprocess.Popen] = None
        self.server = subprocess.Popen(net.wrap(0, serve), stdout=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, text=True)
        try:
            if self.server.stdout.readline().strip() != "ready":
                raise RuntimeError("the TCP pump's server did not start")
            self.client = subprocess.Popen(net.wrap(1, fetch), stdout=subprocess.PIPE,
                                           stdin=subprocess.PIPE, text=True)
            if self.client.stdout.readline().strip() != "ready":
                raise RuntimeError("the TCP pump's client did not connect")
        except BaseException:
            self.close()
            raise

    def seconds(self, n: int, calls: int = 1) -> float:
        """Seconds per request of ``calls`` requests of ``n`` bytes, one after the other."""
        self.client.stdin.write(f"{n} {calls}\n")
        self.client.stdin.flush()
        line = self.client.stdout.readline()
        if not line:
            raise RuntimeError("the TCP pump's client ended")
        return float(line)

    def close(self) -> None:
        for p in (self.client, self.server):
            if p is not None:
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=30)


class NetOwner(pa.Actor):
    def __init__(self) -> None:
        self.mem: Dict[int, bytearray] = {}

    @pa.endpoint
    def where(self) -> List[str]:
        _data.available()
        return [_mesh.this_proc_id(), _data.net_devices()]

    @pa.endpoint
    def pid(self) -> int:
        return os.getpid()

    @pa.endpoint
    def make(self, n: int) -> RDMABuffer:
        self.mem[n] = bytearray(n)
        return RDMABuffer(memoryview(self.mem[n]))

    @pa.endpoint
    def free(self, n: int) -> None:
        self.mem.pop(n, None)


class NetReader(pa.Actor):
    @pa.endpoint
    def where(self) -> List[str]:
        _data.available()
        return [_mesh.this_proc_id(), _data.net_devices()]

    @pa.endpoint
    def pid(self) -> int:
        return os.getpid()

    @pa.endpoint
    def prepare(self, n: int) -> None:
        self.mem = memoryview(bytearray(n))

    @pa.endpoint
    def path(self, tcp: bool) -> Dict[str, Any]:
        """podium's TCP path (DA-49) for this proc's transfers, or UCX's."""
        _data.set_tcp_path(tcp)
        return _data.tcp_stats()

    @pa.endpoint
    def read(self, buf: RDMABuffer, calls: int) -> float:
        """Seconds per read of ``calls`` reads of ``buf``, one after the other."""
        mem = self.mem
        t0 = time.perf_counter()
        for _ in range(calls):
            buf.read_into(mem, timeout=_TIMEOUT_S).get(timeout=_TIMEOUT_S)
        return (time.perf_counter() - t0) / calls

    @pa.endpoint
    def write(self, buf: RDMABuffer, calls: int) -> float:
        """Seconds per write of ``calls`` writes into ``buf``, one after the other."""
        src = self.mem[:buf.size()]
        t0 = time.perf_counter()
        for _ in range(calls):
            buf.write_from(src, timeout=_TIMEOUT_S).get(timeout=_TIMEOUT_S)
        return (time.perf_counter() - t0) / calls


def _gbps(n: int, s: float) -> float:
    return n / s / 1e9 if s > 0 else 0.0


def _sig(x: float) -> float:
    """``x`` to 4 significant digits: a slow small transfer (a few MB/s) stays above 0."""
    return float(f"{x:.4g}")


def _sizes(max_mib: int) -> List[int]:
    sizes, n = [], 4096
    while n <= max_mib << 20:
        sizes.append(n)
        n *= 4
    return sizes


_KINDS = ("tcp", "read", "write", "ucx_read", "ucx_write")


def _cpu_ns(pid: int) -> int:
    """CPU time (ns) of every thread of process ``pid`` so far (threads that ended are not
    counted: the procs' and the pump's threads live as long as the benchmark)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that just ended
            pass
    return total


def _measure(net: netns.Network, sizes: List[int], reps: int, ucx: bool,
             run_s: float) -> Dict[str, Any]:
    """Per size and kind (the floor, podium's read and write, and with ``ucx`` UCX's): the
    best of ``reps`` single requests, and the time per request of the best of ``reps`` timed
    runs (the module's docstring), the kinds taking turns in each round."""
    pa.enable_transport(f"tcp://{net.controller_addr}:0")
    hosts = pa.attach_to_workers(workers=[f"tcp://{h.addr}:{netns.PORT}" for h in net.hosts])
    hosts.initialized.get(timeout=60)
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    owner = procs.spawn("rdma_net_owner", NetOwner).slice(hosts=0)
    reader = procs.spawn("rdma_net_reader", NetReader).slice(hosts=1)
    where = {"owner": owner.where.call_one().get(timeout=_TIMEOUT_S),
             "reader": reader.where.call_one().get(timeout=_TIMEOUT_S)}
    pump = _Pump(net, max(sizes))
    rows: Dict[int, Dict[str, Any]] = {}
    kinds = _KINDS if ucx else _KINDS[:3]
    try:
        # (requesting, serving) process of each kind, for CPU per request
        pids = {"tcp": (pump.client.pid, pump.server.pid)}
        podium_pids = (reader.pid.call_one().get(timeout=_TIMEOUT_S),
                       owner.pid.call_one().get(timeout=_TIMEOUT_S))
        for kind in _KINDS[1:]:
            pids[kind] = podium_pids
        # One untimed read and write first: UCX's endpoint between the two hosts is wired up
        # on first use (tens of ms here), a cost per peer, not per transfer. The pump's first
        # request is untimed too: its first took milliseconds (the processes' first run over
        # the connection), which would leave its timed run at 4 KiB one single request.
        pump.seconds(4096)
        warm = owner.make.call_one(4096).get(timeout=_TIMEOUT_S)
        reader.prepare.call_one(4096).get(timeout=_TIMEOUT_S)
        for tcp in ([True, False] if ucx else [True]):
            reader.path.call_one(tcp).get(timeout=_TIMEOUT_S)
            reader.read.call_one(warm, 1).get(timeout=_TIMEOUT_S)
            reader.write.call_one(warm, 1).get(timeout=_TIMEOUT_S)
        reader.path.call_one(True).get(timeout=_TIMEOUT_S)
        warm.drop().get(timeout=_TIMEOUT_S)
        owner.free.call_one(4096).get(timeout=_TIMEOUT_S)
        for n in sizes:
            buf = owner.make.call_one(n).get(timeout=_TIMEOUT_S)
            reader.prepare.call_one(n).get(timeout=_TIMEOUT_S)

            def time_of(kind: str, calls: int) -> float:
                if kind == "tcp":
                    return pump.seconds(n, calls)
                ep = reader.read if kind.endswith("read") else reader.write
                return ep.call_one(buf, calls).get(timeout=_TIMEOUT_S)

            def timed_run(kind: str, calls: int) -> "tuple[float, List[float]]":
                """Seconds per request, and CPU µs per request of each side."""
                before = [_cpu_ns(p) for p in pids[kind]]
                t = time_of(kind, calls)
                after = [_cpu_ns(p) for p in pids[kind]]
                return t, [(b - a) / 1e3 / calls for a, b in zip(before, after)]

            single = {k: float("inf") for k in kinds}
            run = {k: float("inf") for k in kinds}
            cpu: Dict[str, List[float]] = {}  # of the best run, per request
            calls: Dict[str, List[int]] = {k: [] for k in kinds}  # per round
            pace: Dict[str, float] = {}  # seconds per request, the fastest seen yet
            for _ in range(reps):
                for kind in kinds:
                    if kind == "ucx_read":
                        reader.path.call_one(False).get(timeout=_TIMEOUT_S)
                    one = time_of(kind, 1)
                    single[kind] = min(single[kind], one)
                    pace[kind] = min(pace.get(kind, one), one)
                    n_calls = calls_per_run(pace[kind], run_s)
                    if n_calls == 1:
                        timed, used = one, None
                    else:
                        timed, used = timed_run(kind, n_calls)
                    calls[kind].append(n_calls)
                    if used is not None and (timed < run[kind] or kind not in cpu):
                        cpu[kind] = used
                    run[kind] = min(run[kind], timed)
                    # A first request that came cold makes a short run: the next round's run
                    # is sized at the pace this one reached.
                    pace[kind] = min(pace[kind], timed)
                    if kind == "ucx_write":
                        reader.path.call_one(True).get(timeout=_TIMEOUT_S)
            buf.drop().get(timeout=_TIMEOUT_S)
            owner.free.call_one(n).get(timeout=_TIMEOUT_S)
            reader.prepare.call_one(0).get(timeout=_TIMEOUT_S)
            rows[n] = {"single": single, "run": run, "calls": calls, "cpu": cpu}
            print(f"  {n >> 10:>8} KiB: tcp {_gbps(n, run['tcp']):6.2f} GB/s, read "
                  f"{_gbps(n, run['read']):6.2f} GB/s, write {_gbps(n, run['write']):6.2f} GB/s"
                  + (f"; over UCX read {_gbps(n, run['ucx_read']):6.2f}, write "
                     f"{_gbps(n, run['ucx_write']):6.2f}" if ucx else "")
                  + f" (runs of {calls['tcp'][-1]} / {calls['read'][-1]} / "
                    f"{calls['write'][-1]} requests)"
                  + "".join(f"; CPU/request {k} {c[0]:.1f}+{c[1]:.1f} us"
                            for k, c in cpu.items() if k in ("tcp", "read")),
                  file=sys.stderr, flush=True)
        stats = reader.path.call_one(True).get(timeout=_TIMEOUT_S)
    finally:
        pump.close()
    procs.stop().get(timeout=_TIMEOUT_S)
    return {"rows": rows, "where": where, "ucx": _data.ucx_version(), "pump": pump.kind,
            "reader_tcp": stats}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="podium bench rdma-net", description=__doc__.split("\n")[0])
    ap.add_argument("--max-mib", type=int, default=1024, help="largest size, MiB (1024)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per size; best kept (3)")
    ap.add_argument("--run-ms", type=float, default=_RUN_MS,
                    help=f"the shortest timed run, ms ({_RUN_MS:g})")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--no-ucx", dest="ucx", action="store_false",
                    help="only podium's TCP path, not UCX's beside it")
    args = ap.parse_args(argv)
    reason = netns.unavailable_reason()
    if reason is not None:
        print(f"podium bench rdma-net: {reason}", file=sys.stderr)
        return 2
    sizes = _sizes(args.max_mib)
    # One secret for this controller and both workers (SE-1 would make the controller's
    # only once its runtime starts, after the workers).
    os.environ.setdefault("PODIUM_SECRET", secrets.token_hex(32))
    if args.ucx:  # DA-51: UCX keeps its tcp transport beside podium's TCP path, to compare
        os.environ["PODIUM_RDMA_UCX_TCP"] = "1"
    net = netns.Network(2)
    workers: List[subprocess.Popen] = []
    try:
        print(f"hosts A {net.hosts[0].addr}, B {net.hosts[1].addr} (namespaces "
              f"{net.hosts[0].netns}, {net.hosts[1].netns})", file=sys.stderr, flush=True)
        workers = netns.start_workers(net, timeout_s=60)
        got = _measure(net, sizes, args.reps, args.ucx, args.run_ms / 1e3)
    finally:
        netns.stop_workers(workers)
        net.close()
    rows = []
    for n in sizes:
        got_n = got["rows"][n]
        run, single = got_n["run"], got_n["single"]
        tcp = _gbps(n, run["tcp"])
        row = {"bytes": n, "read_gbps": _sig(_gbps(n, run["read"])),
               "write_gbps": _sig(_gbps(n, run["write"])), "tcp_gbps": _sig(tcp),
               "read_vs_tcp": _sig(_gbps(n, run["read"]) / tcp) if tcp else None,
               "write_vs_tcp": _sig(_gbps(n, run["write"]) / tcp) if tcp else None}
        if args.ucx:
            row.update({"ucx_read_gbps": _sig(_gbps(n, run["ucx_read"])),
                        "ucx_write_gbps": _sig(_gbps(n, run["ucx_write"]))})
        # Requests per timed run, per round, and the best single request of each kind (µs).
        row["calls"] = got_n["calls"]
        row["single_us"] = {k: _sig(v * 1e6) for k, v in single.items()}
        # CPU µs per request of the best timed run: [requesting side, serving side]
        row["cpu_us"] = {k: [_sig(c) for c in v] for k, v in got_n["cpu"].items()}
        rows.append(row)
    report = {"benchmark": "rdma-net", "ucx": got["ucx"], "reps": args.reps,
              "owner": got["where"]["owner"], "reader": got["where"]["reader"],
              "tls": os.environ.get("UCX_TLS", "UCX's default"),
              "lease_ms": _data.lease_config()[0],  # 0: every transfer checked (DA-28)
              "floor": "raw TCP, one connection, host A to host B, interleaved with the "
                       "transfers", "pump": got["pump"],
              "timing": f"time per request of the best of reps timed runs of at least "
                        f"{args.run_ms:g} ms (single_us: the best single request)",
              "run_ms": args.run_ms,
              "cpu": "cpu_us: CPU microseconds per request of the best timed run, "
                     "[requesting process, serving process] (pump client/server, reader/owner "
                     "proc), every thread",
              "path": "podium's TCP path (DA-49)" + (", and UCX's beside it" if args.ucx else ""),
              "reader_tcp": got["reader_tcp"], "sizes": rows}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{'size':>10} {'read GB/s':>10} {'write GB/s':>11} {'TCP GB/s':>9} "
              f"{'read/TCP':>9} {'write/TCP':>10}"
              + (f" {'UCX read':>9} {'UCX write':>10}" if args.ucx else ""))
        for r in rows:
            print(f"{r['bytes'] >> 10:>6} KiB {r['read_gbps']:>10.2f} {r['write_gbps']:>11.2f} "
                  f"{r['tcp_gbps']:>9.2f} {r['read_vs_tcp']:>9.2f} {r['write_vs_tcp']:>10.2f}"
                  + (f" {r['ucx_read_gbps']:>9.2f} {r['ucx_write_gbps']:>10.2f}"
                     if args.ucx else ""))
        print("CPU µs per request (requesting + serving process, every thread):")
        for r in rows:
            print(f"{r['bytes'] >> 10:>6} KiB  " + "  ".join(
                f"{k} {c[0]:.1f} + {c[1]:.1f}" for k, c in r["cpu_us"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
