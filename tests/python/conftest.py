"""Shared helpers of podium's Python tests. Tests run against the installed package
(`make setup` installs it), never against python/ of the source tree."""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

# Bound on every child process a test starts (pytest-timeout bounds the test as a whole).
CHILD_TIMEOUT_S = 60

# --- the test session's job secret -------------------------------------------------------------
# Workers refuse to start without a secret (SE-2, docs/security.md). As a user who starts
# workers by hand exports PODIUM_SECRET_FILE for every process of the job, the test session
# does so for this process and every process its tests start. Tests of the secret itself
# (test_security.py) run their processes with an environment of their own.
_SECRET_DIR = tempfile.mkdtemp(prefix="podium-test-secret-")
SECRET_FILE = os.path.join(_SECRET_DIR, "job.secret")
with open(os.open(SECRET_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as _f:
    _f.write(secrets.token_hex(32) + "\n")
os.environ["PODIUM_SECRET_FILE"] = SECRET_FILE
os.environ.pop("PODIUM_SECRET", None)
atexit.register(shutil.rmtree, _SECRET_DIR, True)


def env_without_secret(**extra: str) -> dict:
    """This process's environment without the job's secret (and with `extra`)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PODIUM_SECRET", "PODIUM_SECRET_FILE", "PODIUM_INSECURE")}
    env.update(extra)
    return env


# --- unhandled faults -------------------------------------------------------------------------
# The tests of this process are one controller: a failure that nobody supervises would end it
# (podium.actor.unhandled_fault_hook's default exits with status 1). Here the hook records the
# failure instead; tests that check the default run it in a controller process of their own.
FAULTS: list = []


def _record_fault(failure) -> None:
    FAULTS.append(failure)


import podium.actor  # noqa: E402  (installed package; see the module docstring)
from podium._src import netns  # noqa: E402

podium.actor.unhandled_fault_hook = _record_fault


@pytest.fixture
def faults():
    """The failures that reach this controller's unhandled-fault hook during the test."""
    start = len(FAULTS)

    class View:
        def __call__(self) -> list:
            return FAULTS[start:]

        def wait(self, n: int, timeout: float = 10.0) -> list:
            import time

            deadline = time.monotonic() + timeout
            while len(FAULTS) - start < n and time.monotonic() < deadline:
                time.sleep(0.01)
            return FAULTS[start:]

    return View()


@pytest.fixture
def run_podium():
    """Runs `python -m podium ARGS...` in a child process; returns the CompletedProcess."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "podium", *args],
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )

    return run


def run_script(directory, name: str, text: str) -> subprocess.CompletedProcess:
    """Writes `text` to DIRECTORY/NAME and runs it as its own program (its __main__), bounded."""
    script = directory / name
    script.write_text(text)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=directory,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )


# --- podium.actor fixtures ------------------------------------------------------------------
# Every fixture that starts procs or actors stops them when the test (or module) ends, even
# when it fails. Every wait is bounded.

WAIT_S = 30  # bound on a fixture's own waits


def _mesh_name(request: pytest.FixtureRequest, n: int) -> str:
    base = "".join(c if c.isalnum() or c in "-_" else "_" for c in request.node.name)
    return f"{base}-{n}"


@pytest.fixture(scope="module")
def procs():
    """One ProcMesh of extent {"gpus": 2} shared by the tests of a module."""
    from podium.actor import this_host

    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        pm.initialized.get(timeout=WAIT_S)
        yield pm
    finally:
        pm.stop().get(timeout=WAIT_S)


@pytest.fixture
def new_procs():
    """Spawns ProcMeshes of the test's own (new_procs(gpus=3)); stops them afterwards."""
    from podium.actor import this_host

    meshes = []

    def spawn(**per_host: int):
        pm = this_host().spawn_procs(per_host=per_host)
        meshes.append(pm)
        return pm

    yield spawn
    for pm in meshes:
        pm.stop().get(timeout=WAIT_S)


@pytest.fixture
def spawn(request):
    """spawn(Class, *args, on=proc_mesh, **kwargs): an actor mesh with a name unique to the
    test, on the module's procs (the `procs` fixture, started on first use) unless `on` says
    otherwise; stopped after the test. The one actor fixture of the suite."""
    meshes = []

    def do(Class, *args, on=None, **kwargs):
        mesh = (on if on is not None else request.getfixturevalue("procs")).spawn(
            _mesh_name(request, len(meshes)), Class, *args, **kwargs
        )
        meshes.append(mesh)
        return mesh

    yield do
    for mesh in meshes:
        try:
            mesh.stop().get(timeout=WAIT_S)
        except Exception:  # a test that failed or killed its actors: they are gone already
            pass


# --- multi-host fixtures: a SLURM cluster, network namespaces ---------------------------------
# Both need root and Debian packages (`make setup` installs them). Where they are missing the
# tests that use them skip with the reason, except in CI (CI=true), which has both: there a
# missing part fails the test instead of hiding it.


def pid_alive(pid: int) -> bool:
    """Whether the process `pid` runs (a zombie does not)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_within(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Waits until none of pids is alive; returns those still alive at the bound."""
    import time

    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if pid_alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (CI=true: CI machines must have it)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real one-node SLURM cluster (tests/python/slurm_cluster.py), shared by the session,
    with this process's SLURM clients pointed at it; stopped (daemons and jobs) at the end."""
    import slurm_cluster as sc

    reason = sc.unavailable_reason()
    if reason is not None:
        skip_or_fail(reason)
    cluster = sc.SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        cluster.activate()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def network():
    """network(n) -> netns.Network of n hosts (podium/_src/netns.py); every network made is
    deleted after the test, also when it fails. What killed runs left behind is removed
    first."""
    reason = netns.unavailable_reason()
    if reason is not None:
        skip_or_fail(reason)
    netns.remove_stale()
    made = []

    def make(n_hosts: int, subnet=None):
        made.append(netns.Network(n_hosts, subnet=subnet))
        return made[-1]

    try:
        yield make
    finally:
        for n in made:
            n.close()


# --- workers started by hand -----------------------------------------------------------------

WORKER_READY = "podium worker listening on "


def eventually(cond, timeout: float, what: str):
    """Polls `cond` until it returns something true and returns that; fails naming `what` at
    the bound."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def free_port() -> int:
    """A TCP port free on loopback now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Program:
    """`text` written to DIRECTORY/NAME and run with `args`, in a session of its own (killed
    with its procs at close), stdout and stderr together; a thread collects its lines.
    `stdin`: subprocess.DEVNULL, or subprocess.PIPE for a test that writes to it."""

    def __init__(self, directory, name: str, text: str, args: tuple = (), env: dict | None = None,
                 stdin=subprocess.DEVNULL) -> None:
        import threading

        script = directory / name
        script.write_text(text)
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args], cwd=directory, stdin=stdin,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **(env or {})}, start_new_session=True)
        self.lines: list = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def line(self, prefix: str, timeout: float = 60) -> str:
        """The first line starting with `prefix`, waiting for it; fails if the program ends
        without printing one."""
        def find():
            for line in list(self.lines):
                if line.startswith(prefix):
                    return line.rstrip("\n")
            if self.proc.poll() is not None:
                self.reader.join(timeout=10)  # its last lines may still be in the pipe
                if not any(x.startswith(prefix) for x in list(self.lines)):
                    pytest.fail(f"the program ended ({self.proc.returncode}) without "
                                f"'{prefix}':\n{self.output()}")
            return None

        return eventually(find, timeout, f"'{prefix}' from the program:\n{self.output()}")

    def output(self) -> str:
        return "".join(self.lines)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)


