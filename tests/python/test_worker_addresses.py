"""Worker addresses besides tcp://HOST:PORT, as Monarch's workers take them (CH-24):
ipc://PATH (a Unix socket), DIAL@BIND (listen on BIND, controllers dial DIAL), tcp://HOST:fdN
(an inherited listening socket); and an attach to an address where nothing listens fails at
once with "attach failed" and why (HA-17). Every worker is a real `python -m podium worker`;
every controller a script of its own (it chooses its transport before podium starts)."""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import CHILD_TIMEOUT_S, Worker, gone_within

PRELUDE = textwrap.dedent("""
    import os, sys
    from podium.actor import Actor, endpoint, attach_to_workers, enable_transport

    class Who(Actor):
        @endpoint
        def pid(self):
            return os.getpid()

    WORKERS = sys.argv[1:]

    def spawn_and_shut_down(hosts):
        assert hosts.initialized.get(timeout=60) is True
        pids = hosts.spawn_procs(per_host={"gpus": 2}).spawn("who", Who).pid.call()
        print("PIDS", *sorted(pids.get(timeout=60).values()), flush=True)
        hosts.shutdown().get(timeout=60)
    """)


def controller(tmp_path: Path, body: str, workers: list[str],
               env: dict | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "controller.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script), *workers], capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})


def worker_argv(listen: str) -> list[str]:
    return [sys.executable, "-m", "podium", "worker", "--listen", listen]


def pids(out: str) -> list[int]:
    m = re.search(r"^PIDS (.*)$", out, re.M)
    assert m, out
    return [int(p) for p in m.group(1).split()]


def tcp_listeners() -> set[tuple[str, int]]:
    """(local address hex, port) of every listening TCP socket (/proc/net/tcp)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A":  # LISTEN
            addr, port = fields[1].split(":")
            out.add((addr, int(port, 16)))
    return out


# ipc://PATH: the worker listens on a Unix socket only its user may connect to (mode 0600,
# SO_PEERCRED: CH-16); a controller on this host attaches without TCP, and its procs run.
def test_an_ipc_worker_serves_a_controller_over_a_unix_socket(tmp_path):
    path = tmp_path / "worker.sock"
    w = Worker(argv=worker_argv(f"ipc://{path}"))
    try:
        assert w.address == f"ipc://{path}", w.text()
        assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
        # No enable_transport: this controller listens on a Unix socket, as its procs there do.
        r = controller(tmp_path, "spawn_and_shut_down(attach_to_workers(workers=WORKERS))\n",
                       [w.address])
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        procs = pids(r.stdout)
        assert len(procs) == 2 and gone_within(procs) == [], out
        assert w.proc.wait(timeout=30) == 0, w.text()  # shut down: it ends (HA-16)
        assert not path.exists(), "the worker removes its socket file"
    finally:
        w.kill()


# DIAL@BIND: the worker binds every interface and announces the name controllers dial.
def test_an_alias_address_binds_one_address_and_is_dialled_at_another(tmp_path):
    w = Worker(argv=worker_argv("tcp://127.0.0.1:0@tcp://0.0.0.0:0"))
    try:
        m = re.fullmatch(r"tcp://127\.0\.0\.1:(\d+)", w.address)
        assert m, w.text()
        port = int(m.group(1))
        assert ("00000000", port) in tcp_listeners(), "bound to 0.0.0.0, the BIND side"
        r = controller(tmp_path, """
            enable_transport("tcp://127.0.0.1:0")
            spawn_and_shut_down(attach_to_workers(workers=WORKERS))
            """, [f"tcp://127.0.0.1:{port}@tcp://0.0.0.0:{port}"])  # dials DIAL
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert gone_within(pids(r.stdout)) == [], out
    finally:
        w.kill()


# tcp://HOST:fdN: the worker serves on the listening socket it inherited as descriptor N.
def test_a_worker_adopts_an_inherited_listening_socket(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    port = s.getsockname()[1]
    fd = os.dup(s.fileno())  # a free descriptor: the child inherits it as the same number
    try:
        p = subprocess.Popen(worker_argv(f"tcp://127.0.0.1:fd{fd}"), pass_fds=(fd,),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        os.close(fd)
        s.close()  # the worker holds the only listening socket now
    try:
        line = p.stdout.readline()
        assert line.strip() == f"podium worker listening on tcp://127.0.0.1:{port}", \
            line + (p.stdout.read() if p.poll() is not None else "")
        r = controller(tmp_path, """
            enable_transport("tcp://127.0.0.1:0")
            spawn_and_shut_down(attach_to_workers(workers=WORKERS))
            """, [f"tcp://127.0.0.1:{port}"])
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert gone_within(pids(r.stdout)) == [], out
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait(timeout=10)


# HA-17: nothing listens there: the attach fails at once, not at the (long) attach timeout.
def test_an_unreachable_address_fails_the_attach_naming_why(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    refused = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    missing = f"ipc://{tmp_path / 'nobody.sock'}"
    try:
        r = controller(tmp_path, """
            enable_transport("tcp://127.0.0.1:0")
            for w in WORKERS:
                try:
                    attach_to_workers(workers=[w]).initialized.get(timeout=60)
                    print("attached?!")
                except Exception as e:
                    print(f"FAILED {type(e).__name__}: {e}", flush=True)
            """, [refused, missing], env={"PODIUM_ATTACH_TIMEOUT_MS": "600000"})
    finally:
        s.close()
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    lines = re.findall(r"^FAILED (.*)$", r.stdout, re.M)
    assert len(lines) == 2, out
    assert re.match(r"SupervisionError: cannot attach host 0 \(tcp:127\.0\.0\.1:\d+\): "
                    r"attach failed: Connection refused", lines[0]), lines[0]
    assert re.match(r"SupervisionError: cannot attach host 0 \(unix:.*nobody\.sock\): attach "
                    r"failed: No such file or directory", lines[1]), lines[1]


# CH-24: a malformed address is refused naming it, by the worker and by attach_to_workers.
def test_malformed_worker_addresses_are_refused_naming_them(tmp_path):
    for listen in ("udp://0.0.0.0:1", "tcp://127.0.0.1:fdx", "ipc:///tmp/x.sock@tcp://h:fd3"):
        r = subprocess.run(worker_argv(listen), capture_output=True, text=True,
                           timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        assert r.returncode == 1 and f"worker address '{listen}'" in r.stderr, r.stderr
    r = controller(tmp_path, """
        for w in WORKERS:
            try:
                attach_to_workers(workers=[w])
                print("attached?!")
            except ValueError as e:
                print("REFUSED", e, flush=True)
        """, ["tcp://127.0.0.1:fd3", "smtp://h:25"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "REFUSED worker address 'tcp://127.0.0.1:fd3': a descriptor (fdN) is for " \
           "serving" in r.stdout, r.stdout
    assert "REFUSED worker address 'smtp://h:25': unknown scheme 'smtp://'" in r.stdout, \
        r.stdout
