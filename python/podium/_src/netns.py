"""Hosts as network namespaces, for multi-host tests and benchmarks on one machine.

`Network(n)` creates n "hosts": each a network namespace with one veth link to a bridge in the
root namespace, on a private /24 (10.77.X.0/24, X picked free on this machine). The root
namespace (the controller) is `.controller_addr` (10.77.X.1) on the bridge; host i is
10.77.X.(i+2). Hosts reach each other and the controller through the bridge (layer 2, so no IP
forwarding is needed); nothing is routed beyond the subnet.

- `run(host, argv)` / `popen(host, argv)` run a command inside a host (`ip netns exec`).
- `cut(host)` silently drops all of the host's traffic, like a pulled cable: the root side of
  its veth goes down (frames to and from it are dropped, no RST, no ICMP), and every other
  party gets a permanent neighbour entry for it (and it for them), so no failed ARP turns
  the silence into "no route to host". A connect to a cut host times out. `restore(host)`
  undoes it.
- `close()` deletes everything created (namespaces, with their veths, the bridge, firewall
  rules), also after a failure half-way through creation; a `with` block calls it.

Names carry the creating process's pid (`podium-<pid hex><nonce>-h<i>`, bridge
`pb<pid hex><nonce>`), so parallel runs do not collide and `remove_stale()` can delete what a
killed run left behind (namespaces and bridges of pids that are gone).

Root's firewall: bridged traffic passes the FORWARD chain when br_netfilter is loaded, and
traffic to the controller passes INPUT. Where `iptables` exists, the network inserts ACCEPT
rules for its bridge and deletes them in close().

`start_workers(net)` starts a `podium worker` in every host, listening on its address and
`PORT`, and waits (bounded) until each says so; `stop_workers` kills them. Used by the
multi-host tests and by the benchmarks that need hosts (`podium bench rdma-net`,
`podium bench ft`'s lost host).
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

CMD_TIMEOUT_S = 20.0
_PREFIX = "podium-"
PORT = 7000  # the workers' port: every host is its own network stack, so the same on each
READY = "podium worker listening on "


class NetnsError(RuntimeError):
    pass


def unavailable_reason() -> Optional[str]:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network-namespace tests need root (ip netns, veth, bridge)"
    if shutil.which("ip") is None:
        return "network-namespace tests need `ip` (Debian's iproute2; `make setup` installs it)"
    return None


def _ip(*args: str, check: bool = True, netns: Optional[str] = None) -> subprocess.CompletedProcess:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=CMD_TIMEOUT_S,
                         stdin=subprocess.DEVNULL)
    if check and out.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed (status {out.returncode}): "
                         f"{out.stderr.strip()}")
    return out


@dataclass
class Host:
    index: int
    netns: str  # the namespace's name
    addr: str  # its IPv4 address on the bridge
    root_veth: str  # the veth end in the root namespace (on the bridge)
    mac: str = ""  # the MAC address of its interface (eth0 inside the namespace)
    cut: bool = False

    def __str__(self) -> str:
        return f"host{self.index}({self.addr})"


class Network:
    """n hosts on one bridge; see the module docstring."""

    def __init__(self, n_hosts: int, subnet: Optional[str] = None) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsError(reason)
        if not 1 <= n_hosts <= 200:
            raise ValueError(f"n_hosts must be in 1..200, got {n_hosts}")
        tag = f"{os.getpid():x}{random.randrange(256):02x}"
        self.bridge = f"pb{tag}"
        self._iptables: list[list[str]] = []
        self._netns: list[str] = []
        self._veths: list[str] = []
        self._bridge_made = False
        self.hosts: list[Host] = []
        try:
            self.subnet = ipaddress.ip_network(subnet) if subnet else _free_subnet()
            addrs = list(self.subnet.hosts())
            self.controller_addr = str(addrs[0])
            self._bridge_mac = self._make_bridge()
            for i in range(n_hosts):
                self.hosts.append(self._make_host(i, tag, str(addrs[i + 1])))
            self._open_firewall()
        except BaseException:
            self.close()
            raise

    # --- creation ---------------------------------------------------------------------------

    def _make_bridge(self) -> str:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._bridge_made = True
        _ip("addr", "add", f"{self.controller_addr}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return _mac(self.bridge)

    def _make_host(self, i: int, tag: str, addr: str) -> Host:
        ns = f"{_PREFIX}{tag}-h{i}"
        root_veth, ns_veth = f"pv{tag}{i}", f"pn{tag}{i}"
        _ip("netns", "add", ns)
        self._netns.append(ns)
        _ip("link", "add", root_veth, "type", "veth", "peer", "name", ns_veth)
        self._veths.append(root_veth)
        _ip("link", "set", ns_veth, "netns", ns)
        # Inside its namespace the host's interface is plainly eth0.
        _ip("link", "set", ns_veth, "name", "eth0", netns=ns)
        _ip("addr", "add", f"{addr}/{self.subnet.prefixlen}", "dev", "eth0", netns=ns)
        _ip("link", "set", "eth0", "up", netns=ns)
        _ip("link", "set", "lo", "up", netns=ns)
        _ip("link", "set", root_veth, "master", self.bridge)
        _ip("link", "set", root_veth, "up")
        host = Host(index=i, netns=ns, addr=addr, root_veth=root_veth)
        host.mac = _mac("eth0", netns=ns)
        return host

    def _open_firewall(self) -> None:
        if shutil.which("iptables") is None:
            return
        for rule in (["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"],
                     ["INPUT", "-i", self.bridge, "-j", "ACCEPT"]):
            out = subprocess.run(["iptables", "-I", *rule], capture_output=True, text=True,
                                 timeout=CMD_TIMEOUT_S, stdin=subprocess.DEVNULL)
            if out.returncode != 0:
                raise NetnsError(f"iptables -I {' '.join(rule)} failed: {out.stderr.strip()}")
            self._iptables.append(rule)

    # --- use --------------------------------------------------------------------------------

    def host(self, h: "int | Host") -> Host:
        return self.hosts[h] if isinstance(h, int) else h

    def wrap(self, h: "int | Host", argv: Sequence[str]) -> list[str]:
        """argv, run inside host h."""
        return ["ip", "netns", "exec", self.host(h).netns, *argv]

    def popen(self, h: "int | Host", argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Starts argv inside host h (Popen arguments as given; the caller reaps it)."""
        return subprocess.Popen(self.wrap(h, argv), **kwargs)

    def run(self, h: "int | Host", argv: Sequence[str], timeout: float = CMD_TIMEOUT_S,
            **kwargs) -> subprocess.CompletedProcess:
        """Runs argv inside host h to completion, bounded; captures its output as text."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(self.wrap(h, argv), timeout=timeout, **kwargs)

    def cut(self, h: "int | Host") -> None:
        """Silently drops every frame to and from host h (see the module docstring)."""
        host = self.host(h)
        # Pin every neighbour first, so that dropped ARP never produces an ICMP error.
        self._pin_neighbours(host, pin=True)
        _ip("link", "set", host.root_veth, "down")
        host.cut = True

    def restore(self, h: "int | Host") -> None:
        host = self.host(h)
        _ip("link", "set", host.root_veth, "up")
        self._pin_neighbours(host, pin=False)
        host.cut = False

    def _pin_neighbours(self, host: Host, pin: bool) -> None:
        others = [(o.netns, o.addr, o.mac) for o in self.hosts if o is not host]
        # (where the entry lives, about whom, its MAC): root and every other host about the
        # cut one; the cut one about root and every other host.
        entries = [(None, host.addr, host.mac, self.bridge)]
        entries += [(ns, host.addr, host.mac, "eth0") for ns, _, _ in others]
        entries += [(host.netns, self.controller_addr, self._bridge_mac, "eth0")]
        entries += [(host.netns, addr, mac, "eth0") for _, addr, mac in others]
        for netns, addr, mac, dev in entries:
            if pin:
                _ip("neigh", "replace", addr, "lladdr", mac, "dev", dev, "nud", "permanent",
                    netns=netns)
            else:
                _ip("neigh", "del", addr, "dev", dev, netns=netns, check=False)

    # --- teardown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Deletes everything this network created; idempotent, and it tries every step even
        when one fails (the first error is raised at the end)."""
        errors: list[str] = []
        for rule in reversed(self._iptables):
            out = subprocess.run(["iptables", "-D", *rule], capture_output=True, text=True,
                                 timeout=CMD_TIMEOUT_S, stdin=subprocess.DEVNULL)
            if out.returncode != 0:
                errors.append(f"iptables -D {' '.join(rule)}: {out.stderr.strip()}")
        self._iptables.clear()
        # Deleting one end of a veth deletes both, at once (a deleted namespace frees its
        # interfaces later, in the kernel's cleanup work).
        for dev in reversed(self._veths):
            out = _ip("link", "del", dev, check=False)
            if out.returncode != 0 and _link_exists(dev):
                errors.append(f"ip link del {dev}: {out.stderr.strip()}")
        self._veths.clear()
        for ns in reversed(self._netns):
            out = _ip("netns", "del", ns, check=False)
            if out.returncode != 0 and ns in _list_netns():
                errors.append(f"ip netns del {ns}: {out.stderr.strip()}")
        self._netns.clear()
        if self._bridge_made:
            out = _ip("link", "del", self.bridge, check=False)
            if out.returncode != 0 and _link_exists(self.bridge):
                errors.append(f"ip link del {self.bridge}: {out.stderr.strip()}")
            self._bridge_made = False
        if errors:
            raise NetnsError("network teardown incomplete: " + "; ".join(errors))

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- helpers ----------------------------------------------------------------------------------


