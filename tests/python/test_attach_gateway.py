"""attach(addr), as Monarch's: a client attaches through a worker's address, which doubles as
its gateway (channel GW-1..GW-4). The client dials that one address and listens nowhere; its
traffic to every proc goes through the gateway worker, which routes the procs' traffic back
over the connection the client opened. Every worker is a real `python -m podium worker`;
every controller a script of its own (attach must come before the client starts)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import CHILD_TIMEOUT_S, Worker, gone_within

PRELUDE = textwrap.dedent("""
    import os, sys, time
    import podium.actor
    from podium.actor import (Actor, endpoint, attach, attach_to_workers, SupervisionError,
                              this_proc)
    from podium._core import mesh as _mesh

    class Who(Actor):
        @endpoint
        def pid(self):
            return os.getpid()

        @endpoint
        def die(self):
            os._exit(3)

    WORKERS = sys.argv[1:]

    def my_sockets(state):
        # (local, remote) addresses of this process's TCP sockets in `state` (0A: listening,
        # 01: established), from /proc/net/tcp{,6} and the socket inodes of /proc/self/fd.
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        out = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in open(table).read().splitlines()[1:]:
                f = line.split()
                if f[3] == state and f[9] in inodes:
                    out.append((int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16)))
        return out
    """)


def controller(tmp_path: Path, body: str, workers: list[str], env: dict | None = None,
               name: str = "controller.py") -> subprocess.CompletedProcess:
    script = tmp_path / name
    script.write_text(PRELUDE + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script), *workers], capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})


# GW-1..GW-3: attach, then attach_to_workers; procs on two workers answer, a proc's death
# reaches the client as a supervision event, and the client listens on no TCP port and is
# connected to the gateway's port only: everything went through the gateway.
def test_a_client_attached_through_a_gateway_is_served_and_listens_nowhere(tmp_path):
    gw, other = Worker(), Worker()
    try:
        r = controller(tmp_path, """
            hits = []
            podium.actor.unhandled_fault_hook = lambda failure: hits.append(failure)
            attach(WORKERS[0])
            attach(WORKERS[0])  # the same address again: nothing
            try:
                attach(WORKERS[1])
                print("attached twice?!")
            except RuntimeError as e:
                print("OTHER:", e, flush=True)
            print("ME", _mesh.this_proc_id(), flush=True)
            hosts = attach_to_workers(workers=WORKERS)
            assert hosts.initialized.get(timeout=60) is True
            am = hosts.spawn_procs(per_host={"gpus": 2}).spawn("who", Who)
            pids = sorted(am.pid.call().get(timeout=60).values())
            print("PIDS", *pids, flush=True)
            # this_host() still names this machine: its procs listen on Unix sockets for
            # this client and reach it (and TCP) through the gateway too.
            local = podium.actor.this_host().spawn_procs(per_host={"p": 1}).spawn("who", Who)
            print("LOCAL", local.pid.call_one().get(timeout=60), flush=True)
            print("LISTENING", my_sockets("0A"), flush=True)
            print("PEERS", sorted(remote for _, remote in my_sockets("01")), flush=True)
            try:
                am.slice(hosts=1, gpus=0).die.call_one().get(timeout=60)
                print("answered?!")
            except SupervisionError as e:
                print("DIED:", str(e).splitlines()[0], flush=True)
            deadline = time.monotonic() + 20  # the hook runs on a thread of its own
            while not hits and time.monotonic() < deadline:
                time.sleep(0.01)
            print("HOOK", len(hits), flush=True)
            hosts.shutdown().get(timeout=60)
            """, [gw.address, other.address])
    finally:
        gw.kill()
        other.kill()
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert re.search(r"OTHER: client is already attached through tcp://127\.0\.0\.1:\d+, "
                     r"not tcp://127\.0\.0\.1:\d+; detaching is not supported", r.stdout), out
    # Its identity is the gateway's address with an incarnation: procs send to the gateway.
    assert re.search(rf"^ME tcp:127\.0\.0\.1:{gw.port}/[0-9a-f]+$", r.stdout, re.M), out
    pids = [int(p) for p in re.search(r"^PIDS (.*)$", r.stdout, re.M).group(1).split()]
    assert len(pids) == 4, out
    assert re.search(r"^LOCAL \d+$", r.stdout, re.M), out
    assert "LISTENING []" in r.stdout, out
    # Two connections, both to the gateway's port: the duplex and the link (GW-1, GW-3).
    assert f"PEERS [{gw.port}, {gw.port}]" in r.stdout, out
    assert "DIED:" in r.stdout and "HOOK 0" not in r.stdout, out
    assert gone_within(pids) == [], out


# Monarch's order: attach before the client starts; a client started locally refuses it.
def test_attach_after_the_client_started_raises(tmp_path):
    r = controller(tmp_path, """
        this_proc()  # starts the client, locally
        try:
            attach("tcp://127.0.0.1:1")
            print("attached?!")
        except RuntimeError as e:
            print("LATE:", e, flush=True)
        """, [])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert ("LATE: client was initialized without a remote attachment; call attach(addr) "
            "before the first context()/this_host()/this_proc()") in r.stdout, out


# An address where no gateway answers fails the attach, naming it and why, within the attach
# timeout; the client can try again.
def test_attach_to_no_gateway_fails_naming_it(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    r = controller(tmp_path, f"""
        for _ in range(2):
            try:
                attach("tcp://127.0.0.1:{port}")
                print("attached?!")
            except Exception as e:
                print("FAILED:", type(e).__name__, e, flush=True)
        """, [], env={"PODIUM_ATTACH_TIMEOUT_MS": "1000"})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    failed = re.findall(rf"FAILED: \w+ .*attach failed: the gateway at tcp://127\.0\.0\.1:{port} "
                        r"did not open a duplex within 1000 ms: .*refused", r.stdout)
    assert len(failed) == 2, out


# A gateway that dies fails the meshes on it with a SupervisionError, not a hang; the meshes
# on the other worker too (the client reached them through it), and that worker, whose
# controller went silent, ends their procs (HA-5): nothing is left behind.
def test_a_dead_gateway_fails_the_meshes_on_it(tmp_path):
    gw, other = Worker(), Worker()
    script = tmp_path / "controller.py"
    script.write_text(PRELUDE + textwrap.dedent("""
        hits = []
        podium.actor.unhandled_fault_hook = lambda failure: hits.append(failure)
        attach(WORKERS[0])
        hosts = attach_to_workers(workers=WORKERS)
        am = hosts.spawn_procs(per_host={"gpus": 1}).spawn("who", Who)
        print("KILL", *[am.slice(hosts=h).pid.call_one().get(timeout=60) for h in (0, 1)],
              flush=True)  # the gateway's proc first
        sys.stdin.readline()
        for h in (0, 1):
            try:
                am.slice(hosts=h).pid.call().get(timeout=30)
                print("answered?!")
            except SupervisionError as e:
                print("LOST", h, str(e).splitlines()[0], flush=True)
        """))
    c = subprocess.Popen([sys.executable, str(script), gw.address, other.address],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PODIUM_HOST_LOST_MS": "1500"})
    try:
        line = c.stdout.readline().split()
        assert line[:1] == ["KILL"], line + [c.stderr.read() if c.poll() is not None else ""]
        gw_proc, other_proc = int(line[1]), int(line[2])
        gw.kill()
        assert gone_within([gw_proc]) == []
        c.stdin.write("\n")
        c.stdin.flush()
        out, err = c.communicate(timeout=CHILD_TIMEOUT_S)
        assert gone_within([other_proc], timeout=20) == [], "the far worker ends its proc"
    finally:
        c.kill()
        gw.kill()
        other.kill()
    assert c.returncode == 0, out + err
    assert "LOST 0" in out and "LOST 1" in out, out + err


class PortForward:
    """A TCP forwarder on loopback, as `kubectl port-forward` is: connections to `port` are
    piped to `target_port`; drop() cuts every connection it carries."""

    def __init__(self, target_port: int) -> None:
        import threading

        self.target = target_port
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        self.accepted = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                a, _ = self.server.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                a.close()
                continue
            with self.lock:
                if self.closed:
                    a.close()
                    b.close()
                    return
                self.conns += [a, b]
                self.accepted += 1
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drop(self) -> None:
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        with self.lock:
            self.closed = True
        self.server.close()
        self.drop()


# Monarch's Kubernetes case: the client reaches the gateway only through a port-forward (its
# own name for it, "localhost"), and names the other workers as the cluster does. The
# gateway's procs listen on the gateway's own address, not on the client's name for it. When
# the forward drops every connection, the client re-dials its duplex and its links, and the
# procs still answer (GW-1, GW-2).
def test_a_client_behind_a_port_forward_survives_dropped_connections(tmp_path):
    gw, other = Worker(), Worker()
    fwd = PortForward(gw.port)
    script = tmp_path / "controller.py"
    script.write_text(PRELUDE + textwrap.dedent("""
        FORWARD, WORKER = WORKERS

        class Where(Actor):
            @endpoint
            def addr(self):
                return _mesh.this_proc_id()

        attach(FORWARD)
        hosts = attach_to_workers(workers=[FORWARD, WORKER])
        print("WHERE", hosts.spawn_procs(per_host={"p": 1}).spawn("where", Where).slice(
            hosts=0).addr.call_one().get(timeout=60), flush=True)
        am = hosts.spawn_procs(per_host={"gpus": 1}).spawn("who", Who)
        print("ROUND1", len(am.pid.call().get(timeout=60)), flush=True)
        sys.stdin.readline()
        for i in range(20):  # across the drop and the re-dials
            assert len(am.pid.call().get(timeout=60)) == 2
        print("ROUND2", len(am.pid.call().get(timeout=60)), flush=True)
        print("PEERS", sorted({remote for _, remote in my_sockets("01")}), flush=True)
        """))
    c = subprocess.Popen([sys.executable, str(script), f"tcp://localhost:{fwd.port}",
                          other.address], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        where = c.stdout.readline()
        assert re.fullmatch(r"WHERE tcp:127\.0\.0\.1:\d+/[0-9a-f]+\n", where), where + (
            c.stderr.read() if c.poll() is not None else "")
        line = c.stdout.readline()
        assert line.split() == ["ROUND1", "2"], line + (c.stderr.read() if c.poll() else "")
        before = fwd.accepted
        fwd.drop()
        c.stdin.write("\n")
        c.stdin.flush()
        out, err = c.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        c.kill()
        fwd.close()
        gw.kill()
        other.kill()
    assert c.returncode == 0, out + err
    assert "ROUND2 2" in out, out + err
    assert fwd.accepted > before, "the client re-dialled through the forward"
    assert f"PEERS [{fwd.port}]" in out, out + err  # the forward is all it reaches


# A client that the procs really cannot reach, and that cannot reach them: three network
# namespaces, and no packet passes between the client's and the far worker's (a blackhole
# route each way). Through the gateway worker, the far host's procs still answer (GW-2, GW-3).
def test_a_client_the_procs_cannot_reach_is_served_through_its_gateway(tmp_path, network):
    import time

    net = network(3)
    client, gw, far = net.hosts
    for a, b in ((client, far), (far, client)):
        r = net.run(a, ["ip", "route", "add", "blackhole", f"{b.addr}/32"])
        assert r.returncode == 0, r.stderr
    workers = []
    try:
        for h in (gw, far):
            workers.append(net.popen(h, [sys.executable, "-m", "podium", "worker", "--listen",
                                         f"tcp://{h.addr}:7000"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True))
        for h, w in zip((gw, far), workers):
            deadline, line = time.monotonic() + 30, ""
            while time.monotonic() < deadline and not line.startswith("podium worker listening"):
                line = w.stdout.readline()
                if not line:
                    break
            assert line.strip() == f"podium worker listening on tcp://{h.addr}:7000", line
        script = tmp_path / "controller.py"
        script.write_text(PRELUDE + textwrap.dedent("""
            import socket
            GW, FAR = WORKERS
            try:
                socket.create_connection((FAR.split("//")[1].split(":")[0], 7000), timeout=2)
                print("reached the far host?!")
            except OSError as e:
                print("UNREACHABLE", type(e).__name__, flush=True)
            attach(GW)
            hosts = attach_to_workers(workers=[GW, FAR])
            assert hosts.initialized.get(timeout=60) is True

            class Where(Actor):
                @endpoint
                def addr(self):
                    return _mesh.this_proc_id()

            got = hosts.spawn_procs(per_host={"gpus": 2}).spawn("where", Where).addr.call()
            print("WHERE", *sorted(got.get(timeout=60).values()), flush=True)
            print("LISTENING", my_sockets("0A"), flush=True)
            hosts.shutdown().get(timeout=60)
            """))
        r = net.run(client, [sys.executable, str(script), f"tcp://{gw.addr}:7000",
                             f"tcp://{far.addr}:7000"], timeout=CHILD_TIMEOUT_S, env=os.environ)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "UNREACHABLE" in r.stdout, out
        where = re.search(r"^WHERE (.*)$", r.stdout, re.M).group(1).split()
        assert sorted(a.split(":")[1] for a in where) == [gw.addr] * 2 + [far.addr] * 2, out
        assert "LISTENING []" in r.stdout, out
    finally:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, 9)
            w.wait(timeout=10)
