"""Workers (host agents) and attach_to_workers over loopback: each worker is a real
`python -m podium worker` process; each controller is a script of its own, since a process
chooses its transport (enable_transport) before podium starts in it, and this test process
runs podium on Unix sockets. The network-namespace tests (test_multihost_netns.py) cover
hosts that are really apart, and a link that goes silent.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import CHILD_TIMEOUT_S, Worker, env_without_secret, gone_within

READY = "podium worker listening on "


@pytest.fixture
def workers():
    started: list[Worker] = []

    def start(n: int = 1, env: dict[str, str] | None = None,
              argv: list[str] | None = None) -> list[Worker]:
        ws = [Worker(env, argv=argv) for _ in range(n)]
        started.extend(ws)
        return ws

    yield start
    for w in started:
        w.kill()


PRELUDE = textwrap.dedent("""
    import os, sys, time
    from podium.actor import (Actor, endpoint, attach_to_workers, enable_transport,
                              SupervisionError)
    import podium.actor

    class Who(Actor):
        @endpoint
        def who(self):
            import socket
            return (os.getpid(), os.getppid())

        @endpoint
        def pid(self):
            return os.getpid()

    WORKERS = sys.argv[1:]

    def try_attach(workers):
        # (host mesh, the error of its initialized or None, seconds it took)
        hosts = attach_to_workers(workers=workers)
        t = time.monotonic()
        try:
            hosts.initialized.get(timeout=30)
            return hosts, None, time.monotonic() - t
        except Exception as e:
            return hosts, e, time.monotonic() - t
    """)


def run_controller(tmp_path: Path, body: str, workers: list[str], env=None,
                   timeout: float = CHILD_TIMEOUT_S) -> subprocess.CompletedProcess:
    script = tmp_path / "controller.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script), *workers], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})


# HA-5: a controller that exits detaches, and each worker kills the procs it ran for it.
def test_attach_spawn_cast_and_gather_across_two_workers(tmp_path, workers):
    ws = workers(2)
    r = run_controller(tmp_path, """
        enable_transport("tcp://127.0.0.1:0")
        hosts = attach_to_workers(workers=WORKERS)
        assert hosts.extent == {"hosts": 2}, hosts.extent
        hosts.initialized.get(timeout=30)
        assert [h["attached"] for h in hosts.hosts()] == [True, True]
        procs = hosts.spawn_procs(per_host={"gpus": 3})
        assert procs.extent == {"hosts": 2, "gpus": 3}, procs.extent
        procs.initialized.get(timeout=30)
        am = procs.spawn("who", Who)
        got = am.who.call().get(timeout=30)
        parents = {}
        for point, (pid, ppid) in got.items():
            parents.setdefault(point["hosts"], set()).add(ppid)
        # The procs of each host are children of that host's worker (or its zygote).
        assert len(parents) == 2 and parents[0] != parents[1], parents
        one = am.slice(hosts=1, gpus=2).who.call_one().get(timeout=30)
        assert one == got.item(hosts=1, gpus=2)
        assert hosts.slice(hosts=1).extent == {}
        sub = hosts.slice(hosts=slice(1, 2)).spawn_procs(per_host={"gpus": 2})
        assert sub.extent == {"hosts": 1, "gpus": 2}, sub.extent
        assert len(sub.spawn("who2", Who).pid.call().get(timeout=30)) == 2
        print("OK", sorted(p for p, _ in got.values()))
        """, [w.address for w in ws])
    assert r.returncode == 0, r.stdout + r.stderr
    pids = [int(p) for p in re.findall(r"\d+", r.stdout.split("OK", 1)[1])]
    assert len(pids) == 6
    # The controller left: each worker killed its procs (no orphans).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.05)
    assert not [p for p in pids if Path(f"/proc/{p}").exists()]


# HA-3: initialized fails within the attach timeout, naming the silent host.
def test_an_unreachable_worker_fails_initialized_naming_it(tmp_path, workers):
    # A port nobody listens on: bind it, do not listen, keep it while the test runs.
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ws = workers(1)
    try:
        r = run_controller(tmp_path, """
            hosts, e, took = try_attach(WORKERS)
            print("FAILED after %.2f s: %s: %s" % (took, type(e).__name__, e) if e else "attached?!")
            """, [ws[0].address, dead], env={"PODIUM_ATTACH_TIMEOUT_MS": "1500"})
    finally:
        s.close()
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"FAILED after ([\d.]+) s: (\w+): (.*)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) < 5.0
    assert "cannot attach host 1" in m.group(3) and dead[len("tcp://"):] in m.group(3), m.group(3)


# HA-3: a refusal (a wrong secret) fails initialized at once.
def test_a_wrong_secret_is_refused_within_a_second(tmp_path, workers):
    ws = workers(1, env={"PODIUM_SECRET": "the worker's secret"})
    r = run_controller(tmp_path, """
        hosts, e, took = try_attach(WORKERS)
        print("REFUSED after %.3f s: %s" % (took, e) if e else "attached?!")
        """, [ws[0].address], env={"PODIUM_SECRET": "another secret"})
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"REFUSED after ([\d.]+) s: (.*)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) < 1.0, m.group(0)
    assert "secret" in m.group(2), m.group(2)
    # The worker logged whom it refused, and serves on.
    assert ws[0].proc.poll() is None
    log = ws[0].output()
    assert "secret" in log or "auth" in log, log


def test_a_controller_not_given_the_workers_secret_is_refused_and_told_to_set_it(tmp_path,
                                                                                 workers):
    # SE-1: the controller, given no secret, runs on one it generated; the worker refuses it,
    # and the error says where the workers' secret must go.
    ws = workers(1, env={"PODIUM_SECRET": "s3cret"})
    script = tmp_path / "c.py"
    script.write_text(PRELUDE + textwrap.dedent("""
        hosts, e, _ = try_attach(WORKERS)
        print("REFUSED: %s" % e if e else "attached?!")
        """))
    r = subprocess.run([sys.executable, str(script), ws[0].address], capture_output=True,
                       text=True, timeout=CHILD_TIMEOUT_S, env=env_without_secret(),
                       stdin=subprocess.DEVNULL)
    assert "REFUSED:" in r.stdout and "PODIUM_SECRET_FILE" in r.stdout, r.stdout + r.stderr
    assert "generated" in r.stdout, r.stdout


# HA-4: the lost host's ranks fail naming it, the other host answers, the owner is told.
def test_a_killed_worker_fails_its_ranks_naming_the_host_and_the_rest_answer(tmp_path, workers):
    ws = workers(2)
    # Run it interactively: the controller says when its actors answer, the test kills then.
    script = tmp_path / "controller.py"
    script.write_text(PRELUDE + textwrap.dedent("""
        hits = []
        podium.actor.unhandled_fault_hook = lambda failure: hits.append(failure)
        hosts = attach_to_workers(workers=WORKERS)
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        am = procs.spawn("who", Who)
        doomed = sorted(am.slice(hosts=1).pid.call().get(timeout=30).values())
        print("KILL", *doomed, flush=True)
        sys.stdin.readline()
        t = time.monotonic()
        try:
            am.pid.call().get(timeout=20)
            print("answered?!")
        except SupervisionError as e:
            print("LOST after %.2f s: %s" % (time.monotonic() - t, e), flush=True)
        print("REST", len(am.slice(hosts=0).pid.call().get(timeout=10)), flush=True)
        deadline = time.monotonic() + 10  # the hook runs on a thread of its own
        while not hits and time.monotonic() < deadline:
            time.sleep(0.01)
        print("HOOK", len(hits), flush=True)
        """))
    c = subprocess.Popen([sys.executable, str(script), ws[0].address, ws[1].address],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        line = c.stdout.readline().split()
        assert line[:1] == ["KILL"], line
        ws[1].kill()
        # Its procs die with it (PR_SET_PDEATHSIG); the call below must find them gone, not
        # win the race and be answered.
        doomed = [int(p) for p in line[1:]]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in doomed):
            time.sleep(0.02)
        c.stdin.write("\n")
        c.stdin.flush()
        out, err = c.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        if c.poll() is None:
            c.kill()
    m = re.search(r"LOST after ([\d.]+) s: (.*)", out)
    assert m, out + err
    assert float(m.group(1)) < 5.0
    assert f"its host {os.uname().nodename}" in m.group(2), out + err
    assert ws[1].address[len("tcp://"):] in m.group(2), out + err
    assert "REST 2" in out, out + err
    assert re.search(r"HOOK [1-9]", out), out + err


# HA-1: a second controller is refused naming the one served; once it detaches, the next is
# served.
def test_a_worker_serves_one_controller_at_a_time_then_the_next(tmp_path, workers):
    ws = workers(1)
    first = tmp_path / "first.py"
    first.write_text(PRELUDE + textwrap.dedent("""
        hosts = attach_to_workers(workers=WORKERS)
        hosts.initialized.get(timeout=30)
        print("ATTACHED", flush=True)
        sys.stdin.readline()
        """))
    c1 = subprocess.Popen([sys.executable, str(first), ws[0].address], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert c1.stdout.readline().strip() == "ATTACHED"
        r = run_controller(tmp_path, """
            hosts, e, _ = try_attach(WORKERS)
            print("BUSY: %s" % e if e else "attached?!")
            """, [ws[0].address])
        assert "BUSY:" in r.stdout and "serves another controller" in r.stdout, r.stdout + r.stderr
        c1.stdin.write("\n")
        c1.stdin.flush()
        c1.wait(timeout=CHILD_TIMEOUT_S)
    finally:
        if c1.poll() is None:
            c1.kill()
    # The first controller detached on exit: the next one is served at once.
    r = run_controller(tmp_path, """
        hosts = attach_to_workers(workers=WORKERS)
        hosts.initialized.get(timeout=30)
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        print("PIDS", list(procs.spawn("w", Who).pid.call().get(timeout=30).values()))
        """, [ws[0].address])
    assert r.returncode == 0 and "PIDS [" in r.stdout, r.stdout + r.stderr


# HA-8, HA-1 (a worker attached twice is refused): shutdown() kills the procs, persistent or
# not, they end as stopped (no supervision event), and the host cannot be used after. HA-16:
# a worker that is not persistent then exits; a persistent one serves the next controller.
@pytest.mark.parametrize("persistent", [False, True], ids=["worker", "persistent_worker"])
def test_host_mesh_shutdown_ends_its_procs_as_stopped_and_frees_the_worker(tmp_path, persistent):
    w = Worker(persistent=persistent)
    try:
        r = run_controller(tmp_path, """
            hits = []
            podium.actor.unhandled_fault_hook = lambda failure: hits.append(failure)
            hosts = attach_to_workers(workers=WORKERS)
            procs = hosts.spawn_procs(per_host={"gpus": 2}, name="kept")
            am = procs.spawn("who", Who)
            pids = sorted(am.pid.call().get(timeout=30).values())
            try:
                attach_to_workers(workers=WORKERS)
                print("attached twice?!")
            except ValueError as e:
                print("TWICE:", e, flush=True)
            hosts.shutdown().get(timeout=30)
            print("PIDS", *pids, flush=True)
            try:
                am.pid.call().get(timeout=10)
                print("answered?!")
            except SupervisionError as e:
                print("CALL:", e, flush=True)
            try:
                hosts.spawn_procs(per_host={"gpus": 1})
                print("spawned?!")
            except Exception as e:
                print("SPAWN:", e, flush=True)
            # Longer than PODIUM_HOST_LOST_MS and a tick: the worker, silent now, is not
            # taken as lost.
            time.sleep(3.0)
            print("HOOK", len(hits), flush=True)
            if os.environ["PERSISTENT"] != "1":
                sys.exit(0)
            # The persistent worker serves the next attach at once, and kept nothing.
            again = attach_to_workers(workers=WORKERS)
            again.initialized.get(timeout=30)
            try:
                again.proc_mesh("kept")
                print("kept?!")
            except ValueError as e:
                print("KEPT:", e, flush=True)
            fresh = again.spawn_procs(per_host={"gpus": 1}).spawn("w", Who)
            print("AGAIN", len(fresh.pid.call().get(timeout=30)), flush=True)
            """, [w.address], env={"PODIUM_HOST_LOST_MS": "2000",
                                   "PERSISTENT": "1" if persistent else "0"})
        if not persistent:  # HA-16: the worker ended by itself, its zygote and procs with it
            assert w.proc.wait(timeout=30) == 0, w.text()
            assert "shut this host down; exiting" in w.text(), w.text()
    finally:
        w.kill()
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    pids = [int(p) for p in r.stdout.split("PIDS", 1)[1].split("\n", 1)[0].split()]
    assert len(pids) == 2 and gone_within(pids) == [], out
    worker = f"tcp:{w.address[len('tcp://'):]}"
    assert f"TWICE: attach: worker {worker} is attached already" in r.stdout, out
    host = f"{os.uname().nodename} ({worker})"
    assert re.search(r"CALL: .*" + re.escape(f"its host {host} was shut down"), r.stdout), out
    assert f"SPAWN: spawn_procs: host {host} cannot be used: it was shut down" in r.stdout, out
    assert "HOOK 0" in r.stdout, out
    assert "no heartbeat" not in out and "was lost" not in out, out
    if persistent:
        assert re.search(r"KEPT: .*keeps proc mesh 'kept' no more: its 2 procs have all "
                         r"ended", r.stdout), out
        assert "AGAIN 1" in r.stdout, out


# HA-8: a worker that does not answer the shutdown is waited for at most the attach timeout.
def test_host_mesh_shutdown_of_a_silent_worker_ends_within_the_attach_timeout(tmp_path):
    w = Worker()
    try:
        r = run_controller(tmp_path, """
            import signal
            hits = []
            podium.actor.unhandled_fault_hook = lambda failure: hits.append(failure)
            hosts = attach_to_workers(workers=WORKERS)
            am = hosts.spawn_procs(per_host={"gpus": 1}).spawn("who", Who)
            am.pid.call().get(timeout=30)
            worker = int(os.environ["WORKER_PID"])
            os.kill(worker, signal.SIGSTOP)
            def stopped():  # every thread: a stop takes effect when each next runs
                tasks = os.listdir(f"/proc/{worker}/task")
                return all(open(f"/proc/{worker}/task/{t}/stat").read().rsplit(")", 1)[1]
                           .split()[0] == "T" for t in tasks)
            deadline = time.monotonic() + 10
            while not stopped() and time.monotonic() < deadline:
                time.sleep(0.01)
            t = time.monotonic()
            hosts.shutdown().get(timeout=30)
            print("SHUTDOWN after %.2f s" % (time.monotonic() - t), flush=True)
            try:
                am.pid.call().get(timeout=10)
                print("answered?!")
            except SupervisionError as e:
                print("CALL:", e, flush=True)
            print("HOOK", len(hits), flush=True)
            """, [w.address], env={"PODIUM_ATTACH_TIMEOUT_MS": "1500",
                                   "PODIUM_HOST_LOST_MS": "20000",
                                   "WORKER_PID": str(w.proc.pid)})
    finally:
        w.kill()  # SIGKILL ends a stopped process too
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    m = re.search(r"SHUTDOWN after ([\d.]+) s", r.stdout)
    assert m and 1.4 < float(m.group(1)) < 15, out
    assert re.search(r"host .*did not answer the shutdown within 1500 ms", out), out
    assert "was shut down" in r.stdout and "HOOK 0" in r.stdout, out


def test_attach_needs_tcp_when_podium_already_runs_on_unix(tmp_path, workers):
    ws = workers(1)
    r = run_controller(tmp_path, """
        from podium.actor import this_host
        local = this_host().spawn_procs(per_host={"p": 1})
        local.initialized.get(timeout=30)
        try:
            attach_to_workers(workers=WORKERS)
        except Exception as e:
            print("REFUSED:", e)
        try:
            enable_transport("tcp")
        except RuntimeError as e:
            print("LATE:", e)
        """, [ws[0].address])
    assert "REFUSED:" in r.stdout and "enable_transport" in r.stdout, r.stdout + r.stderr
    assert "LATE:" in r.stdout, r.stdout + r.stderr


def test_bad_worker_addresses_are_refused_with_a_message(tmp_path):
    r = run_controller(tmp_path, """
        for bad in (["tcp://nohostport"], ["tcp://127.0.0.1:0"], [], [42]):
            try:
                attach_to_workers(workers=bad)
                print("accepted?!", bad)
            except (ValueError, TypeError) as e:
                print("REFUSED:", e)
        """, [])
    assert r.stdout.count("REFUSED:") == 4, r.stdout + r.stderr


def test_worker_cli_reports_a_port_in_use(tmp_path, workers):
    ws = workers(1)
    r = subprocess.run([sys.executable, "-m", "podium", "worker", "--listen", ws[0].address],
                       capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "podium worker:" in r.stderr, r.stdout + r.stderr


# HA-6: a remote actor's stdout and stderr reach the controller's, prefixed with name and rank.
def test_what_remote_actors_print_reaches_the_controller(tmp_path, workers):
    ws = workers(2)
    r = run_controller(tmp_path, """
        class Talker(Actor):
            @endpoint
            def say(self, what):
                print(what, flush=True)
                print("to stderr", file=sys.stderr, flush=True)
                return os.getpid()

        hosts = attach_to_workers(workers=WORKERS)
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        pids = procs.spawn("talker", Talker).say.call("hello from a worker").get(timeout=30)
        time.sleep(0.5)  # output travels apart from the replies
        print("PIDS", sorted(pids.values()), flush=True)
        """, [w.address for w in ws])
    assert r.returncode == 0, r.stdout + r.stderr
    for h in range(2):
        assert f"[talker {{'hosts': {h}/2, 'gpus': 0/1}}] hello from a worker" in r.stdout, r.stdout
        assert f"[talker {{'hosts': {h}/2, 'gpus': 0/1}}] to stderr" in r.stderr, r.stderr
    # Not through the workers' own output.
    for w in ws:
        assert "hello from a worker" not in w.output()


# --- TLS (channel CH-9) ----------------------------------------------------------------------
# Certificates are made with the openssl command, as docs/multihost.md shows.


def _openssl(cwd: Path, *args: str) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr


def _make_ca(d: Path, name: str) -> Path:
    _openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
             "-subj", f"/CN={name}")
    return d / f"{name}.pem"


def _issue(d: Path, ca: str, name: str) -> Path:
    """One PEM with `name`'s private key and its certificate, which `ca` signed."""
    _openssl(d, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
    (d / "leaf.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
                                "extendedKeyUsage=serverAuth,clientAuth\n")
    _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-extfile", "leaf.ext", "-out", f"{name}.crt")
    bundle = d / f"{name}-bundle.pem"
    bundle.write_text((d / f"{name}.key").read_text() + (d / f"{name}.crt").read_text())
    bundle.chmod(0o600)
    return bundle


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("certs")
    return {"ca": _make_ca(d, "job-ca"), "other_ca": _make_ca(d, "other-ca"),
            "worker": _issue(d, "job-ca", "worker"),
            "controller": _issue(d, "job-ca", "controller"),
            "stranger": _issue(d, "other-ca", "stranger")}


def _tls_env(ca: Path, bundle: Path) -> dict[str, str]:
    return {"PODIUM_TLS_CERT": str(bundle), "PODIUM_TLS_KEY": str(bundle),
            "PODIUM_TLS_CA": str(ca)}


def test_controller_and_workers_on_tls_spawn_cast_and_call(tmp_path, workers, certs):
    # Workers started through the Python API (ca as a path, the key as bytes); the controller
    # the other way round. Every process also holds a secret, checked inside TLS.
    worker_script = tmp_path / "worker.py"
    worker_script.write_text(textwrap.dedent(f"""
        from pathlib import Path
        from podium.actor import run_worker_loop_forever
        run_worker_loop_forever(address="tcp://127.0.0.1:0", ca=Path({str(certs["ca"])!r}),
                                private_key=Path({str(certs["worker"])!r}).read_bytes())
        """))
    ws = workers(2, env={"PODIUM_SECRET": "tls-job"},
                 argv=[sys.executable, str(worker_script)])
    r = run_controller(tmp_path, f"""
        from pathlib import Path

        class Env(Actor):
            @endpoint
            def tls(self):
                # As its worker got them: the CA as a path, the key as PEM text.
                return (os.getpid(), os.path.isfile(os.environ.get("PODIUM_TLS_CA", "")) and
                        "-----BEGIN" in os.environ.get("PODIUM_TLS_KEY", ""))

        hosts = attach_to_workers(workers=WORKERS,
                                  ca=Path({str(certs["ca"])!r}).read_bytes(),
                                  private_key={str(certs["controller"])!r})
        hosts.initialized.get(timeout=30)
        procs = hosts.spawn_procs(per_host={{"gpus": 3}})
        got = procs.spawn("env", Env).tls.call().get(timeout=30)
        assert len(got) == 6 and all(pem for _, pem in got.values()), got
        # Casts relay through procs on both hosts (fan-out 2), so procs talk across hosts.
        pids = procs.spawn("who", Who).pid.call().get(timeout=30)
        print("OK", len(set(pids.values())))
        """, [w.address for w in ws], env={"PODIUM_SECRET": "tls-job", "PODIUM_CAST_FANOUT": "2"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK 6" in r.stdout, r.stdout + r.stderr


def test_a_certificate_from_another_ca_is_refused_within_a_second(tmp_path, workers, certs):
    ws = workers(1, env=_tls_env(certs["ca"], certs["worker"]))
    attach = """
        hosts, e, took = try_attach(WORKERS)
        print("REFUSED after %.3f s: %s" % (took, e) if e else "attached?!")
        """
    # The worker does not trust the controller's certificate ...
    r = run_controller(tmp_path, attach, [ws[0].address],
                       env=_tls_env(certs["ca"], certs["stranger"]))
    m = re.search(r"REFUSED after ([\d.]+) s: (.*)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) < 1.0, m.group(0)
    assert "TLS" in m.group(2) and ws[0].address[len("tcp://"):] in m.group(2), m.group(2)
    # ... nor the controller the worker's.
    r = run_controller(tmp_path, attach, [ws[0].address],
                       env=_tls_env(certs["other_ca"], certs["stranger"]))
    m = re.search(r"REFUSED after ([\d.]+) s: (.*)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) < 1.0, m.group(0)
    assert "certificate verify failed" in m.group(2), m.group(2)
    # The worker logged whom it refused and why, and serves a controller it trusts.
    r = run_controller(tmp_path, """
        hosts, e, _ = try_attach(WORKERS)
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        print("PIDS", list(procs.spawn("w", Who).pid.call().get(timeout=30).values()))
        """, [ws[0].address], env=_tls_env(certs["ca"], certs["controller"]))
    assert r.returncode == 0 and "PIDS [" in r.stdout, r.stdout + r.stderr
    log = ws[0].output()
    assert re.search(r"refused: TLS handshake failed: certificate verify failed", log), log
    assert "tcp:127.0.0.1:" in log, log


def test_tls_and_plaintext_processes_refuse_each_other_within_a_second(tmp_path, workers, certs):
    attach = """
        hosts, e, took = try_attach(WORKERS)
        print("REFUSED after %.3f s: %s" % (took, e) if e else "attached?!")
        """
    tls_worker, plain_worker = workers(1, env=_tls_env(certs["ca"], certs["worker"]))[0], \
        workers(1)[0]
    for worker, env, why in ((tls_worker, {}, "requires TLS"),
                             (plain_worker, _tls_env(certs["ca"], certs["controller"]),
                              "does not use TLS")):
        r = run_controller(tmp_path, attach, [worker.address], env=env)
        m = re.search(r"REFUSED after ([\d.]+) s: (.*)", r.stdout)
        assert m, r.stdout + r.stderr
        assert float(m.group(1)) < 1.0, m.group(0)
        assert why in m.group(2), m.group(2)
    # Every process of this session holds the job's secret (conftest): the TLS worker reads
    # the challenge-less close of a plaintext dialler with a secret (docs/channel.md, TLS).
    assert "closed the connection before the TLS handshake" in tls_worker.output()
    assert "speaks TLS, and this listener has no TLS" in plain_worker.output()


def test_tls_arguments_are_checked(tmp_path, certs):
    r = run_controller(tmp_path, f"""
        ca, key = {str(certs["ca"])!r}, {str(certs["controller"])!r}
        w = ["tcp://127.0.0.1:1"]
        for kwargs in (dict(ca=ca), dict(private_key=key), dict(ca=b"not a pem", private_key=key),
                       dict(ca="/nonexistent/nope.pem", private_key=key)):
            try:
                attach_to_workers(workers=w, **kwargs)
                print("accepted?!", kwargs)
            except (ValueError, FileNotFoundError) as e:
                print("REFUSED:", type(e).__name__, e)
        # Once podium runs (here on Unix sockets, without TLS), it is too late.
        from podium.actor import this_host
        local = this_host().spawn_procs(per_host={{"p": 1}})
        local.initialized.get(timeout=30)
        try:
            attach_to_workers(workers=w, ca=ca, private_key=key)
            print("accepted?!")
        except RuntimeError as e:
            print("LATE:", e)
        """, [])
    out = r.stdout
    assert out.count("REFUSED:") == 4, out + r.stderr
    assert out.count("both ca=") == 2 and "not PEM" in out and "nope.pem" in out, out
    assert "LATE:" in out and "before podium starts" in out, out + r.stderr


def test_worker_cli_names_the_tls_variables(run_podium):
    r = run_podium("worker", "--help")
    assert r.returncode == 0 and "PODIUM_TLS_CERT" in r.stdout, r.stdout
