"""podium.job end to end with the worker daemon (`python -m podium worker`): LocalJob and
SlurmJob (through the real one-node SLURM cluster) attach, spawn procs and an actor, call it,
and kill the job with no process left; a second controller process re-attaches to a running
LocalJob through the state file. Each controller is a program of its own (its own runtime,
on TCP, with a job secret); sockets stay on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from conftest import env_without_secret, gone_within, pid_alive

CONTROLLER_TIMEOUT_S = 90

# A controller: applies or re-attaches to JOB (an expression), spawns 2 procs per host and an
# actor on them, calls it, prints the answers and the job's workers, then kills the job
# unless told to leave it running.
CONTROLLER = r"""
import json, os, sys, time
from podium.actor import Actor, endpoint, enable_transport, current_rank
from podium.job import LocalJob, SlurmJob

class Where(Actor):
    @endpoint
    def where(self) -> tuple:
        return (current_rank().rank, os.getpid())

enable_transport("tcp")
job = {job}
state = job.state(cached_path={path!r})
hosts = getattr(state, {mesh!r})
hosts.initialized.get(timeout=30)
# Asked again, the job hands out the same (attached) host meshes.
assert getattr(job.state(cached_path={path!r}), {mesh!r}) is hosts
procs = hosts.spawn_procs(per_host={{"gpus": 2}})
actors = procs.spawn("where", Where)
answers = sorted(v for _, v in actors.where.call().get(timeout=30).items())
print("RESULT", json.dumps({{"job_id": job.job_id, "answers": answers,
                            "workers": job.workers,
                            "worker_pids": [w.pid for w in getattr(job, "_procs", [])]}}),
      flush=True)
if {kill!r}:
    job.kill()
    # Longer than PODIUM_HOST_LOST_MS: the procs the kill ended (and their workers) must not
    # come back as failures (JB-4), which would end this script with status 1.
    time.sleep(3.0)
"""


def _controller(tmp_path, name: str, job: str, path: str, mesh: str = "hosts",
                kill: bool = True, env: dict | None = None) -> dict:
    import json

    script = tmp_path / f"{name}.py"
    script.write_text(CONTROLLER.format(job=job, path=path, mesh=mesh, kill=kill))
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=CONTROLLER_TIMEOUT_S, stdin=subprocess.DEVNULL,
                         env={**env_without_secret(), "PODIUM_HOST_LOST_MS": "2000",
                              **(env or {})})
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert out.returncode == 0 and lines, f"{name} failed:\n{out.stdout}\n{out.stderr}"
    return json.loads(lines[0][len("RESULT "):])


def _worker_pids(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (a worker's listen address)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                cmd = open(f"/proc/{name}/cmdline", "rb").read().replace(b"\0", b" ").decode()
                state = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker in cmd and "podium" in cmd and state != "Z":
                pids.append(int(name))
    return pids


def _session(sid: int) -> list[int]:
    """Live processes of the session `sid` (a local worker leads one; its procs are in it)."""
    left = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[3]) == sid:
                left.append(int(name))
    return left


@pytest.fixture
def env():
    """Controller and workers: loopback addresses, and no secret in the environment: each job
    makes its own and a re-attaching controller finds it through the state file (SE-4, SE-5)."""
    return {"PODIUM_HOST_ADDR": "127.0.0.1"}


def test_local_job_runs_an_actor_on_two_hosts_and_kill_leaves_nothing(tmp_path, env):
    path = str(tmp_path / "state.json")
    r = _controller(tmp_path, "c1", 'LocalJob(hosts={"hosts": 2})', path, env=env)
    assert len(r["workers"]["hosts"]) == 2
    assert [a[0] for a in r["answers"]] == [0, 1, 2, 3]  # 2 hosts x 2 gpus
    proc_pids = [a[1] for a in r["answers"]]
    assert gone_within(proc_pids) == []
    assert len(r["worker_pids"]) == 2
    for sid in r["worker_pids"]:
        assert _session(sid) == []
    assert not os.path.exists(path)


def test_a_new_controller_reattaches_to_a_running_local_job(tmp_path, env):
    path = str(tmp_path / "state.json")
    # Workers outlive their controller and serve the next one (its procs are new: keeping
    # them too needs persistent workers).
    job = 'LocalJob(hosts={"hosts": 2})'
    first = _controller(tmp_path, "first", job, path, kill=False, env=env)
    second = None
    try:
        assert os.path.exists(path)
        # The first controller has exited; its workers run on, its procs are gone.
        assert all(_session(sid) for sid in first["worker_pids"])
        assert gone_within([a[1] for a in first["answers"]]) == []
        second = _controller(tmp_path, "second", job, path, env=env)
        assert second["job_id"] == first["job_id"] and second["workers"] == first["workers"]
        assert [a[0] for a in second["answers"]] == [0, 1, 2, 3]
        assert not os.path.exists(path)
    finally:
        # Whatever happened, end the workers the first controller left.
        if os.path.exists(path):
            from podium.job import job_load

            job_load(path).kill()
    for sid in first["worker_pids"]:
        assert _session(sid) == []
    assert second is not None
    assert gone_within([a[1] for a in second["answers"]]) == []


def test_slurm_job_runs_an_actor_and_kill_cancels_it(slurm_cluster, tmp_path, env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = str(tmp_path / "state.json")
    job = (f'SlurmJob(meshes={{"trainers": 1}}, monarch_port={port}, bind_to="127.0.0.1", '
           f'exclusive=False, log_dir={str(tmp_path)!r}, job_start_timeout=60)')
    r = _controller(tmp_path, "slurm", job, path, mesh="trainers",
                    env={**env, **{k: v for k, v in slurm_cluster.env().items()
                                   if k in ("SLURM_CONF", "PATH")}})
    assert r["workers"] == {"trainers": [f"tcp://127.0.0.1:{port}"]}
    assert [a[0] for a in r["answers"]] == [0, 1]
    from podium._src.job.slurm import job_info

    assert job_info(r["job_id"]).get("JobState") in ("CANCELLED", None)
    assert gone_within([a[1] for a in r["answers"]]) == []
    assert _worker_pids(f"127.0.0.1:{port}") == []


# A controller of a persistent LocalJob: the first spawns named procs and an actor that counts
# its calls, and leaves the job running; the next re-attaches through the state file and
# takes both over by name, then kills the job.
PERSISTENT_CONTROLLER = r"""
import json, os
from podium.actor import Actor, endpoint, enable_transport, current_rank
from podium.job import LocalJob

