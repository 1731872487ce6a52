"""The network-namespace helpers (podium/_src/netns.py): hosts reach each other and the
controller over TCP, a cut host is silent (a connect times out, nothing is refused, an open
connection neither fails nor delivers), restore heals it, and teardown leaves nothing."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time

import pytest

from podium._src import netns

# A TCP echo server: prints "ready" once listening, echoes one connection at a time.
ECHO = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    with c:
        while True:
            data = c.recv(4096)
            if not data:
                break
            c.sendall(data)
"""
PORT = 7700


@pytest.fixture
def net(network):
    """3 hosts, each running an echo server on PORT."""
    n = network(3)
    servers = []
    try:
        for h in n.hosts:
            p = n.popen(h, [sys.executable, "-c", ECHO, h.addr, str(PORT)],
                        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
            servers.append(p)
        for p in servers:
            assert p.stdout.readline().strip() == "ready"  # bounded by pytest's timeout
        yield n
    finally:
        for p in servers:
            p.kill()
            p.wait(timeout=10)


def _echo(addr: str, payload: bytes = b"ping", timeout: float = 5.0) -> bytes:
    with socket.create_connection((addr, PORT), timeout=timeout) as s:
        s.sendall(payload)
        return s.recv(4096)


# Runs _echo from inside a host.
ECHO_CLIENT = r"""
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
    s.sendall(b"from-host"); print(s.recv(100).decode())
"""


def test_controller_and_hosts_reach_each_other(net):
    for h in net.hosts:
        assert _echo(h.addr) == b"ping", h
    # host 0 -> host 2 across the bridge, and host 1 -> a server on the controller's address
    out = net.run(0, [sys.executable, "-c", ECHO_CLIENT, net.hosts[2].addr, str(PORT)])
    assert out.returncode == 0 and out.stdout.strip() == "from-host", out.stderr
    with socket.socket() as srv:
        srv.bind((net.controller_addr, 0))
        srv.listen(1)
        client = net.popen(1, [sys.executable, "-c",
                               "import socket,sys; socket.create_connection("
                               "(sys.argv[1], int(sys.argv[2])), timeout=5).sendall(b'hi')",
                               net.controller_addr, str(srv.getsockname()[1])])
        srv.settimeout(5)
        conn, peer = srv.accept()
        with conn:
            assert conn.recv(10) == b"hi" and peer[0] == net.hosts[1].addr
        assert client.wait(timeout=10) == 0


def test_cut_host_is_silent_and_restore_heals(net):
    cut, other = net.hosts[1], net.hosts[2]
    live = socket.create_connection((cut.addr, PORT), timeout=5)
    try:
        live.sendall(b"before")
        assert live.recv(100) == b"before"
        net.cut(cut)
        # A new connection times out: no RST (refused), no ICMP (unreachable).
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            socket.create_connection((cut.addr, PORT), timeout=2.0)
        assert time.monotonic() - t0 >= 1.9
        # The open connection: a send succeeds locally, nothing comes back, no error.
        live.sendall(b"during")
        live.settimeout(1.5)
        with pytest.raises(TimeoutError):
            live.recv(100)
        # From another host too.
        out = net.run(other, [sys.executable, "-c", ECHO_CLIENT, cut.addr, str(PORT)])
        assert out.returncode != 0 and "timed out" in out.stderr, out.stderr
        # The other hosts still answer.
        assert _echo(other.addr) == b"ping"
        net.restore(cut)
        # TCP retransmits what was sent during the cut: the open connection heals.
        live.settimeout(10)
        assert live.recv(100) == b"during"
        live.close()  # the echo server serves one connection at a time
        assert _echo(cut.addr) == b"ping"
    finally:
        live.close()


def test_close_removes_everything():
    reason = netns.unavailable_reason()
    if reason is not None:
        from conftest import skip_or_fail

        skip_or_fail(reason)
    n = netns.Network(2)
    names, bridge = [h.netns for h in n.hosts], n.bridge
    veths = [h.root_veth for h in n.hosts]
    assert set(names) <= set(netns._list_netns()) and netns._link_exists(bridge)
    rules = lambda: subprocess.run(["iptables", "-S"], capture_output=True, text=True,
                                   timeout=20).stdout
    if shutil.which("iptables"):
        assert rules().count(f"-i {bridge} ") == 2
    n.close()
    if shutil.which("iptables"):
        assert bridge not in rules()
    assert not set(names) & set(netns._list_netns())
    assert not any(netns._link_exists(d) for d in [bridge, *veths])
    n.close()  # idempotent


def test_two_networks_do_not_collide():
    reason = netns.unavailable_reason()
    if reason is not None:
        from conftest import skip_or_fail

        skip_or_fail(reason)
    with netns.Network(1) as a, netns.Network(1) as b:
        assert a.bridge != b.bridge and a.hosts[0].netns != b.hosts[0].netns
        assert not a.subnet.overlaps(b.subnet)


def test_remove_stale_deletes_what_a_dead_process_left():
    reason = netns.unavailable_reason()
    if reason is not None:
        from conftest import skip_or_fail

        skip_or_fail(reason)
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    stale_ns = f"podium-{dead.pid:x}00-h0"
    stale_br = f"pb{dead.pid:x}00"
    netns._ip("netns", "add", stale_ns)
    netns._ip("link", "add", stale_br, "type", "bridge")
    try:
        removed = netns.remove_stale()
        assert stale_ns in removed and stale_br in removed
        assert stale_ns not in netns._list_netns() and not netns._link_exists(stale_br)
    finally:
        netns._ip("netns", "del", stale_ns, check=False)
        netns._ip("link", "del", stale_br, check=False)
    # Live networks (this process's) are left alone.
    with netns.Network(1) as n:
        assert n.hosts[0].netns not in netns.remove_stale()
        assert n.hosts[0].netns in netns._list_netns()
