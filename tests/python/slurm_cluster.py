"""A real one-node SLURM cluster for tests: Debian's `slurm-wlm` and `munge`, started as
background daemons of the test run and stopped after it.

`SlurmCluster.start(directory)` writes a `slurm.conf` for this machine (its hostname, CPUs and
memory as `slurmd -C` reports them; `proctrack/linuxproc`, `task/none`, no cgroups, so it runs
in a container or VM without systemd), a fresh munge key, then starts `munged`, `slurmctld`
and `slurmd` in the foreground as children of the test process, with every state, spool,
socket, pid and log file under `directory` and ports picked free on loopback. It waits,
bounded, until `sinfo` reports the node idle. `stop()` ends the daemons it started (by their
pids: SIGTERM, then SIGKILL after a bound) and cancels the jobs left behind, so no daemon
outlives the test run.

Clients (`sbatch`, `srun`, `squeue`, `scontrol`, `scancel`) find the cluster through
`SLURM_CONF`: `cluster.env()` gives the variables to set, and `cluster.activate()` sets them
in this process so that code under test (podium.job.SlurmJob) runs the plain commands.

`unavailable_reason()` says why the cluster cannot start here (not root, binaries missing),
or None.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

# Bound on the cluster's start (the daemons come up in about a second on an idle machine; a
# loaded 2-core machine takes longer) and on each of its stops.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol",
            "scancel", "sinfo")


def unavailable_reason() -> Optional[str]:
    """Why a SLURM cluster cannot be started on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "the SLURM test cluster needs root (slurmd starts jobs as their user)"
    missing = [b for b in BINARIES if shutil.which(b, path=_search_path()) is None]
    if missing:
        return ("the SLURM test cluster needs Debian's slurm-wlm and munge packages "
                f"(missing: {', '.join(missing)}; `make setup` installs them)")
    return None


def _search_path() -> str:
    # The daemons live in /usr/sbin, which a non-login PATH may lack.
    return os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmClusterError(RuntimeError):
    pass


class SlurmCluster:
    """One controller and one compute node (this machine), all state under one directory."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.node = socket.gethostname().split(".")[0]
        self.partition = "podium"
        self.conf = self.dir / "etc" / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self._procs: dict[str, subprocess.Popen] = {}
        self._saved_env: Optional[dict[str, Optional[str]]] = None

    # --- start ------------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S) -> "SlurmCluster":
        reason = unavailable_reason()
        if reason is not None:
            raise SlurmClusterError(reason)
        deadline = time.monotonic() + timeout
        try:
            self._write_files()
            self._start_munged(deadline)
            self._spawn("slurmctld", [self._bin("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._spawn("slurmd", [self._bin("slurmd"), "-D", "-f", str(self.conf),
                                   "-N", self.node])
            self._wait_node_idle(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _bin(self, name: str) -> str:
        path = shutil.which(name, path=_search_path())
        assert path is not None  # unavailable_reason() checked
        return path

    def _write_files(self) -> None:
        for sub in ("etc", "munge", "state", "spool", "log", "run"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
            os.chmod(self.dir / sub, 0o700)
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o600)
        node_line = self._node_line()
        slurmctld_port, slurmd_port = _free_port(), _free_port()
        d = self.dir
        self.conf.write_text(f"""\