class Counted(Actor):
    def __init__(self):
        self.calls = 0

    @endpoint
    def where(self) -> tuple:
        self.calls += 1
        return (current_rank().rank, os.getpid(), self.calls)

enable_transport("tcp")
job = LocalJob(hosts={{"hosts": 2}}, persistent=True)
hosts = job.state(cached_path={path!r}).hosts
hosts.initialized.get(timeout=30)
if {first!r}:
    actors = hosts.spawn_procs(per_host={{"gpus": 2}}, name="trainers").spawn("counted", Counted)
else:
    actors = hosts.proc_mesh("trainers").actor_mesh("counted", Counted)
answers = sorted(v for _, v in actors.where.call().get(timeout=30).items())
print("RESULT", json.dumps({{"answers": answers,
                            "worker_pids": [w.pid for w in getattr(job, "_procs", [])]}}),
      flush=True)
if not {first!r}:
    job.kill()
"""


def test_a_persistent_local_job_keeps_procs_and_actors_for_the_next_controller(tmp_path, env):
    path = str(tmp_path / "state.json")

    def controller(name: str, first: bool) -> dict:
        import json

        script = tmp_path / f"{name}.py"
        script.write_text(PERSISTENT_CONTROLLER.format(path=path, first=first))
        out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                             text=True, timeout=CONTROLLER_TIMEOUT_S, stdin=subprocess.DEVNULL,
                             env={**env_without_secret(), **env})
        lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        assert out.returncode == 0 and lines, f"{name} failed:\n{out.stdout}\n{out.stderr}"
        return json.loads(lines[0][len("RESULT "):])

    first = controller("first", True)
    second = None
    try:
        pids = [a[1] for a in first["answers"]]
        assert [a[0] for a in first["answers"]] == [0, 1, 2, 3]
        assert all(pid_alive(p) for p in pids)  # the persistent workers kept them
        second = controller("second", False)
        # The same processes, the same actors: each has answered twice now.
        assert second["answers"] == [[r, p, 2] for r, p, _ in first["answers"]]
        assert not os.path.exists(path)
    finally:
        if os.path.exists(path):
            from podium.job import job_load

            job_load(path).kill()
    for sid in first["worker_pids"]:
        assert _session(sid) == []
    assert gone_within(pids) == []
