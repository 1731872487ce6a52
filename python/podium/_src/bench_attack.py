"""`podium bench attack [--calls N] [--liars N] [--half-open N] [--json]`: a worker under attack.

Measures what a flood of hostile connections costs a worker (docs/security.md), in one run,
against the same workload on a worker nobody attacks:

- **baseline**: a worker (a `LocalJob` of one host, with the job's own secret, SE-4) on
  loopback; this controller attaches
  (timed), spawns one actor there and makes N calls, `call_one` pipelined 64 deep, each
  answer checked;
- **under attack**: a second worker, while an attacker process holds `--liars` connections
  that prove the job's secret (the worst case: an insider, or a stolen secret) and then send a
  frame prefix announcing a ~2 GiB header, and keeps `--half-open` connections open that
  never say anything (reopening each one the worker closes); then the same attach and the same
  N calls.

It prints, for both: the attach time, calls completed and lost, calls per second; for the
attacked worker, its RSS before and after and its peak (VmHWM); for the attacker, how many
connections it opened and how many the worker closed. Targets (issue 16): with 100 liars and
2,000 half-open connections, 10,000 calls complete, 0 lost, the worker's RSS grows by less than
64 MiB, and the attach takes under 1 s. A benchmark, not a test: no figure here is asserted.

The attacker runs in a process of its own (`python -m podium._src.bench_attack --attacker`),
so it does not share this process's interpreter lock with the calls it competes with.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import resource
import selectors
import socket
import struct
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from podium._src.bench_workers import job_secret, start_local_worker
from podium.actor import Actor, attach_to_workers, enable_transport, endpoint

_BOUND_S = 120.0  # every wait of this benchmark ends within this
_WINDOW = 64  # calls in flight
# A Data frame's prefix (docs/wire.md): magic, version 1, kind 3, flags 0, no parts, and a
# header length just under the default 2 GiB frame limit.
LIAR_PREFIX = b"PDM\x01\x03\x00" + struct.pack("<HI", 0, 0x7FF00000)


# --- the attacker (a process of its own) ---------------------------------------------------


def _prove(sock: socket.socket, secret: bytes) -> bool:
    """The dialler's side of the job's secret exchange (docs/channel.md, CH-8)."""
    challenge = _recv_exact(sock, 37)
    if len(challenge) != 37 or challenge[:5] != b"PDMA\x01":
        return False
    nonce_s, nonce_c = challenge[5:], os.urandom(32)
    mac = hmac.new(secret, b"podium-auth-1 dialler" + nonce_s + nonce_c, hashlib.sha256)
    sock.sendall(nonce_c + mac.digest())
    verdict = _recv_exact(sock, 33)
    return len(verdict) == 33 and verdict[0] == 1


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        try:
            chunk = sock.recv(n - len(out))
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out


def attacker_main(port: int, liars: int, half_open: int, duration: float) -> int:
    """Holds `liars` liar connections and `half_open` silent ones to 127.0.0.1:`port` until
    stdin closes or `duration` passes; reopens what the worker closes. Prints one JSON line
    of counts once every connection was opened once ("ready"), and one at the end."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, liars + half_open + 256)),
                                                hard))
    secret = job_secret()
    sel = selectors.DefaultSelector()
    counts = {"opened": 0, "closed_by_worker": 0, "liars_authenticated": 0,
              "liars_refused": 0, "connect_failed": 0}

    def open_one(kind: str) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            counts["connect_failed"] += 1
            return
        counts["opened"] += 1
        if kind == "liar":
            s.settimeout(5)
            if not _prove(s, secret):
                counts["liars_refused"] += 1
                s.close()
                return
            counts["liars_authenticated"] += 1
            try:
                s.sendall(LIAR_PREFIX)
            except OSError:
                pass
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, kind)

    for _ in range(liars):
        open_one("liar")
    for _ in range(half_open):
        open_one("half-open")
    print(json.dumps({"ready": True, **counts}), flush=True)
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    deadline = time.monotonic() + duration
    done = False
    while not done and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.2):
            if key.data == "stdin":
                if not sys.stdin.readline():
                    done = True
                continue
            s = key.fileobj
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                continue  # a challenge or a verdict: read and ignored
            sel.unregister(s)
            s.close()
            counts["closed_by_worker"] += 1
            open_one(key.data)  # keep the pressure on
    print(json.dumps({"ready": False, **counts}), flush=True)
    return 0


# --- the controller side ----------------------------------------------------------------------


