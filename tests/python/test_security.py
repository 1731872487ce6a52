"""Safe by default (docs/security.md): a job is authenticated without the user doing anything
(SE-1, SE-2, SE-4, SE-5), strangers are refused before anything of theirs is decoded while
legitimate calls go on, values a peer supplies are clamped (HA-9), an attach given up on is
not adopted later (HA-10), and ended controllers leave no socket directory behind (SE-3).

Every process here runs with an environment of its own (no PODIUM_SECRET_FILE unless the test
gives one), since the test session's own secret (conftest) would hide what these check."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import CHILD_TIMEOUT_S, Worker, env_without_secret, eventually, gone_within

READY = "podium worker listening on "


@pytest.fixture
def secured(tmp_path, started):
    """A worker whose job has a secret: (the worker, the environment that names the secret,
    the secret file's path)."""
    path = secret_file(tmp_path)
    env = env_without_secret(PODIUM_SECRET_FILE=path)
    w = Worker(base_env=env)
    started.append(w)
    return w, env, path


@contextlib.contextmanager
def legitimate_calls(w: Worker, env: dict, cwd: Path, n: int = 300):
    """A controller that attaches to `w` and spawns an actor there before the block (the
    attack); after it, makes `n` calls, each answer checked: all must complete, and the worker
    must still run."""
    ctl = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LOAD), w.address, str(n)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env, cwd=cwd)
    try:
        assert ctl.stdout.readline().strip() == "READY", ctl.stderr.read()
        yield
        ctl.stdin.write("go\n")
        ctl.stdin.flush()
        out, err = ctl.communicate(timeout=CHILD_TIMEOUT_S)
        assert f"DONE {n}" in out, out + err
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.wait(timeout=10)
    assert w.proc.poll() is None, "the worker died"


@pytest.fixture
def started():
    workers: list[Worker] = []
    yield workers
    for w in workers:
        w.kill()


def secret_file(tmp_path: Path, value: str = "the job's secret") -> str:
    path = tmp_path / "job.secret"
    path.write_text(value + "\n")
    path.chmod(0o600)
    return str(path)


# The start of a controller script that attaches to the worker named by its first argument,
# over TCP, with an actor class to spawn there.
ECHO_CONTROLLER = """
import sys
from podium.actor import Actor, endpoint, attach_to_workers, enable_transport
class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x
enable_transport("tcp://127.0.0.1:0")
"""


def run_script(tmp_path: Path, name: str, body: str, env: dict, *args: str,
               timeout: float = CHILD_TIMEOUT_S, prelude: str = "") -> subprocess.CompletedProcess:
    script = tmp_path / f"{name}.py"
    script.write_text(prelude + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=env, cwd=tmp_path)


# --- SE-2: a worker without a secret ----------------------------------------------------------

def test_a_worker_without_a_secret_refuses_to_start_and_says_how_to_fix_it():
    r = subprocess.run([sys.executable, "-m", "podium", "worker", "--listen",
                        "tcp://127.0.0.1:0"], capture_output=True, text=True,
                       timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL,
                       env=env_without_secret())
    assert r.returncode == 1, r.stdout + r.stderr
    assert READY not in r.stdout
    assert "without the job's secret" in r.stderr and "PODIUM_SECRET_FILE" in r.stderr, r.stderr
    assert "--insecure" in r.stderr, r.stderr


def test_an_insecure_worker_says_so_on_stderr_and_serves_an_insecure_controller(tmp_path,
                                                                                 started):
    w = Worker(base_env=env_without_secret(), flags=("--insecure",))
    started.append(w)
    r = run_script(tmp_path, "c", """
        hosts = attach_to_workers(workers=[sys.argv[1]])
        hosts.initialized.get(timeout=30)
        a = hosts.spawn_procs(per_host={"gpus": 1}).spawn("echo", Echo)
        print("GOT", a.echo.call_one(7).get(timeout=30))
        """, env_without_secret(PODIUM_INSECURE="1"), w.address, prelude=ECHO_CONTROLLER)
    assert "GOT 7" in r.stdout, r.stdout + r.stderr
    assert "WARNING: PODIUM_INSECURE=1" in r.stderr, r.stderr  # the controller says so too
    out = w.output()
    assert "WARNING: --insecure" in out and f"127.0.0.1:{w.port}" in out, out


