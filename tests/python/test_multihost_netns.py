"""Multi-host over real network stacks: each host is a network namespace (podium/_src/
netns.py, the `network` fixture) running `python -m podium worker`; the controller runs in
the root namespace. A cut link drops every frame silently (no RST, no ICMP), which only
heartbeats can detect.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import CHILD_TIMEOUT_S
# The workers of each test: one per namespace host, on PORT (podium/_src/netns.py).
from podium._src.netns import PORT, start_workers, stop_workers  # noqa: F401

CONTROLLER = textwrap.dedent("""
    import os, sys, time
    from podium.actor import (Actor, endpoint, attach_to_workers, enable_transport,
                              SupervisionError)
    import podium.actor
    from podium._core import mesh as _mesh

    class Where(Actor):
        @endpoint
        def addr(self):
            return _mesh.this_proc_id()

    controller_addr, workers = sys.argv[1], sys.argv[2:]
    faults = []
    podium.actor.unhandled_fault_hook = faults.append
    enable_transport(f"tcp://{controller_addr}:0")
    hosts = attach_to_workers(workers=workers)
    hosts.initialized.get(timeout=30)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    where = procs.spawn("where", Where)
    got = where.addr.call().get(timeout=30)
    # The same call through a relay tree (fan-out 2 over 6 procs): relays on one host forward
    # to procs on the others, and the replies merge on the way back.
    _mesh.set_cast_fanout(2)
    # Heartbeats count too: the fewest messages of three calls is the call's own (a star
    # would send and receive 6).
    counts = []
    for _ in range(3):
        before = _mesh.traffic()
        tree = where.addr.call().get(timeout=30)
        after = _mesh.traffic()
        assert list(tree.items()) == list(got.items()), (tree, got)
        counts.append((after[0] - before[0], after[1] - before[1]))
    assert any(sent <= 2 and got_ <= 2 for sent, got_ in counts), counts
    _mesh.set_cast_fanout(16)
    for point, addr in got.items():
        print("RANK", point["hosts"], point["gpus"], addr, flush=True)
    print("CUT?", flush=True)
    sys.stdin.readline()
    t = time.monotonic()
    try:
        where.addr.call().get(timeout=30)
        print("answered?!", flush=True)
    except SupervisionError as e:
        print("LOST %.3f %s" % (time.monotonic() - t, e), flush=True)
    for h in range(len(workers)):
        try:
            n = len(where.slice(hosts=h).addr.call().get(timeout=10))
            print("HOST", h, "answers", n, flush=True)
        except SupervisionError as e:
            print("HOST", h, "fails", e, flush=True)
    # The owner hears of the failure on a thread of its own: wait for it, bounded.
    deadline = time.monotonic() + 10
    while not faults and time.monotonic() < deadline:
        time.sleep(0.01)
    print("FAULTS", len(faults), flush=True)
    """)


# HA-4: a host cut off silently is lost (no heartbeat) within the bound; its ranks fail naming
# it, the other hosts answer, the owner is told.
def test_three_hosts_cast_gather_and_a_silently_cut_host(network, tmp_path):
    net = network(3)
    workers = start_workers(net)
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    c = subprocess.Popen(
        [sys.executable, str(script), net.controller_addr,
         *[f"tcp://{h.addr}:{PORT}" for h in net.hosts]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ranks = []
        while True:
            line = c.stdout.readline()
            assert line, c.stderr.read()
            if line.startswith("CUT?"):
                break
            ranks.append(line.split())
        # Two procs on each host, each listening on its host's own address.
        assert len(ranks) == 6, ranks
        for _, h, g, addr in ranks:
            assert addr.startswith(f"tcp:{net.hosts[int(h)].addr}:"), (h, addr)
        net.cut(1)
        cut_at = time.monotonic()
        c.stdin.write("\n")
        c.stdin.flush()
        out, err = c.communicate(timeout=CHILD_TIMEOUT_S)
        waited = time.monotonic() - cut_at
    finally:
        if c.poll() is None:
            c.kill()
        stop_workers(workers)
    m = re.search(r"LOST ([\d.]+) (.*)", out)
    assert m, out + err
    detect = float(m.group(1))
    print(f"silent host loss reported to the pending call after {detect:.3f} s")
    assert detect < 5.0, m.group(0)
    assert f"tcp:{net.hosts[1].addr}:{PORT}" in m.group(2) and "was lost" in m.group(2), m.group(2)
    assert "HOST 0 answers 2" in out and "HOST 2 answers 2" in out, out + err
    assert re.search(r"HOST 1 fails .*was lost", out), out
    assert re.search(r"FAULTS [1-9]", out), out
    assert waited < CHILD_TIMEOUT_S


# HA-5
def test_a_cut_controller_makes_the_worker_kill_its_procs(network, tmp_path):
    """The other direction: the worker stops hearing its controller (the host's link is cut),
    kills its procs within the lost-after bound, and serves a new controller once the link is
    back."""
    net = network(1)
    workers = start_workers(net)
    h = net.hosts[0]
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from podium.actor import Actor, endpoint, attach_to_workers, enable_transport
        import podium.actor
        import os
        podium.actor.unhandled_fault_hook = lambda f: None
        class P(Actor):
            @endpoint
            def pid(self):
                return os.getpid()
        enable_transport(f"tcp://{sys.argv[1]}:0")
        hosts = attach_to_workers(workers=[sys.argv[2]])
        pm = hosts.spawn_procs(per_host={"gpus": 2})
        print("PIDS", *pm.spawn("p", P).pid.call().get(timeout=30).values(), flush=True)
        sys.stdin.readline()
        """))
    c = subprocess.Popen([sys.executable, str(script), net.controller_addr,
                          f"tcp://{h.addr}:{PORT}"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        line = c.stdout.readline()
        assert line.startswith("PIDS"), line + c.stderr.read()
        pids = [int(p) for p in line.split()[1:]]
        assert all(os.path.exists(f"/proc/{p}") for p in pids)
        net.cut(0)
        t = time.monotonic()
        while time.monotonic() - t < 10 and any(os.path.exists(f"/proc/{p}") for p in pids):
            time.sleep(0.05)
        gone_after = time.monotonic() - t
        assert not any(os.path.exists(f"/proc/{p}") for p in pids), "procs outlived the cut"
        assert gone_after < 5.0, gone_after
        print(f"worker killed its procs {gone_after:.3f} s after losing its controller")
        c.kill()
        c.wait(timeout=10)
        net.restore(0)
        # A new controller is served.
        r = subprocess.run([sys.executable, str(script), net.controller_addr,
                            f"tcp://{h.addr}:{PORT}"], input="\n", capture_output=True,
                           text=True, timeout=CHILD_TIMEOUT_S)
        assert r.stdout.startswith("PIDS"), r.stdout + r.stderr
    finally:
        if c.poll() is None:
            c.kill()
        stop_workers(workers)


def test_a_wrong_secret_across_hosts_is_refused_within_a_second(network, tmp_path):
    net = network(1)
    workers = start_workers(net, env={"PODIUM_SECRET": "the job's secret"})
    h = net.hosts[0]
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from podium.actor import attach_to_workers, enable_transport
        enable_transport(f"tcp://{sys.argv[1]}:0")
        hosts = attach_to_workers(workers=[sys.argv[2]])
        t = time.monotonic()
        try:
            hosts.initialized.get(timeout=30)
            print("attached?!")
        except Exception as e:
            print("REFUSED %.3f %s" % (time.monotonic() - t, e))
        """))
    try:
        r = subprocess.run([sys.executable, str(script), net.controller_addr,
                            f"tcp://{h.addr}:{PORT}"], capture_output=True, text=True,
                           timeout=CHILD_TIMEOUT_S,
                           env={**os.environ, "PODIUM_SECRET": "a guess"})
    finally:
        stop_workers(workers)
    m = re.search(r"REFUSED ([\d.]+) (.*)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) < 1.0 and "secret" in m.group(2), m.group(0)
    log = workers[0].stdout.read()
    assert net.controller_addr in log or "secret" in log, log


RESTART_CONTROLLER = textwrap.dedent("""
    import os, sys, time
    from podium.actor import (Actor, endpoint, attach_to_workers, enable_transport,
                              SupervisionError)
    import podium.actor
    from podium._core import mesh as _mesh

    class Keeper(Actor):
        def __init__(self):
            self.calls = 0

        @endpoint
        def where(self):
            self.calls += 1
            return (_mesh.this_proc_id(), os.getpid(), self.calls)

    controller_addr, first, workers = sys.argv[1], sys.argv[2] == "first", sys.argv[3:]
    faults = []
    podium.actor.unhandled_fault_hook = faults.append
    enable_transport(f"tcp://{controller_addr}:0")
    deadline = time.monotonic() + 20
    while True:  # a worker frees itself from a silent controller within the lost-after
        hosts = attach_to_workers(workers=workers)
        try:
            hosts.initialized.get(timeout=30)
            break
        except Exception as e:
            if "serves another controller" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    if first:
        keepers = hosts.spawn_procs(per_host={"gpus": 2}, name="keepers").spawn("k", Keeper)
    else:
        procs = hosts.proc_mesh("keepers")
        procs.initialized.get(timeout=30)
        keepers = procs.actor_mesh("k", Keeper)
        keepers.initialized.get(timeout=30)
    for point, got in keepers.where.call().get(timeout=30).items():
        print("RANK", point["hosts"], point["gpus"], *got, flush=True)
    if first:
        os._exit(0)  # dies without a word: the workers find it silent
    print("CUT?", flush=True)
    sys.stdin.readline()
    t = time.monotonic()
    try:
        keepers.where.call().get(timeout=30)
        print("answered?!", flush=True)
    except SupervisionError as e:
        print("LOST %.3f %s" % (time.monotonic() - t, e), flush=True)
    for h in (0, 2):
        print("HOST", h, "answers", len(keepers.slice(hosts=h).where.call().get(timeout=10)),
              flush=True)
    deadline = time.monotonic() + 10
    while not faults and time.monotonic() < deadline:
        time.sleep(0.01)
    print("FAULTS", len(faults), flush=True)
    procs.stop().get(timeout=30)  # the survivors stop; the lost host's ranks count as ended
    print("STOPPED", flush=True)
    """)


def test_a_restarted_controller_takes_over_persistent_hosts_and_sees_one_cut(network,
                                                                           tmp_path):
    """Controller restart and re-attach across three hosts: the first controller dies without
    detaching; the persistent workers keep its procs and actors; the next controller finds
    them by name, with their state, and a silent cut of one host then fails that host's ranks
    (naming it) while the other two answer."""
    net = network(3)
    workers = start_workers(net, persistent=True)
    script = tmp_path / "controller.py"
    script.write_text(RESTART_CONTROLLER)
    addrs = [f"tcp://{h.addr}:{PORT}" for h in net.hosts]
    env = {**os.environ, "PODIUM_HOST_LOST_MS": "1000"}
    c = None
    try:
        first = subprocess.run([sys.executable, str(script), net.controller_addr, "first",
                                *addrs], capture_output=True, text=True,
                               timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL, env=env)
        ranks = [l.split()[1:] for l in first.stdout.splitlines() if l.startswith("RANK")]
        assert first.returncode == 0 and len(ranks) == 6, first.stdout + first.stderr
        # Past the workers' lost-after: plain workers would have killed the procs by now.
        time.sleep(2.0)
        pids = [int(r[3]) for r in ranks]
        assert all(os.path.exists(f"/proc/{p}") for p in pids)
        c = subprocess.Popen([sys.executable, str(script), net.controller_addr, "second",
                              *addrs], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        again = []
        while True:
            line = c.stdout.readline()
            assert line, c.stderr.read()
            if line.startswith("CUT?"):
                break
            again.append(line.split()[1:])
        # The same procs at the same addresses, and the same actors: a second call each.
        assert sorted((h, g, a, p) for h, g, a, p, _ in again) == \
            sorted((h, g, a, p) for h, g, a, p, _ in ranks), (again, ranks)
        assert {n for *_, n in again} == {"2"}, again
        net.cut(1)
        c.stdin.write("\n")
        c.stdin.flush()
        out, err = c.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        if c is not None and c.poll() is None:
            c.kill()
        stop_workers(workers)
    m = re.search(r"LOST ([\d.]+) (.*)", out)
    assert m, out + err
    assert float(m.group(1)) < 5.0, m.group(0)
    assert f"tcp:{net.hosts[1].addr}:{PORT}" in m.group(2) and "was lost" in m.group(2), m.group(2)
    assert "HOST 0 answers 2" in out and "HOST 2 answers 2" in out, out + err
    assert re.search(r"FAULTS [1-9]", out), out + err
    assert "STOPPED" in out, out + err


PORT_REUSE = textwrap.dedent("""
    import sys
    from podium.actor import Actor, endpoint, attach_to_workers, enable_transport, this_host
    from podium._core import mesh as _mesh

    class Where(Actor):
        @endpoint
        def addr(self, cycle):
            return cycle, _mesh.this_proc_id()

    mode, listen = sys.argv[1], sys.argv[2]
    enable_transport(listen)
    if mode == "attach":
        hosts = attach_to_workers(workers=[sys.argv[3]])
        hosts.initialized.get(timeout=30)
    else:
        hosts = this_host()
    for cycle in range(4):
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        where = procs.spawn("where", Where)
        print("ADDR", *where.addr.call_one(cycle).get(timeout=30), flush=True)
        where.stop().get(timeout=30)
        procs.stop().get(timeout=30)
    print("DONE", flush=True)
    """)


def test_a_proc_on_a_dead_procs_tcp_port_is_a_new_proc(network, tmp_path):
    """CH-12: the kernel gives a new proc the port of one that has ended. Each cycle's proc is
    still a proc of its own: a call reaches it, rather than failing with the dead one's exit
    (which is what calls did while a proc's address was only its host and port)."""
    net = network(1)
    host = net.hosts[0]
    script = tmp_path / "reuse.py"
    script.write_text(PORT_REUSE)
    # Procs that a host's agent spawns, for a controller in the root namespace: each under an
    # incarnation of its own.
    workers = start_workers(net)
    try:
        attach = subprocess.run(
            [sys.executable, str(script), "attach", f"tcp://{net.controller_addr}:0",
             f"tcp://{host.addr}:{PORT}"],
            capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    finally:
        stop_workers(workers)
    # Procs that a controller on the host spawns itself, on TCP, where binds have one port to
    # pick (the host's ephemeral ports are 40000 and 40001, and binds take the odd one): every
    # cycle's proc gets the port of the one before. Connects share 40000. The namespace keeps
    # no TIME_WAIT sockets (tcp_max_tw_buckets=0): one on 40001, left when a proc closed a
    # connection first, would hold the port for 60 s and fail the next bind.
    net.run(host, ["sysctl", "-qw", "net.ipv4.ip_local_port_range=40000 40001",
                   "net.ipv4.tcp_max_tw_buckets=0"], check=True)
    local = net.run(host, [sys.executable, str(script), "local", f"tcp://{host.addr}:39000"],
                    timeout=CHILD_TIMEOUT_S, env={**os.environ, "PODIUM_HOST_ADDR": host.addr})
    for mode, out in (("attach", attach), ("local", local)):
        assert out.returncode == 0 and "DONE" in out.stdout, (mode, out.stdout, out.stderr)
        addrs = [line.split()[2] for line in out.stdout.splitlines() if line.startswith("ADDR")]
        assert len(addrs) == 4 and len(set(addrs)) == 4, (mode, out.stdout)
        assert all(re.fullmatch(rf"tcp:{host.addr}:\d+/[0-9a-f]+", a) for a in addrs), addrs
    ports = {a.rsplit("/", 1)[0] for a in
             (line.split()[2] for line in local.stdout.splitlines() if line.startswith("ADDR"))}
    assert ports == {f"tcp:{host.addr}:40001"}, local.stdout
