"""SlurmJob against the real one-node SLURM cluster (tests/python/slurm_cluster.py): the batch
script, and every way a job can fail to come up, each a bounded error naming the job id and
its state (JB-2), with the job cancelled after. The run with the worker daemon is in
test_job_e2e.py."""

from __future__ import annotations

import logging
import time

import pytest

from podium.job import JobError, SlurmJob, job_load
from podium._src.job.slurm import job_info


def _ended(job_id: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job_info(job_id).get("JobState", "GONE")
        if state != "PENDING" and state != "RUNNING":
            return state
        time.sleep(0.2)
    raise AssertionError(f"SLURM job {job_id} still queued")


def test_batch_script_runs_one_worker_per_node(tmp_path):
    job = SlurmJob(meshes={"trainers": 3, "dl": 1}, python_exe="/opt/py", monarch_port=4242,
                   partition="p", time_limit="1:00:00", log_dir=str(tmp_path),
                   bind_to="10.0.0.5", env={"A": "b c"}, slurm_args=["--constraint=x"])
    script = job.batch_script()
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=p",
                 "#SBATCH --time=1:00:00", "#SBATCH --exclusive", "#SBATCH --constraint=x",
                 f"#SBATCH --output={tmp_path}/slurm-%j-podium_job.out", "export A='b c'",
                 "export PODIUM_HOST_ADDR=10.0.0.5",
                 "exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 /opt/py -u -m podium "
                 "worker --listen tcp://10.0.0.5:4242"):
        assert line in script.splitlines(), (line, script)


def test_more_nodes_than_the_cluster_has_fails_at_once(slurm_cluster, tmp_path):
    job = SlurmJob(meshes={"hosts": 2}, log_dir=str(tmp_path), exclusive=False)
    t0 = time.monotonic()
    with pytest.raises(JobError, match=r"SLURM job \d+ cannot run as submitted: state "
                                       r"PENDING, reason PartitionNodeLimit") as e:
        job.apply()
    assert time.monotonic() - t0 < 15  # not the default 300 s start bound
    assert _ended(e.value.job_id) == "CANCELLED" and not job.active


def test_a_job_that_does_not_start_in_time_names_its_state_and_is_cancelled(
        slurm_cluster, tmp_path):
    job = SlurmJob(meshes={"hosts": 1}, log_dir=str(tmp_path), exclusive=False,
                   slurm_args=["--begin=now+3600"], job_start_timeout=1.5)
    t0 = time.monotonic()
    with pytest.raises(JobError, match=r"SLURM job (\d+) did not start within 1.5 s: "
                                       r"state PENDING, reason BeginTime") as e:
        job.apply()
    assert time.monotonic() - t0 < 15
    assert e.value.job_id is not None and _ended(e.value.job_id) == "CANCELLED"
    assert not job.active


def test_a_worker_that_cannot_start_fails_the_job_with_its_output(slurm_cluster, tmp_path):
    job = SlurmJob(meshes={"hosts": 1}, log_dir=str(tmp_path), exclusive=False,
                   python_exe=str(tmp_path / "no-such-python"), ready_timeout=60)
    with pytest.raises(JobError, match=r"(?s)SLURM job \d+ ended (before it ran|while its "
                                       r"workers started).*no-such-python") as e:
        job.apply()
    assert _ended(e.value.job_id) in ("FAILED", "CANCELLED", "COMPLETED", "GONE")
    assert not job.active


def test_a_state_file_naming_an_ended_job_is_not_trusted(slurm_cluster, tmp_path, caplog):
    sub = slurm_cluster.run("sbatch", "--parsable", f"--output={tmp_path}/o", "--wrap", "true")
    job_id = sub.stdout.strip()
    _ended(job_id)
    stale = SlurmJob(meshes={"hosts": 1}, log_dir=str(tmp_path), exclusive=False,
                     python_exe=str(tmp_path / "no-such-python"))
    stale._job_id, stale._workers = job_id, {"hosts": ["tcp://127.0.0.1:1"]}
    path = tmp_path / "state.json"
    stale.dump(str(path))
    assert job_load(str(path))._gone().startswith("its state is COMPLETED")
    job = SlurmJob(meshes={"hosts": 1}, log_dir=str(tmp_path), exclusive=False,
                   python_exe=str(tmp_path / "no-such-python"))
    with caplog.at_level(logging.WARNING, logger="podium.job"):
        with pytest.raises(JobError, match="no-such-python"):
            job.state(cached_path=str(path))
    assert f"names SlurmJob job {job_id}, which is gone (its state is COMPLETED" in caplog.text
    assert not path.exists()