def test_a_controller_with_a_secret_is_not_fooled_by_an_insecure_worker(tmp_path, started):
    # The worker holds no secret, so it cannot prove it belongs to the job: the controller
    # sends it nothing (no pickled spawn reaches a stranger's listener).
    w = Worker(base_env=env_without_secret(), flags=("--insecure",))
    started.append(w)
    r = run_script(tmp_path, "c", """
        import os, sys
        os.environ["PODIUM_ATTACH_TIMEOUT_MS"] = "3000"
        from podium.actor import attach_to_workers, enable_transport
        enable_transport("tcp://127.0.0.1:0")
        hosts = attach_to_workers(workers=[sys.argv[1]])
        try:
            hosts.initialized.get(timeout=30)
            print("attached?!")
        except Exception as e:
            print("REFUSED", e)
        """, env_without_secret(PODIUM_SECRET_FILE=secret_file(tmp_path)), w.address)
    assert "REFUSED" in r.stdout and "cannot attach host 0" in r.stdout, r.stdout + r.stderr
    assert "serving controller" not in w.output()


# --- SE-1, SE-3: the controller's own secret and its socket directory ------------------------

CONTROLLER_SECRET = """
    import json, os, stat, sys
    from podium.actor import Actor, endpoint, this_host
    from podium._core import mesh
    class Env(Actor):
        @endpoint
        def secret_file(self):
            return os.environ.get("PODIUM_SECRET_FILE"), os.environ.get("PODIUM_SECRET")
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    got = procs.spawn("env", Env).secret_file.call().get(timeout=30)
    path = mesh.secret_file()
    st = os.stat(path)
    print("RESULT", json.dumps({
        "path": path, "mode": stat.S_IMODE(st.st_mode),
        "dir_mode": stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode),
        "length": len(open(path).read().strip()),
        "procs": [list(v) for _, v in got.items()],
        "cmdline": open("/proc/self/cmdline").read()}), flush=True)
    if len(sys.argv) > 1:
        os._exit(0)  # no atexit handlers: the socket directory stays behind
"""


def result(r: subprocess.CompletedProcess) -> dict:
    lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout + r.stderr
    return json.loads(lines[0][len("RESULT "):])


def test_a_controller_given_no_secret_makes_one_for_itself_and_its_procs(tmp_path):
    got = result(run_script(tmp_path, "c", CONTROLLER_SECRET, env_without_secret()))
    assert got["mode"] == 0o600 and got["dir_mode"] == 0o700, got
    assert got["length"] == 64, got  # 256 bits, hex
    # Every proc holds the same secret file, and no proc sees the secret in its environment.
    assert got["procs"] == [[got["path"], None]] * 2, got
    # It is gone with the controller, with its socket directory.
    assert not os.path.exists(got["path"])
    assert not os.path.exists(os.path.dirname(got["path"]))


def test_podium_insecure_makes_no_secret(tmp_path):
    r = run_script(tmp_path, "c", """
        from podium.actor import this_host
        from podium._core import mesh
        this_host().spawn_procs(per_host={"gpus": 1}).initialized.get(timeout=30)
        print("SECRET_FILE", repr(mesh.secret_file()))
        """, env_without_secret(PODIUM_INSECURE="1"))
    assert "SECRET_FILE ''" in r.stdout, r.stdout + r.stderr


def test_the_next_controller_removes_the_socket_directory_of_one_that_ended_abruptly(tmp_path):
    # SE-3: os._exit skips every handler; the directory (with its secret) stays until the
    # next controller of the user starts.
    first = result(run_script(tmp_path, "c1", CONTROLLER_SECRET, env_without_secret(), "abrupt"))
    left = os.path.dirname(first["path"])
    assert os.path.isdir(left)
    second = result(run_script(tmp_path, "c2", CONTROLLER_SECRET, env_without_secret()))
    assert second["path"] != first["path"]
    assert not os.path.exists(left), f"{left} was left behind"


# --- SE-4, SE-5: jobs make their secret ---------------------------------------------------------

LOCAL_JOB = """
    import json, os, stat, sys
    from podium.actor import Actor, endpoint, enable_transport
    from podium.job import LocalJob
    class Where(Actor):
        @endpoint
        def where(self):
            return os.getpid()
    enable_transport("tcp")
    job = LocalJob(hosts={"hosts": 1})
    hosts = job.state(cached_path=sys.argv[1]).hosts
    hosts.initialized.get(timeout=30)
    pids = hosts.spawn_procs(per_host={"gpus": 1}).spawn("w", Where).where.call().get(timeout=30)
    path = job._secret_file
    print("RESULT", json.dumps({
        "secret_file": path, "mode": stat.S_IMODE(os.stat(path).st_mode),
        "secret": open(path).read().strip(), "workers": job.workers["hosts"],
        "worker_pids": [w.pid for w in job._procs], "answers": [v for _, v in pids.items()]}),
        flush=True)
    if sys.argv[2] == "kill":
        job.kill()
        print("EXISTS_AFTER_KILL", os.path.exists(path), flush=True)
"""


