"""Local worker processes: start one, learn its address, check it is the same process later
(from another controller process too), and end it with everything it started.

A worker runs in a session of its own (it outlives the controller that started it, so a new
controller can re-attach). Its stdout and stderr go to a log file; the worker prints
`podium worker listening on tcp://ADDR:PORT` there once it accepts connections, and start()
polls the file for that line (a pipe would break, or block the worker, once the controller
that read it exits).

A process is identified by (pid, start time in clock ticks since boot, /proc/PID/stat field
22), so a reused pid is never taken for the worker. Ending a worker: SIGTERM to its process
group, then, after a grace period, SIGKILL to every process still in its session; procs the
worker started in process groups of their own stay in its session, so none is orphaned.

Invariants:
  WP-1 start() returns only once the worker printed its address, or raises JobError with the
       log's tail, and then no process of the attempt is left.
  WP-2 stop() returns only when no live process of the worker's session is left, or raises
       JobError naming the pids that are.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from podium._src.job.base import JobError

LISTENING = re.compile(r"^podium worker listening on (tcp://\S+)\s*$", re.MULTILINE)
_POLL_S = 0.02
_ORPHAN_GRACE_S = 0.5


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
        stat = _stat(self.pid)
        return stat is not None and stat[0] != "Z" and int(stat[19]) == self.start_time


def start(argv: Sequence[str], env: Mapping[str, str], log: str) -> "subprocess.Popen[bytes]":
    """Starts argv in a session of its own, stdout and stderr to `log`; returns at once (wait
    for the address with wait_listening)."""
    with open(log, "ab") as out:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True, close_fds=True)


def wait_listening(procs: Sequence["subprocess.Popen[bytes]"], logs: Sequence[str],
                   deadline: float, job_id: str) -> List[WorkerProcess]:
    """Waits until each worker printed its address (WP-1); on an exit or at the deadline, ends
    them all and raises JobError naming the job and the worker's log."""
    found: List[Optional[WorkerProcess]] = [None] * len(procs)
    try:
        while True:
            for i, (p, log) in enumerate(zip(procs, logs)):
                if found[i] is not None:
                    continue
                m = LISTENING.search(_read(log))
                if m:
                    stat = _stat(p.pid)
                    if stat is None:
                        raise JobError(f"job {job_id}: worker pid {p.pid} exited right after "
                                       f"it started listening; log {log}:\n{_tail(log)}", job_id)
                    found[i] = WorkerProcess(p.pid, int(stat[19]), m.group(1), log)
                elif p.poll() is not None:
                    raise JobError(f"job {job_id}: worker `{' '.join(map(str, p.args))}` "
                                   f"exited with status {p.returncode} before it listened; "
                                   f"log {log}:\n{_tail(log)}", job_id)
            if all(found):
                return [w for w in found if w is not None]
            if time.monotonic() > deadline:
                late = [logs[i] for i, w in enumerate(found) if w is None]
                raise JobError(f"job {job_id}: {len(late)} worker(s) did not print "
                               f"'podium worker listening on ...' in time; log {late[0]}:\n"
                               f"{_tail(late[0])}", job_id)
            time.sleep(_POLL_S)
    except BaseException:
        for p in procs:
            stop_session(p.pid, grace=1.0, popen=p)
        raise


def stop_session(sid: int, grace: float, popen: "Optional[subprocess.Popen[bytes]]" = None,
                 start_time: Optional[int] = None) -> None:
    """Ends the session led by `sid` (WP-2): SIGTERM to its leader's process group, SIGKILL
    to every member left after `grace` seconds. With `start_time`, the leader is signalled
    only when it is that process (the pid was not reused)."""
    leader = _stat(sid)
    if leader is not None and start_time is not None and int(leader[19]) != start_time:
        # The pid was reused. It cannot be while the old session has members (the kernel
        # keeps a pid that is a session id), so the old session is empty: nothing to end.
        return
    if leader is not None and leader[0] != "Z":
        _signal_group(sid, signal.SIGTERM)
        # The worker ends its procs on SIGTERM; procs left once it has gone (and had a moment
        # to finish) are orphans, and get no more of the grace period.
        deadline = time.monotonic() + grace
        while (members := _session_members(sid)) and time.monotonic() < deadline:
            _reap(popen)
            if sid not in members:
                deadline = min(deadline, time.monotonic() + _ORPHAN_GRACE_S)
            time.sleep(_POLL_S)
    for pid in _session_members(sid):
        _kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while True:
        _reap(popen)
        left = _session_members(sid)
        if not left:
            break
        if time.monotonic() > deadline:
            raise JobError(f"processes of worker session {sid} survived SIGKILL: {left}")
        time.sleep(_POLL_S)
    if popen is not None:
        try:
            popen.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass


def _reap(popen: "Optional[subprocess.Popen[bytes]]") -> None:
    if popen is not None:
        popen.poll()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _session_members(sid: int) -> List[int]:
    """Live (not zombie) processes of session `sid`."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _stat(int(name))
        if stat is not None and stat[0] != "Z" and int(stat[3]) == sid:
            members.append(int(name))
    return members


def _stat(pid: int) -> Optional[List[str]]:
    """/proc/PID/stat's fields from the state on (field 3 at index 0), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _tail(path: str, lines: int = 20) -> str:
    return "\n".join(_read(path).splitlines()[-lines:]) or "(empty)"
