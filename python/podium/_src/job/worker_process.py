"""Local worker processes, started, recognised and ended by the C++ launcher
(cpp/podium/host/launcher.h, `podium._core.host`; its invariants WP-1..3).

A worker runs in a session of its own (it outlives the controller that started it, so a new
controller can re-attach), with its stdout and stderr appended to a log file. It writes its
address to the pipe named by PODIUM_READY_FD once it accepts connections (and prints
`podium worker listening on ...` to its log, for people); the launcher waits for that in C++
on the pipes and the workers' pidfds. A process is identified by (pid, start time), so a
reused pid is never taken for the worker; ending one is SIGTERM to its process group, then
SIGKILL to everything left in its session, timed in C++. This module converts: specs in,
WorkerProcess records out, C++ errors to JobError.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from podium._core import host as _host
from podium._src.errors import CoreError
from podium._src.job.error import JobError

# The line a worker prints once it listens (for people, and for SLURM jobs, whose workers run
# on other machines and are found in the job's output file: slurm.py).
LISTENING = re.compile(r"^podium worker listening on (tcp://\S+)\s*$", re.MULTILINE)


@dataclass
class WorkerProcess:
    pid: int
    start_time: int  # /proc/PID/stat field 22: tells this process from a later one with its pid
    address: str
    log: str

    def to_dict(self) -> Dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> "WorkerProcess":
        return cls(pid=int(d["pid"]), start_time=int(d["start_time"]),  # type: ignore[arg-type]
                   address=str(d["address"]), log=str(d["log"]))

    def alive(self) -> bool:
        return bool(_host.worker_alive(self.pid, self.start_time))


def launch(argvs: Sequence[Sequence[str]], env: Mapping[str, str], logs: Sequence[str],
           timeout: float, job_id: str) -> List[WorkerProcess]:
    """Starts one worker per argv (its output appended to the log of the same index) and
    waits at most `timeout` seconds for all of them to be ready (WP-1). On a failure none is
    left, and JobError names the job, the worker, its exit status or the timeout, and its
    log's tail."""
    pairs = sorted(env.items())
    # The launcher does not search PATH: a bare program name is looked up here.
    specs = [(argv[0] if "/" in argv[0] else (shutil.which(argv[0]) or argv[0]), list(argv),
              pairs, log) for argv, log in zip(argvs, logs)]
    try:
        ready = _host.launch_workers(job_id, specs, float(timeout))
    except (CoreError, ValueError) as e:
        raise JobError(_message(e, job_id), job_id) from None
    return [WorkerProcess(pid, start, address, log)
            for (pid, start, address), log in zip(ready, logs)]


def stop(pid: int, grace: float, start_time: Optional[int] = None,
         job_id: Optional[str] = None) -> None:
    """Ends worker `pid` and everything in its session, SIGKILL after `grace` seconds (WP-2);
    with `start_time`, only if the pid is still that process (WP-3). Raises JobError naming
    the processes that survived."""
    try:
        _host.stop_worker(pid, start_time, float(grace))
    except CoreError as e:
        raise JobError(_message(e, job_id), job_id) from None


def _message(e: BaseException, job_id: Optional[str]) -> str:
    text = getattr(e, "message", None) or str(e)
    return text if job_id is None or f"job {job_id}" in text else f"job {job_id}: {text}"


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""