def _mac(dev: str, netns: Optional[str] = None) -> str:
    out = _ip("-o", "link", "show", "dev", dev, netns=netns).stdout
    m = re.search(r"link/ether ([0-9a-f:]{17})", out)
    if not m:
        raise NetnsError(f"no MAC address for {dev}: {out.strip()}")
    return m.group(1)


def _list_netns() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_exists(dev: str) -> bool:
    return _ip("link", "show", "dev", dev, check=False).returncode == 0


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.77.X.0/24 that no address or route on this machine overlaps."""
    used = []
    for args in (("-4", "-o", "addr", "show"), ("-4", "route", "show", "table", "all")):
        for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", _ip(*args).stdout):
            used.append(ipaddress.ip_network(token, strict=False))
    candidates = list(range(256))
    random.shuffle(candidates)
    for x in candidates:
        net = ipaddress.ip_network(f"10.77.{x}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetnsError("no free 10.77.X.0/24 subnet on this machine")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def remove_stale() -> list[str]:
    """Deletes the namespaces and bridges that networks of processes now gone left behind
    (a test run killed by SIGKILL cannot clean up); returns their names."""
    removed = []
    for ns in _list_netns():
        m = re.fullmatch(rf"{_PREFIX}([0-9a-f]+)([0-9a-f]{{2}})-h\d+", ns)
        if m and not _pid_alive(int(m.group(1), 16)):
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        m = re.match(r"\d+: (pb([0-9a-f]+)([0-9a-f]{2}))[:@]", line)
        if m and not _pid_alive(int(m.group(2), 16)):
            _ip("link", "del", m.group(1), check=False)
            removed.append(m.group(1))
    return removed


def start_workers(net: Network, env: Optional[dict] = None, persistent: bool = False,
                  timeout_s: float = 30.0) -> list[subprocess.Popen]:
    """A `podium worker` in every host of ``net`` (``env`` added to this process's
    environment), each in its own session, once each has said it listens on
    tcp://<host>:PORT; the caller stops them with stop_workers()."""
    procs: list[subprocess.Popen] = []
    try:
        for h in net.hosts:
            procs.append(net.popen(h, [sys.executable, "-m", "podium", "worker", "--listen",
                                       f"tcp://{h.addr}:{PORT}"]
                                   + (["--persistent"] if persistent else []),
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, **(env or {})}, start_new_session=True))
        for h, p in zip(net.hosts, procs):
            deadline = time.monotonic() + timeout_s
            line = ""
            while time.monotonic() < deadline:
                line = p.stdout.readline()
                if not line or line.startswith(READY):
                    break
            if line.strip() != f"{READY}tcp://{h.addr}:{PORT}":
                raise NetnsError(f"the worker of {h} did not start: "
                                 f"{line.strip() or f'exit status {p.poll()}'}")
    except BaseException:
        stop_workers(procs)
        raise
    return procs


def stop_workers(procs: Sequence[subprocess.Popen]) -> None:
    """Kills each worker's whole session (its procs too) and reaps it."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