def test_a_local_job_is_authenticated_without_the_user_doing_anything(tmp_path):
    state = str(tmp_path / ".podium" / "job_state.json")
    env = env_without_secret(PODIUM_HOST_ADDR="127.0.0.1")
    r = run_script(tmp_path, "job", LOCAL_JOB, env, state, "keep")
    got = result(r)
    try:
        assert got["mode"] == 0o600 and len(got["secret"]) == 64, got
        assert os.path.dirname(got["secret_file"]) == os.path.dirname(state)
        # The secret is on no command line and in no state file; the workers hold its path.
        for pid in got["worker_pids"]:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            assert got["secret"] not in cmd, cmd
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            assert f"PODIUM_SECRET_FILE={got['secret_file']}".encode() in environ
            assert not any(e.startswith(b"PODIUM_SECRET=") for e in environ)
        saved = Path(state).read_text()
        assert got["secret"] not in saved and json.loads(saved)["secret_file"] == \
            got["secret_file"], saved
        # A stranger without the secret is refused by the job's worker.
        stranger = run_script(tmp_path, "stranger", """
            import sys
            from podium.actor import attach_to_workers, enable_transport
            enable_transport("tcp://127.0.0.1:0")
            hosts = attach_to_workers(workers=[sys.argv[1]])
            try:
                hosts.initialized.get(timeout=30)
                print("attached?!")
            except Exception as e:
                print("REFUSED", e)
            """, env_without_secret(), got["workers"][0])
        assert "REFUSED" in stranger.stdout and "secret" in stranger.stdout, \
            stranger.stdout + stranger.stderr
        # SE-5: a new controller, with no secret in its environment, re-attaches through the
        # state file and kills the job, which removes the secret.
        again = run_script(tmp_path, "again", LOCAL_JOB, env, state, "kill")
        second = result(again)
        assert second["workers"] == got["workers"] and second["secret"] == got["secret"]
        assert "EXISTS_AFTER_KILL False" in again.stdout, again.stdout
    finally:
        if os.path.exists(state):
            from podium.job import job_load

            job_load(state).kill()
    assert gone_within(got["worker_pids"]) == []
    assert not os.path.exists(got["secret_file"])


def test_a_controller_already_running_on_another_secret_is_told_before_it_attaches(tmp_path):
    state = str(tmp_path / ".podium" / "job_state.json")
    env = env_without_secret(PODIUM_HOST_ADDR="127.0.0.1")
    first = result(run_script(tmp_path, "job", LOCAL_JOB, env, state, "keep"))
    try:
        r = run_script(tmp_path, "late", """
            import sys
            from podium.actor import this_host, enable_transport
            from podium.job import JobError, LocalJob
            enable_transport("tcp")
            this_host().spawn_procs(per_host={"gpus": 1}).initialized.get(timeout=30)
            try:
                LocalJob(hosts={"hosts": 1}).state(cached_path=sys.argv[1])
                print("attached?!")
            except JobError as e:
                print("JOBERROR", e)
            """, env, state)
        assert "JOBERROR" in r.stdout and first["secret_file"] in r.stdout, r.stdout + r.stderr
        assert "another secret" in r.stdout
    finally:
        from podium.job import job_load

        job_load(state).kill()
    assert gone_within(first["worker_pids"]) == []


# --- strangers on the wire, while legitimate calls run --------------------------------------

# The legitimate controller: ECHO_CONTROLLER's start, then an actor on 2 procs of the worker,
# READY, a wait for the attack to start, and argv[2] checked calls.
LOAD = ECHO_CONTROLLER + textwrap.dedent("""
    hosts = attach_to_workers(workers=[sys.argv[1]])
    hosts.initialized.get(timeout=30)
    echo = hosts.spawn_procs(per_host={"gpus": 2}).spawn("echo", Echo)
    echo.echo.call(0).get(timeout=30)
    print("READY", flush=True)
    sys.stdin.readline()  # the attack has started
    done = 0
    for i in range(int(sys.argv[2])):
        got = sorted(v for _, v in echo.echo.call(i).get(timeout=30).items())
        assert got == [i, i], (i, got)
        done += 1
    print("DONE", done, flush=True)
""")


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(5)
    return s