def _status(pid: int) -> Dict[str, int]:
    """VmRSS and VmHWM of `pid`, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _attach_and_call(address: str, calls: int, tag: str) -> Dict[str, Any]:
    class Echo(Actor):
        @endpoint
        def echo(self, x: int) -> int:
            return x

    t = time.monotonic()
    hosts = attach_to_workers(workers=[address], name=f"attack-{tag}")
    hosts.initialized.get(timeout=_BOUND_S)
    attach_s = time.monotonic() - t
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    echo = procs.spawn("echo", Echo)
    echo.echo.call_one(-1).get(timeout=_BOUND_S)
    lost: List[str] = []
    done = 0
    t = time.monotonic()
    pending: List[Any] = []
    for i in range(calls):
        pending.append((i, echo.echo.call_one(i)))
        if len(pending) >= _WINDOW or i == calls - 1:
            for j, fut in pending:
                try:
                    got = fut.get(timeout=_BOUND_S)
                    if got == j:
                        done += 1
                    else:
                        lost.append(f"call {j} answered {got!r}")
                except Exception as e:  # counted and reported, the run goes on
                    lost.append(f"call {j}: {type(e).__name__}: {e}")
            pending.clear()
        if sys.stderr.isatty() and i % 1000 == 999:
            print(f"\r{tag}: {i + 1}/{calls} calls", end="", file=sys.stderr, flush=True)
    took = time.monotonic() - t
    if sys.stderr.isatty():
        print(file=sys.stderr)
    procs.stop().get(timeout=_BOUND_S)
    hosts.shutdown().get(timeout=_BOUND_S)
    return {"attach_s": round(attach_s, 4), "calls": calls, "completed": done,
            "lost": len(lost), "lost_first": lost[:3],
            "calls_per_s": round(done / took, 1) if took > 0 else None}


def run(calls: int, liars: int, half_open: int) -> Dict[str, Any]:
    enable_transport("tcp://127.0.0.1:0")
    jobs: List[Any] = []
    attacker: Optional[subprocess.Popen] = None
    try:
        job, address, _ = start_local_worker()
        jobs.append(job)
        baseline = _attach_and_call(address, calls, "baseline")
        job, address, pid = start_local_worker()
        jobs.append(job)
        port = int(address.rsplit(":", 1)[1])
        before = _status(pid)
        # The attacker reads the job's secret from its environment, as podium does.
        attacker = subprocess.Popen(
            [sys.executable, "-m", "podium._src.bench_attack", "--attacker", str(port),
             str(liars), str(half_open), str(_BOUND_S)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        ready = json.loads(attacker.stdout.readline() or "{}")
        attacked = _attach_and_call(address, calls, "under attack")
        after = _status(pid)
        attacker.stdin.close()
        final = json.loads(attacker.stdout.readline() or "{}")
        attacker.wait(timeout=30)
        attacked["worker_alive"] = os.path.exists(f"/proc/{pid}")
        return {
            "benchmark": "attack", "liars": liars, "half_open": half_open, "calls": calls,
            "baseline": baseline, "under_attack": attacked,
            "worker_rss_before_mib": round(before["VmRSS"] / 2**20, 1),
            "worker_rss_after_mib": round(after["VmRSS"] / 2**20, 1),
            "worker_rss_growth_mib": round((after["VmRSS"] - before["VmRSS"]) / 2**20, 1),
            "worker_rss_peak_mib": round(after["VmHWM"] / 2**20, 1),
            "attacker_ready": ready, "attacker_final": final,
        }
    finally:
        if attacker is not None and attacker.poll() is None:
            attacker.kill()
            attacker.wait(timeout=10)
        for job in jobs:
            job.kill()


def _print_table(r: Dict[str, Any]) -> None:
    b, a = r["baseline"], r["under_attack"]
    print(f"podium bench attack: {r['calls']} calls, {r['liars']} liars (authenticated, "
          f"announcing a ~2 GiB header), {r['half_open']} half-open connections")
    print(f"{'':24}{'baseline':>14}{'under attack':>16}")
    print(f"{'attach':24}{b['attach_s'] * 1e3:>11.1f} ms{a['attach_s'] * 1e3:>13.1f} ms")
    print(f"{'calls completed':24}{b['completed']:>14}{a['completed']:>16}")
    print(f"{'calls lost':24}{b['lost']:>14}{a['lost']:>16}")
    print(f"{'calls per second':24}{b['calls_per_s']:>14}{a['calls_per_s']:>16}")
    print(f"attacked worker RSS: {r['worker_rss_before_mib']} MiB before, "
          f"{r['worker_rss_after_mib']} MiB after (growth {r['worker_rss_growth_mib']} MiB, "
          f"peak {r['worker_rss_peak_mib']} MiB); alive: {a['worker_alive']}")
    f = r["attacker_final"]
    print(f"attacker: {f.get('opened')} connections opened, {f.get('closed_by_worker')} closed "
          f"by the worker, {f.get('liars_authenticated')} liar handshakes, "
          f"{f.get('connect_failed')} connects failed")
    for line in a["lost_first"]:
        print(f"  lost: {line}")


def main(argv: List[str]) -> int:
    if argv and argv[0] == "--attacker":
        port, liars, half_open, duration = argv[1:5]
        return attacker_main(int(port), int(liars), int(half_open), float(duration))
    p = argparse.ArgumentParser(prog="podium bench attack", description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--liars", type=int, default=100)
    p.add_argument("--half-open", type=int, default=2_000)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    r = run(args.calls, args.liars, args.half_open)
    if args.json:
        print(json.dumps(r))
    else:
        _print_table(r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
