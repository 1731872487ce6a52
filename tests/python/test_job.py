"""podium.job without the worker daemon: the state file (JB-1), local worker processes
(WP-1, WP-2, WP-3; the C++ launcher, cpp/podium/host/launcher.h) driven through a stand-in
worker program, failure paths of LocalJob and their
bounded errors (JB-2), and kill() from a controller that did not start the workers (JB-3).
The end-to-end tests with the real worker are in test_job_e2e.py."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
import time

import pytest

from podium.job import JobError, JobState, LocalJob, SlurmJob, job_load, job_loads
from podium._src.job import worker_process
from podium._src.job.worker_process import WorkerProcess

# Stands in for `podium worker` where only the process protocol matters: starts a child in a
# process group of its own (as the worker starts its procs), writes its address to
# PODIUM_READY_FD as the worker does once it listens, then sleeps. With "stubborn" it
# ignores SIGTERM.
FAKE_WORKER = r"""
import os, signal, socket, subprocess, sys, time
if "stubborn" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
child = subprocess.Popen(["sleep", "300"], preexec_fn=os.setpgrp)
print(f"child {child.pid}", flush=True)
fd = int(os.environ.pop("PODIUM_READY_FD"))
os.write(fd, f"tcp://127.0.0.1:{s.getsockname()[1]}\n".encode()); os.close(fd)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _child_pid(log: str) -> int:
    for line in open(log).read().splitlines():
        if line.startswith("child "):
            return int(line.split()[1])
    raise AssertionError(f"no child line in {log}")


@pytest.fixture
def fake_worker(tmp_path):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    return [sys.executable, str(script)]


# --- local worker processes -------------------------------------------------------------------


def _launch(argv, log, job_id, timeout=30.0):
    [w] = worker_process.launch([argv], os.environ, [log], timeout, job_id)
    return w


@pytest.mark.parametrize("stubborn", [False, True], ids=["polite", "ignores-sigterm"])
def test_worker_address_then_stop_leaves_no_process(fake_worker, tmp_path, stubborn):
    """WP-1, WP-2: the address comes through the worker's ready fd; stopping it ends the
    worker and the child it started in another process group, SIGKILL after the grace."""
    argv = fake_worker + (["stubborn"] if stubborn else [])
    log = str(tmp_path / "w.log")
    w = _launch(argv, log, "job-x")
    assert w.address.startswith("tcp://127.0.0.1:") and w.alive() and w.log == log
    child = _child_pid(log)
    assert _alive(child)
    t0 = time.monotonic()
    worker_process.stop(w.pid, 0.5, start_time=w.start_time)
    assert not _alive(w.pid) and not _alive(child) and not w.alive()
    assert time.monotonic() - t0 < 5.0


def test_worker_that_exits_early_is_reported_with_its_log(tmp_path):
    """WP-1."""
    log = str(tmp_path / "w.log")
    with pytest.raises(JobError, match=r"job job-y: worker .* exited with status 3 before it "
                                       r"was ready; log .*\n.*boom"):
        _launch([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], log, "job-y")


def test_worker_that_never_listens_times_out_and_is_ended(tmp_path):
    """WP-1: the error names the job, the worker, the timeout and its log's tail."""
    log = str(tmp_path / "w.log")
    t0 = time.monotonic()
    with pytest.raises(JobError, match=r"job job-z: worker .*\(pid (\d+)\) did not write its "
                                       r"address .* within 1000 ms .*\n.*starting") as info:
        _launch([sys.executable, "-c", "import time; print('starting', flush=True);"
                 " time.sleep(300)"], log, "job-z", timeout=1.0)
    assert time.monotonic() - t0 < 5.0
    pid = int(re.search(r"\(pid (\d+)\)", str(info.value)).group(1))
    assert not _alive(pid)


def test_a_bare_program_name_is_found_in_path(tmp_path):
    with pytest.raises(JobError, match=r"job job-p: worker `false` .* exited with status 1"):
        _launch(["false"], str(tmp_path / "w.log"), "job-p")