class Worker:
    """A `python -m podium worker` on `host` (or another command that prints the ready line),
    in a session of its own; kill() ends it with its procs. Its environment is `base_env`
    (this process's by default) with `env` on top. A thread collects what it prints, stdout
    and stderr together, in `lines`."""

    def __init__(self, env: dict | None = None, host: str = "127.0.0.1",
                 argv: list | None = None, persistent: bool = False, flags: tuple = (),
                 base_env: dict | None = None) -> None:
        import threading

        argv = argv or ([sys.executable, "-m", "podium", "worker", "--listen", f"tcp://{host}:0",
                         *flags] + (["--persistent"] if persistent else []))
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env={**(os.environ if base_env is None else base_env), **(env or {})},
            start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            ready = eventually(lambda: self._ready() or self.proc.poll() is not None, 30,
                               "the worker's ready line")
        except BaseException:
            self.kill()
            raise
        if ready is not True:
            self.kill()
            raise RuntimeError(f"worker did not start: {self.output()}")

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def _ready(self) -> bool:
        for line in list(self.lines):
            if line.startswith(WORKER_READY):
                self.address = line[len(WORKER_READY):].strip()
                tail = self.address.rsplit(":", 1)[-1]
                self.port = int(tail) if tail.isdigit() else None  # None: an ipc:// worker
                return True
        return False

    def saw(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def text(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)

    def output(self) -> str:
        """Everything it printed (it is killed first)."""
        self.kill()
        self._reader.join(timeout=10)
        return self.text()

