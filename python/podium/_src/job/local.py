"""LocalJob: every host of every mesh is a worker daemon on this machine
(`python -m podium worker --listen tcp://127.0.0.1:0`), a process of its own that outlives
the controller until kill(). Stands in for a cluster job in tests and on a workstation: a
script switches between LocalJob and SlurmJob by changing one line."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from podium._src.job import worker_process
from podium._src.job.base import _check_env, JobError, JobTrait
from podium._src.job.worker_process import WorkerProcess

KILL_GRACE_S = 5.0


class LocalJob(JobTrait):
    """Workers as local processes.

    Args:
        hosts: mesh names, one host each (Monarch's form: `("hosts",)`), or a dict of mesh
            name to number of hosts (`{"trainers": 2, "dataloaders": 1}`).
        python_exe: the Python that runs the workers (this one by default).
        listen_host: the address workers listen on (loopback by default); each picks a free
            port and prints it.
        persistent: start workers with `--persistent`: their procs and actors outlive a
            controller's exit, and the next controller takes them over by name
            (`HostMesh.proc_mesh`, `ProcMesh.actor_mesh`).
        env: variables added to the workers' environment (which is this process's). The
            workers share its PODIUM_SECRET_FILE / PODIUM_SECRET when set; otherwise the job
            makes a secret of its own (SE-4, docs/security.md).
        start_timeout: seconds for every worker to print its address.
        log_dir: where the workers' logs go (a new temporary directory by default, removed by
            kill()).
    """

    def __init__(self, hosts: Union[Sequence[str], Mapping[str, int]] = ("hosts",),
                 python_exe: Optional[str] = None, listen_host: str = "127.0.0.1",
                 persistent: bool = False, env: Optional[Mapping[str, str]] = None,
                 start_timeout: float = 60.0, log_dir: Optional[str] = None) -> None:
        super().__init__()
        if isinstance(hosts, str):
            raise TypeError("hosts is a sequence of mesh names or a dict of name to count, "
                            f"not the string {hosts!r}")
        counts = dict(hosts) if isinstance(hosts, Mapping) else {name: 1 for name in hosts}
        for name, n in counts.items():
            if not isinstance(name, str) or not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(
                    f"each mesh needs a name and a host count >= 1, got {name!r}: {n!r}")
        if not counts:
            raise ValueError("a LocalJob needs at least one mesh")
        _check_env(env)
        self._hosts = counts
        self._python_exe = python_exe or sys.executable
        self._listen_host = listen_host
        self._persistent = bool(persistent)
        self._env = dict(env or {})
        self._start_timeout = float(start_timeout)
        self._log_dir = log_dir
        self._procs: List[WorkerProcess] = []
        self._run_dir: Optional[str] = None  # logs, when this job made the directory

    _NOT_IDENTITY = frozenset({"start_timeout", "log_dir"})

    def _spec(self) -> Dict[str, Any]:
        return {"hosts": self._hosts, "python_exe": self._python_exe,
                "listen_host": self._listen_host, "persistent": self._persistent,
                "env": self._env, "start_timeout": self._start_timeout,
                "log_dir": self._log_dir}

    def _run_state(self) -> Dict[str, Any]:
        return {"workers": [w.to_dict() for w in self._procs], "run_dir": self._run_dir}

    def _load_run_state(self, run: Dict[str, Any]) -> None:
        self._procs = [WorkerProcess.from_dict(w) for w in run["workers"]]
        self._run_dir = run.get("run_dir")

    def _worker_argv(self) -> List[str]:
        argv = [self._python_exe, "-m", "podium", "worker", "--listen",
                f"tcp://{self._listen_host}:0"] + self._worker_flags()
        return argv + (["--persistent"] if self._persistent else [])

    def _create(self) -> None:
        job_id = f"local-{uuid.uuid4().hex[:12]}"
        if self._log_dir is not None:
            os.makedirs(self._log_dir, exist_ok=True)
            log_dir, self._run_dir = self._log_dir, None
        else:
            log_dir = self._run_dir = tempfile.mkdtemp(prefix=f"podium-{job_id}-")
        env = dict(os.environ)
        # A worker that listens on one address advertises its procs there too.
        if self._listen_host not in ("0.0.0.0", "::"):
            env["PODIUM_HOST_ADDR"] = self._listen_host
        env.update(self._env)
        env.update(self._worker_env())
        argvs, logs, names = [], [], []
        for name, n in self._hosts.items():
            for i in range(n):
                argvs.append(self._worker_argv())
                logs.append(os.path.join(log_dir, f"{job_id}-{name}-{i}.log"))
                names.append(name)
        try:
            # WP-1: on a failure no worker is left.
            procs = worker_process.launch(argvs, env, logs, self._start_timeout, job_id)
        except BaseException:
            self._remove_run_dir()
            raise
        self._procs = procs
        self._workers = {}
        for name, w in zip(names, procs):
            self._workers.setdefault(name, []).append(w.address)
        self._job_id = job_id

    def _gone(self) -> Optional[str]:
        dead = [w for w in self._procs if not w.alive()]
        if not self._procs:
            return "it has no workers"
        if dead:
            return (f"worker pid {dead[0].pid} ({dead[0].address}) is no longer running"
                    + (f", and {len(dead) - 1} more" if len(dead) > 1 else ""))
        return None

    def _kill(self) -> None:
        errors = []
        for w in self._procs:
            try:
                worker_process.stop(w.pid, KILL_GRACE_S, start_time=w.start_time)
            except JobError as e:
                errors.append(str(e))
        self._procs = []
        self._remove_run_dir()
        if errors:
            raise JobError(f"job {self._job_id}: " + "; ".join(errors), self._job_id)

    def _remove_run_dir(self) -> None:
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None