# Written by podium's tests (tests/python/slurm_cluster.py); removed after the run.
ClusterName=podiumtest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={slurmctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=300
{node_line} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    def _node_line(self) -> str:
        """`NodeName=... CPUs=... RealMemory=...` for this machine, as slurmd measures it."""
        out = subprocess.run([self._bin("slurmd"), "-C"], capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL)
        lines = [l for l in out.stdout.splitlines() if l.startswith("NodeName=")]
        if out.returncode != 0 or not lines:
            raise SlurmClusterError(f"`slurmd -C` failed (status {out.returncode}): "
                                    f"{out.stderr.strip() or out.stdout.strip()}")
        fields = [f for f in lines[0].split() if not f.startswith("NodeName=")]
        return f"NodeName={self.node} " + " ".join(fields)

    def _start_munged(self, deadline: float) -> None:
        m = self.dir / "munge"
        self._spawn("munged", [self._bin("munged"), "-F", "--force",
                               f"--socket={self.munge_socket}", f"--key-file={m}/munge.key",
                               f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
                               f"--seed-file={m}/munged.seed"])
        while not self.munge_socket.exists():
            self._check_alive("munged")
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"munged did not create {self.munge_socket} in time; "
                                        f"log:\n{self._tail(m / 'munged.log')}")
            time.sleep(0.05)

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / "log" / f"{name}.stdio", "wb")
        try:
            self._procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env(), start_new_session=True)
        finally:
            log.close()

    def _check_alive(self, name: str) -> None:
        p = self._procs[name]
        if p.poll() is not None:
            logs = [self.dir / "log" / f"{name}.stdio", self.dir / "log" / f"{name}.log",
                    self.dir / "munge" / "munged.log"]
            text = "\n".join(f"--- {f.name}:\n{self._tail(f)}" for f in logs if f.exists())
            raise SlurmClusterError(f"{name} exited with status {p.returncode}\n{text}")

    def _wait_node_idle(self, deadline: float) -> None:
        state = ""
        while True:
            for name in self._procs:
                self._check_alive(name)
            out = self.run("sinfo", "-h", "-N", "-n", self.node, "-o", "%T", check=False)
            state = (out.stdout.strip() or out.stderr.strip()).lower()
            if out.returncode == 0 and state in ("idle", "mixed", "allocated"):
                return
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    f"node {self.node} not idle within the start bound (sinfo: {state!r}); "
                    f"slurmctld log:\n{self._tail(self.dir / 'log' / 'slurmctld.log')}\n"
                    f"slurmd log:\n{self._tail(self.dir / 'log' / 'slurmd.log')}")
            time.sleep(0.2)

    @staticmethod
    def _tail(path: Path, lines: int = 20) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(cannot read {path}: {e})"

    # --- use --------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The environment of this process, plus what SLURM's clients need to reach the
        cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": _search_path()}

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0,
            input: Optional[str] = None) -> subprocess.CompletedProcess:
        """Runs a SLURM client command against this cluster, bounded."""
        out = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                             timeout=timeout, input=input,
                             stdin=None if input is not None else subprocess.DEVNULL)
        if check and out.returncode != 0:
            raise SlurmClusterError(f"`{' '.join(argv)}` failed (status {out.returncode}): "
                                    f"{out.stderr.strip()}")
        return out

    def activate(self) -> None:
        """Points this process's SLURM clients (SLURM_CONF, PATH) at the cluster until
        stop()."""
        if self._saved_env is None:
            self._saved_env = {k: os.environ.get(k) for k in ("SLURM_CONF", "PATH")}
        os.environ["SLURM_CONF"] = str(self.conf)
        os.environ["PATH"] = _search_path()

    def log(self, name: str) -> str:
        return self._tail(self.dir / "log" / f"{name}.log", 40)

    # --- stop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Cancels every job, then stops slurmd, slurmctld and munged (in that order) and
        waits for each; idempotent."""
        if self._procs.get("slurmctld") is not None and self._procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", "--full", "--partition", self.partition, check=False,
                         timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._wait_jobs_gone(deadline=time.monotonic() + STOP_TIMEOUT_S)
        for name in ("slurmd", "slurmctld", "munged"):
            p = self._procs.pop(name, None)
            if p is not None:
                _stop_process_group(p)
        if self._saved_env is not None:
            for k, v in self._saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            self._saved_env = None

    def _wait_jobs_gone(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                out = self.run("squeue", "-h", "-o", "%i %T", check=False, timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                return
            if out.returncode != 0 or not out.stdout.strip():
                return
            time.sleep(0.2)


def _stop_process_group(p: subprocess.Popen) -> None:
    """SIGTERM to the daemon's process group (it leads one: start_new_session), SIGKILL after
    STOP_TIMEOUT_S; reaps it."""
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    # The job steps slurmd started (slurmstepd and their tasks) lead sessions of their own;
    # scancel above ended them. Members of the daemon's own group that outlived it are
    # killed here.
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