def test_a_reused_pid_is_not_taken_for_the_worker(fake_worker, tmp_path):
    """WP-3."""
    log = str(tmp_path / "w.log")
    w = _launch(fake_worker, log, "job-r")
    try:
        other = WorkerProcess(w.pid, w.start_time + 1, w.address, w.log)
        assert not other.alive()
        # A stop aimed at the older process with that pid touches nothing.
        worker_process.stop(w.pid, 0.1, start_time=w.start_time + 1)
        assert w.alive()
    finally:
        worker_process.stop(w.pid, 1.0, start_time=w.start_time)


# --- the state file ---------------------------------------------------------------------------


def _running_local_job(workers: list[WorkerProcess], hosts=("hosts",)) -> LocalJob:
    """A LocalJob as a state file would describe it, over the given processes."""
    job = LocalJob(hosts=hosts)
    job._job_id = "local-test"
    job._procs = workers
    job._workers = {"hosts": [w.address for w in workers]}
    return job


def test_state_file_is_private_json_and_round_trips(tmp_path):
    job = _running_local_job([WorkerProcess(123, 456, "tcp://127.0.0.1:5000", "/x.log")],
                             hosts={"hosts": 1})
    path = tmp_path / "sub" / "job_state.json"
    job.dump(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    d = json.loads(path.read_text())
    assert d["kind"] == "LocalJob" and d["job_id"] == "local-test"
    assert d["meshes"] == {"hosts": ["tcp://127.0.0.1:5000"]}
    # The state file names where the job's secret is (here: none made), never the secret.
    assert d["secret_file"] is None
    assert "PODIUM_SECRET" not in path.read_text()
    back = job_load(str(path))
    assert isinstance(back, LocalJob) and back.job_id == "local-test"
    assert back.workers == job.workers and back._spec() == job._spec()
    assert back._procs == job._procs
    assert [f for f in os.listdir(path.parent) if f != "job_state.json"] == []  # no temp left


def test_slurm_job_state_round_trips():
    job = SlurmJob(meshes={"trainers": 2, "dl": 1}, partition="gpu", monarch_port=4000)
    job._job_id, job._workers = "77", {"trainers": ["tcp://a:4000", "tcp://b:4000"],
                                       "dl": ["tcp://c:4000"]}
    back = job_loads(job.dumps())
    assert isinstance(back, SlurmJob) and back.job_id == "77"
    assert back._spec() == job._spec() and back.workers == job.workers


@pytest.mark.parametrize("text,match", [
    (b"not json", "not JSON"),
    (b'{"x": 1}', "no podium_job_state"),
    (b'{"podium_job_state": 1, "kind": "K8sJob"}', "unknown job kind 'K8sJob'"),
    (b'{"podium_job_state": 1, "kind": "LocalJob", "spec": {"hosts": ["h"]}}', "malformed"),
])
def test_bad_state_files_are_refused(tmp_path, text, match):
    path = tmp_path / "s.json"
    path.write_bytes(text)
    with pytest.raises(JobError, match=match):
        job_load(str(path))


def test_dump_before_apply_is_an_error(tmp_path):
    with pytest.raises(JobError, match="not running"):
        LocalJob().dump(str(tmp_path / "s.json"))


def test_job_state_names_meshes():
    s = JobState({"trainers": "T"})
    assert s.trainers == "T" and s["trainers"] == "T"
    with pytest.raises(AttributeError, match="Available names: trainers"):
        s.nope


def test_spec_is_checked():
    with pytest.raises(ValueError):
        LocalJob(hosts={"hosts": 0})
    with pytest.raises(TypeError):
        LocalJob(hosts="hosts")
    with pytest.raises(ValueError, match="ntasks_per_node must be 1"):
        SlurmJob(meshes={"a": 1}, ntasks_per_node=2)


# --- LocalJob failure paths, stale files, re-attach and kill ------------------------------------


def test_local_job_whose_worker_fails_reports_it_and_leaves_nothing(tmp_path):
    """JB-2: a worker that cannot start fails apply() with the job id and the worker's
    output; no process and no state file is left."""
    job = LocalJob(hosts={"hosts": 2}, python_exe="/bin/false")
    path = tmp_path / "state.json"
    with pytest.raises(JobError,
                       match=r"job local-\w+: worker .*/bin/false.* exited with status 1"):
        job.state(cached_path=str(path))
    assert not job.active and not path.exists()


def test_stale_state_file_is_reported_and_replaced(tmp_path, caplog):
    """JB-1: a state file whose workers are gone is not trusted: a warning names the job and
    why, the file is removed, and a new job is applied (here it fails: /bin/false)."""
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    stale = _running_local_job([WorkerProcess(dead.pid, 1, "tcp://127.0.0.1:1", "/x")])
    path = tmp_path / "state.json"
    stale.dump(str(path))
    assert (job_load(str(path))._gone()
            == f"worker pid {dead.pid} (tcp://127.0.0.1:1) is no longer running")
    job = LocalJob(python_exe="/bin/false")
    with caplog.at_level(logging.WARNING, logger="podium.job"):
        with pytest.raises(JobError, match="exited with status 1"):
            job.state(cached_path=str(path))
    assert "names LocalJob job local-test, which is gone (worker pid" in caplog.text
    assert not path.exists()


def test_corrupt_state_file_is_reported_and_replaced(tmp_path, caplog):
    path = tmp_path / "state.json"
    path.write_text("{")
    with caplog.at_level(logging.WARNING, logger="podium.job"):
        with pytest.raises(JobError, match="exited with status 1"):
            LocalJob(python_exe="/bin/false").state(cached_path=str(path))
    assert "not a podium job state file" in caplog.text and not path.exists()


def test_another_controller_adopts_and_kills_running_workers(fake_worker, tmp_path):
    """JB-1, JB-3: workers started by a controller that has exited are adopted through the
    state file by a new one, whose kill() ends them and their children and removes the
    file."""
    path = tmp_path / "state.json"
    starter = f"""
import os, sys, time
sys.path.insert(0, {os.path.dirname(__file__)!r})
from podium._src.job import worker_process
from test_job import _running_local_job
logs = [{str(tmp_path / 'a.log')!r}, {str(tmp_path / 'b.log')!r}]
ws = worker_process.launch([{fake_worker!r}] * 2, os.environ, logs, 30, "job-s")
_running_local_job(ws, hosts={{"hosts": 2}}).dump({str(path)!r})
"""
    out = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    saved = job_load(str(path))
    pids = [w.pid for w in saved._procs]
    children = [_child_pid(str(tmp_path / n)) for n in ("a.log", "b.log")]
    assert all(_alive(p) for p in pids + children)  # they outlived their controller
    job = LocalJob(hosts={"hosts": 2})
    try:
        assert job._adopt(str(path)) and job.job_id == "local-test"
        assert job.workers == saved.workers
    finally:
        job.kill()
    assert not any(_alive(p) for p in pids + children)
    assert not path.exists() and not job.active


def test_a_different_spec_does_not_adopt(fake_worker, tmp_path, caplog):
    log = str(tmp_path / "w.log")
    w = _launch(fake_worker, log, "job-d")
    child = _child_pid(log)
    path = tmp_path / "state.json"
    _running_local_job([w]).dump(str(path))
    try:
        job = LocalJob(hosts={"other": 1})
        with caplog.at_level(logging.WARNING, logger="podium.job"):
            assert not job._adopt(str(path))
        assert "with a different spec; killing it" in caplog.text
        assert not _alive(w.pid) and not _alive(child) and not path.exists()
    finally:
        worker_process.stop(w.pid, 1.0, start_time=w.start_time)


def test_timeouts_and_log_places_do_not_stop_a_reattach(fake_worker, tmp_path):
    log = str(tmp_path / "w.log")
    w = _launch(fake_worker, log, "job-t")
    path = tmp_path / "state.json"
    _running_local_job([w]).dump(str(path))
    try:
        job = LocalJob(start_timeout=5, log_dir=str(tmp_path / "logs"))
        assert job._adopt(str(path)) and job.job_id == "local-test"
    finally:
        worker_process.stop(w.pid, 1.0, start_time=w.start_time)
    # A job loaded from its file removes that file when killed.
    assert path.exists()
    job_load(str(path)).kill()
    assert not path.exists()


@pytest.mark.parametrize("key", ["PODIUM_SECRET", "PODIUM_SECRET_FILE"])
def test_the_secret_is_never_part_of_a_job(key):
    with pytest.raises(ValueError, match="controller's environment"):
        LocalJob(env={key: "x"})
    with pytest.raises(ValueError, match="controller's environment"):
        SlurmJob(meshes={"a": 1}, env={key: "x"})
