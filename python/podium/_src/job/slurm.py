"""SlurmJob: `sbatch` a script whose `srun` starts one podium worker per node; the job's node
list gives the workers' addresses; kill() is `scancel`.

The controller runs SLURM's client commands (sbatch, scontrol, scancel), so it must run where
they work (a login node, or inside an allocation). Nodes are split among the meshes in the
order of the job's node list. A node's address is its NodeAddr (`scontrol show node`, which
is its hostname unless the cluster says otherwise); its worker listens on `monarch_port` (the
name Monarch uses). Every wait is bounded and its error names the job id, its state and
SLURM's reason (JB-2).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from podium._src.job.base import _check_env, JobError, JobTrait, logger
from podium._src.job.worker_process import _read, LISTENING

# Job states after which a job runs no more (JobState= of `scontrol show job`).
_ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
          "OUT_OF_MEMORY", "PREEMPTED", "SPECIAL_EXIT", "TIMEOUT", "REVOKED"}
# Reasons of a pending job that mean it can never run as submitted: failing at once beats
# waiting out job_start_timeout.
_NEVER = {"BadConstraints", "InvalidAccount", "InvalidQOS", "PartitionNodeLimit",
          "PartitionTimeLimit"}
_CMD_TIMEOUT_S = 30.0
_POLL_S = 0.5
DEFAULT_START_TIMEOUT_S = 300.0
DEFAULT_READY_TIMEOUT_S = 60.0
KILL_TIMEOUT_S = 60.0


class SlurmJob(JobTrait):
    """One worker per node of a SLURM job.

    Args:
        meshes: mesh name -> number of nodes (`{"trainers": 4, "dataloaders": 1}`).
        python_exe: the Python that runs the workers on the nodes (this one by default: a
            shared filesystem or the same image).
        slurm_args: extra `sbatch` options, one per element (`["--constraint=h100"]`).
        monarch_port: the TCP port every worker listens on.
        job_name, time_limit, partition, log_dir, exclusive, gpus_per_node, cpus_per_task,
        mem, account, qos: the `#SBATCH` options of the same names (None: the cluster's
            default). log_dir holds the job's output (default: the working directory).
        ntasks_per_node: must be 1 (one worker per node); kept for Monarch's signature.
        job_start_timeout: seconds to wait for SLURM to start the job (default 300).
        bind_to: the IP address workers listen on (default all of the node's addresses).
        persistent: start workers with `--persistent`: their procs and actors outlive a
            controller's exit, for the next controller to take over by name.
        env: variables exported to the workers (sbatch passes the controller's environment
            too, PODIUM_SECRET included, unless slurm_args say otherwise).
        ready_timeout: seconds, once the job runs, for every worker to print its address in
            the job's output file (when that file is visible here: a shared filesystem).
    """

    def __init__(self, meshes: Mapping[str, int], python_exe: Optional[str] = None,
                 slurm_args: Sequence[str] = (), monarch_port: int = 22222,
                 job_name: str = "podium_job", ntasks_per_node: int = 1,
                 time_limit: Optional[str] = None, partition: Optional[str] = None,
                 log_dir: Optional[str] = None, exclusive: bool = True,
                 gpus_per_node: Optional[int] = None, cpus_per_task: Optional[int] = None,
                 mem: Optional[str] = None, job_start_timeout: Optional[float] = None,
                 account: Optional[str] = None, qos: Optional[str] = None,
                 bind_to: Optional[str] = None, persistent: bool = False,
                 env: Optional[Mapping[str, str]] = None,
                 ready_timeout: float = DEFAULT_READY_TIMEOUT_S) -> None:
        super().__init__()
        meshes = dict(meshes)
        for name, n in meshes.items():
            if not isinstance(name, str) or not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(
                    f"each mesh needs a name and a node count >= 1, got {name!r}: {n!r}")
        if not meshes:
            raise ValueError("a SlurmJob needs at least one mesh")
        if ntasks_per_node != 1:
            raise ValueError("podium runs one worker per node: ntasks_per_node must be 1 "
                             "(the worker spawns the procs of that node)")
        _check_env(env)
        self._meshes = meshes
        self._python_exe = python_exe or sys.executable
        self._slurm_args = list(slurm_args)
        self._port = int(monarch_port)
        self._job_name = job_name
        self._time_limit = time_limit
        self._partition = partition
        self._log_dir = os.path.abspath(log_dir if log_dir is not None else os.getcwd())
        self._exclusive = bool(exclusive)
        self._gpus_per_node = gpus_per_node
        self._cpus_per_task = cpus_per_task
        self._mem = mem
        self._job_start_timeout = job_start_timeout
        self._account = account
        self._qos = qos
        self._bind_to = bind_to
        self._persistent = bool(persistent)
        self._env = dict(env or {})
        self._ready_timeout = float(ready_timeout)
        self._output: Optional[str] = None  # the job's output file

    def add_mesh(self, name: str, num_nodes: int) -> None:
        """Adds a mesh to the spec (before apply())."""
        if self.active:
            raise JobError("add_mesh() on a running job: kill() it first", self.job_id)
        self._meshes[name] = num_nodes

    _NOT_IDENTITY = frozenset({"log_dir", "job_start_timeout", "ready_timeout"})

    def _spec(self) -> Dict[str, Any]:
        return {"meshes": self._meshes, "python_exe": self._python_exe,
                "slurm_args": self._slurm_args, "monarch_port": self._port,
                "job_name": self._job_name, "time_limit": self._time_limit,
                "partition": self._partition, "log_dir": self._log_dir,
                "exclusive": self._exclusive, "gpus_per_node": self._gpus_per_node,
                "cpus_per_task": self._cpus_per_task, "mem": self._mem,
                "job_start_timeout": self._job_start_timeout, "account": self._account,
                "qos": self._qos, "bind_to": self._bind_to, "persistent": self._persistent,
                "env": self._env, "ready_timeout": self._ready_timeout}

    def _run_state(self) -> Dict[str, Any]:
        return {"output": self._output}

    def _load_run_state(self, run: Dict[str, Any]) -> None:
        self._output = run.get("output")

    # --- the batch script -------------------------------------------------------------------

    def batch_script(self) -> str:
        """The script apply() submits (for reading; `%j` is SLURM's job id)."""
        nodes = sum(self._meshes.values())
        out = os.path.join(self._log_dir, f"slurm-%j-{self._job_name}.out")
        d = [f"--job-name={self._job_name}", f"--nodes={nodes}", "--ntasks-per-node=1",
             f"--output={out}", f"--error={out}"]
        for flag, value in (("time", self._time_limit), ("partition", self._partition),
                            ("gpus-per-node", self._gpus_per_node),
                            ("cpus-per-task", self._cpus_per_task), ("mem", self._mem),
                            ("account", self._account), ("qos", self._qos)):
            if value is not None:
                d.append(f"--{flag}={value}")
        if self._exclusive:
            d.append("--exclusive")
        d += self._slurm_args
        lines = ["#!/bin/bash"] + [f"#SBATCH {shlex.quote(x)}" for x in d]
        for k, v in {**self._env, **self._worker_env()}.items():  # a path, never the secret
            lines.append(f"export {k}={shlex.quote(v)}")
        if self._bind_to is not None:
            lines.append(f"export PODIUM_HOST_ADDR={shlex.quote(self._bind_to)}")
        host = self._bind_to if self._bind_to is not None else "0.0.0.0"
        worker = [self._python_exe, "-u", "-m", "podium", "worker", "--listen",
                  f"tcp://{host}:{self._port}"] + self._worker_flags() \
            + (["--persistent"] if self._persistent else [])
        # One task per node; the job ends when any worker fails.
        lines.append("exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 "
                     + " ".join(shlex.quote(a) for a in worker))
        return "\n".join(lines) + "\n"

    # --- lifecycle --------------------------------------------------------------------------

    def _create(self) -> None:
        os.makedirs(self._log_dir, exist_ok=True)
        sub = _slurm("sbatch", "--parsable", input=self.batch_script())
        job_id = sub.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise JobError(f"sbatch printed no job id: {sub.stdout!r} {sub.stderr!r}")
        logger.info("submitted SLURM job %s", job_id)
        self._output = os.path.join(self._log_dir, f"slurm-{job_id}-{self._job_name}.out")
        try:
            nodes = self._wait_running(job_id)
            addrs = _node_addresses(nodes)
            self._wait_ready(job_id, len(nodes))
        except BaseException:
            _cancel(job_id)
            raise
        workers: Dict[str, List[str]] = {}
        i = 0
        for name, n in self._meshes.items():
            workers[name] = [f"tcp://{addrs[node]}:{self._port}" for node in nodes[i:i + n]]
            i += n
        self._workers, self._job_id = workers, job_id

    def _wait_running(self, job_id: str) -> List[str]:
        """Waits (bounded) until the job runs; returns its nodes in node-list order."""
        timeout = (self._job_start_timeout if self._job_start_timeout is not None
                   else DEFAULT_START_TIMEOUT_S)
        deadline = time.monotonic() + timeout
        while True:
            info = job_info(job_id)
            state = info.get("JobState", "UNKNOWN")
            if state == "RUNNING":
                nodes = _hostnames(info.get("NodeList", ""))
                want = sum(self._meshes.values())
                if len(nodes) != want:
                    raise JobError(f"SLURM job {job_id} runs on {len(nodes)} nodes "
                                   f"({', '.join(nodes)}), {want} were asked for", job_id)
                return nodes
            if state in _ENDED or not info:
                raise JobError(f"SLURM job {job_id} ended before it ran: state {state}, "
                               f"reason {info.get('Reason', '?')}{self._output_tail()}", job_id)
            if state == "PENDING" and info.get("Reason") in _NEVER:
                raise JobError(f"SLURM job {job_id} cannot run as submitted: state PENDING, "
                               f"reason {info['Reason']} (cancelled)", job_id)
            if time.monotonic() > deadline:
                raise JobError(f"SLURM job {job_id} did not start within {timeout:g} s: "
                               f"state {state}, reason {info.get('Reason', '?')} (cancelled)",
                               job_id)
            time.sleep(_POLL_S)

    def _wait_ready(self, job_id: str, n: int) -> None:
        """Waits (bounded) until n workers printed their address in the job's output, when
        that file is visible from here; stops early if the job ends."""
        assert self._output is not None
        deadline = time.monotonic() + self._ready_timeout
        while True:
            text = _read(self._output)
            if len(LISTENING.findall(text)) >= n:
                return
            info = job_info(job_id)
            if info.get("JobState") != "RUNNING":
                raise JobError(f"SLURM job {job_id} ended while its workers started: state "
                               f"{info.get('JobState', 'UNKNOWN')}, reason "
                               f"{info.get('Reason', '?')}{self._output_tail()}", job_id)
            if time.monotonic() > deadline:
                if not os.path.exists(self._output):
                    logger.info("SLURM job %s: its output %s is not visible here (no shared "
                                "filesystem?); attaching without waiting for the workers",
                                job_id, self._output)
                    return
                raise JobError(f"SLURM job {job_id}: {n - len(LISTENING.findall(text))} of "
                               f"{n} workers did not print their address within "
                               f"{self._ready_timeout:g} s{self._output_tail()}", job_id)
            time.sleep(_POLL_S / 5)

    def _output_tail(self) -> str:
        if self._output is None or not os.path.exists(self._output):
            return ""
        tail = "\n".join(_read(self._output).splitlines()[-20:])
        return f"; output {self._output}:\n{tail}"

    def _gone(self) -> Optional[str]:
        if self._job_id is None:
            return "it was never submitted"
        info = job_info(self._job_id)
        state = info.get("JobState")
        if state is None:
            return "SLURM no longer knows it"
        if state != "RUNNING":
            return f"its state is {state}, reason {info.get('Reason', '?')}"
        return None

    def _kill(self) -> None:
        assert self._job_id is not None
        _cancel(self._job_id)
        logger.info("cancelled SLURM job %s", self._job_id)


# --- SLURM's commands -------------------------------------------------------------------------


def _slurm(*argv: str, input: Optional[str] = None,
           check: bool = True) -> subprocess.CompletedProcess:
    try:
        out = subprocess.run(list(argv), input=input, capture_output=True, text=True,
                             timeout=_CMD_TIMEOUT_S,
                             stdin=None if input is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        raise JobError(f"`{argv[0]}` not found: SlurmJob needs SLURM's commands on PATH") from None
    except subprocess.TimeoutExpired:
        raise JobError(f"`{' '.join(argv)}` did not answer within {_CMD_TIMEOUT_S:g} s") from None
    if check and out.returncode != 0:
        raise JobError(f"`{' '.join(argv)}` failed (status {out.returncode}): "
                       f"{out.stderr.strip()}")
    return out


def job_info(job_id: str) -> Dict[str, str]:
    """`scontrol show job -o ID` as a dict (JobState, Reason, NodeList, ...); {} when SLURM
    no longer knows the job."""
    out = _slurm("scontrol", "show", "job", "-o", job_id, check=False)
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:
            return {}
        raise JobError(f"`scontrol show job {job_id}` failed: {out.stderr.strip()}", job_id)
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))


def _hostnames(nodelist: str) -> List[str]:
    if not nodelist or nodelist == "(null)":
        return []
    return _slurm("scontrol", "show", "hostnames", nodelist).stdout.split()


def _node_addresses(nodes: List[str]) -> Dict[str, str]:
    """Node name -> NodeAddr (how SLURM itself reaches the node)."""
    out = _slurm("scontrol", "show", "node", "-o", ",".join(nodes)).stdout
    addrs = {}
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "NodeName" in fields:
            addrs[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return {n: addrs.get(n, n) for n in nodes}


def _cancel(job_id: str) -> None:
    """scancel, then waits (bounded) until the job's processes are gone: it has left the
    running and completing states (JB-3)."""
    _slurm("scancel", job_id, check=False)
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while True:
        info = job_info(job_id)
        state = info.get("JobState")
        if state is None or (state in _ENDED and not _completing(job_id)):
            return
        if time.monotonic() > deadline:
            raise JobError(f"SLURM job {job_id} still {state} {KILL_TIMEOUT_S:g} s after "
                           "scancel", job_id)
        time.sleep(_POLL_S / 2)


def _completing(job_id: str) -> bool:
    """Whether SLURM still ends the job's processes (the COMPLETING flag that squeue shows)."""
    out = _slurm("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
    return out.returncode == 0 and "COMPLETING" in out.stdout