def _closed_by_peer(s: socket.socket) -> bool:
    """Whether the peer closed `s` (an EOF, or a reset for bytes it did not read)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def test_strangers_get_a_challenge_and_are_refused_while_every_legitimate_call_completes(
        tmp_path, secured):
    w, env, _ = secured
    sockets = []
    refused = 0
    with legitimate_calls(w, env, tmp_path):
        # A pickled payload in a frame, a garbage answer to the challenge, a bare connect
        # that says nothing: none is decoded, each is closed.
        payloads = [b"\x80\x04\x95" + os.urandom(200), os.urandom(64), b""]
        for payload in payloads * 10:
            s = _connect(w.port)
            challenge = _recv_exactly(s, 37)
            assert challenge[:5] == b"PDMA\x01", challenge
            if not payload:
                sockets.append(s)
                continue
            s.sendall(payload)
            try:
                verdict = _recv_exactly(s, 33)
            except ConnectionResetError:
                verdict = b""
            assert verdict in (b"", b"\x00" * 33), verdict
            assert _closed_by_peer(s)
            refused += 1
            s.close()
    for s in sockets:
        s.close()
    assert refused == 20
    log = w.output()
    assert "authentication failed" in log or "refused" in log, log


# --- HA-9, HA-10 ------------------------------------------------------------------------------

def test_a_controllers_lost_after_is_clamped_by_the_worker(tmp_path, secured):
    w, env, _ = secured
    r = run_script(tmp_path, "c", """
        import sys
        from podium.actor import attach_to_workers, enable_transport
        enable_transport("tcp://127.0.0.1:0")
        attach_to_workers(workers=[sys.argv[1]]).initialized.get(timeout=30)
        print("ATTACHED", flush=True)
        """, {**env, "PODIUM_HOST_LOST_MS": str(10 ** 12)}, w.address)
    assert "ATTACHED" in r.stdout, r.stdout + r.stderr
    eventually(lambda: w.saw("lost-after"), 10, "the worker's clamp warning")
    log = w.text()
    assert f"asked for a lost-after of {10 ** 12} ms; using 60000 ms" in log, log


def test_an_attach_the_controller_gave_up_on_is_not_adopted_later(tmp_path, secured):
    w, env, _ = secured
    os.killpg(w.proc.pid, signal.SIGSTOP)  # the attach waits in the socket, unanswered
    first = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from podium.actor import attach_to_workers, enable_transport
        enable_transport("tcp://127.0.0.1:0")
        hosts = attach_to_workers(workers=[sys.argv[1]])
        try:
            hosts.initialized.get(timeout=30)
            print("attached?!", flush=True)
        except Exception as e:
            print("GAVE UP", e, flush=True)
        time.sleep(60)  # alive, so a worker that adopted it would keep serving it
        """), w.address], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**env, "PODIUM_ATTACH_TIMEOUT_MS": "1000", "PODIUM_HOST_LOST_MS": "30000"})
    try:
        seen = eventually(lambda: _line_with(first, "GAVE UP"), 30, "the controller giving up")
        assert "no answer within 1.0 s" in seen, seen
        os.killpg(w.proc.pid, signal.SIGCONT)
        # The worker reads the late attach, then the detach behind it.
        eventually(lambda: w.saw("detached"), 20, "the worker undoing the late attach")
        r = run_script(tmp_path, "second", """
            import sys
            from podium.actor import attach_to_workers, enable_transport
            enable_transport("tcp://127.0.0.1:0")
            hosts = attach_to_workers(workers=[sys.argv[1]])
            try:
                hosts.initialized.get(timeout=30)
                print("ATTACHED", flush=True)
            except Exception as e:
                print("REFUSED", e, flush=True)
            """, env, w.address)
        assert "ATTACHED" in r.stdout, r.stdout + r.stderr + w.text()
    finally:
        try:
            os.killpg(w.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        first.kill()
        first.wait(timeout=10)


def _line_with(p: subprocess.Popen, text: str) -> str:
    """The next line of `p`'s output that holds `text` ("" at its end)."""
    for line in p.stdout:
        if text in line:
            return line
    return ""


def test_a_worker_refuses_a_spawn_of_more_procs_than_it_starts_per_request(tmp_path, secured):
    # HA-9: a count is checked before it is believed; the worker serves on.
    w, env, _ = secured
    r = run_script(tmp_path, "c", """
        hosts = attach_to_workers(workers=[sys.argv[1]])
        hosts.initialized.get(timeout=30)
        try:
            hosts.spawn_procs(per_host={"gpus": 5000}).initialized.get(timeout=30)
            print("spawned?!")
        except Exception as e:
            print("REFUSED", e)
        a = hosts.spawn_procs(per_host={"gpus": 1}).spawn("echo", Echo)
        print("GOT", a.echo.call_one(3).get(timeout=30))
        """, env, w.address, prelude=ECHO_CONTROLLER)
    assert "REFUSED" in r.stdout and "asked for 5000 procs" in r.stdout, r.stdout + r.stderr
    assert "1 to 4096" in r.stdout and "GOT 3" in r.stdout, r.stdout


# --- peers that lie about lengths, and peers that never finish a handshake -------------------

def _worker_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def test_an_insider_announcing_a_2_gib_header_costs_the_worker_nothing(tmp_path, secured):
    # The liar proves the secret (the worst case), then sends a frame prefix announcing a
    # ~2 GiB header: the worker refuses it from the prefix, allocating nothing, and every
    # legitimate call made meanwhile completes.
    from podium._src.bench_attack import LIAR_PREFIX, _prove

    w, env, path = secured
    secret = Path(path).read_text().strip().encode()
    liars = []
    with legitimate_calls(w, env, tmp_path):
        before = _worker_rss(w.proc.pid)
        for _ in range(20):
            s = _connect(w.port)
            assert _prove(s, secret)
            s.sendall(LIAR_PREFIX)
            liars.append(s)
    for s in liars:
        assert _closed_by_peer(s)
        s.close()
    grown = _worker_rss(w.proc.pid) - before
    assert grown < 64 * 2**20, f"the worker grew by {grown} bytes"
    log = w.output()
    assert "header" in log and "exceeds" in log, log


def test_a_half_open_flood_does_not_keep_a_controller_out(tmp_path, secured):
    # Hundreds of connections that never answer the challenge: those past the worker's cap are
    # closed at once, the rest at the handshake deadline, and a controller attaches meanwhile.
    w, env, _ = secured
    flood = [_connect(w.port) for _ in range(300)]
    try:
        closed = eventually(lambda: sum(1 for s in flood if _peer_closed_now(s)) >= 100, 10,
                            "the worker closing connections past its cap")
        assert closed
        r = run_script(tmp_path, "c", """
            import sys, time
            from podium.actor import Actor, endpoint, attach_to_workers, enable_transport
            class Echo(Actor):
                @endpoint
                def echo(self, x):
                    return x
            enable_transport("tcp://127.0.0.1:0")
            t = time.monotonic()
            hosts = attach_to_workers(workers=[sys.argv[1]])
            hosts.initialized.get(timeout=30)
            a = hosts.spawn_procs(per_host={"gpus": 1}).spawn("echo", Echo)
            got = [a.echo.call_one(i).get(timeout=30) for i in range(100)]
            print("DONE", got == list(range(100)), flush=True)
            """, env, w.address)
        assert "DONE True" in r.stdout, r.stdout + r.stderr
    finally:
        for s in flood:
            s.close()
    assert w.proc.poll() is None, "the worker died"


def _peer_closed_now(s: socket.socket) -> bool:
    """Whether the peer has closed `s` by now (reads and drops a pending challenge)."""
    s.setblocking(False)
    try:
        while True:
            data = s.recv(4096)
            if not data:
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        s.setblocking(True)


def test_a_malformed_message_fails_its_call_and_the_actor_serves_on(spawn):
    # EP-6: before, a message whose metadata did not unpickle failed the actor for good.
    from unittest import mock

    from podium.actor import Actor, ActorError, endpoint
    from podium._src import actor_mesh

    class Counter(Actor):
        def __init__(self):
            self.n = 0

        @endpoint
        def incr(self) -> int:
            self.n += 1
            return self.n

    c = spawn(Counter).slice(gpus=0)
    assert c.incr.call_one().get(timeout=30) == 1
    garbage = b"\x80\x05\x95not a pickle"
    with mock.patch.object(actor_mesh.Endpoint, "_meta", lambda self, rank=None: garbage):
        with pytest.raises(ActorError) as info:
            c.incr.call_one().get(timeout=30)
    assert "could not be decoded" in str(info.value) and "incr" in str(info.value), info.value
    assert c.incr.call_one().get(timeout=30) == 2  # the same actor, alive, its state kept
