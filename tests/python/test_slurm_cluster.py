"""The SLURM test cluster itself (tests/python/slurm_cluster.py): a real sbatch/srun runs
through it, and stopping it leaves no daemon and no job process behind."""

from __future__ import annotations

import os
import time
from pathlib import Path


import slurm_cluster as sc


def _wait_job_done(cluster: sc.SlurmCluster, job_id: str, timeout: float = 60.0) -> str:
    """Waits until the job left the queue; returns the last state seen."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        out = cluster.run("squeue", "-h", "-j", job_id, "-o", "%T %r", check=False)
        if out.returncode == 0 and not out.stdout.strip():
            return last
        last = out.stdout.strip() or out.stderr.strip()
        time.sleep(0.2)
    raise AssertionError(f"SLURM job {job_id} still queued after {timeout} s: {last}")


def _alive(pid: int) -> bool:
    """True for a live process (a zombie, dead but not reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sbatch_srun_runs_a_command_on_the_node(slurm_cluster, tmp_path):
    out_file = tmp_path / "job.out"
    script = ("#!/bin/bash\n"
              "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n"
              f"#SBATCH --output={out_file}\n"
              "srun bash -c 'echo task $SLURM_PROCID on $SLURMD_NODENAME'\n")
    sub = slurm_cluster.run("sbatch", "--parsable", input=script)
    job_id = sub.stdout.strip().split(";")[0]
    assert job_id.isdigit(), sub.stdout
    _wait_job_done(slurm_cluster, job_id)
    assert out_file.read_text().strip() == f"task 0 on {slurm_cluster.node}"
    # The node list of a job, as podium.job.SlurmJob reads it.
    hosts = slurm_cluster.run("scontrol", "show", "hostnames", slurm_cluster.node)
    assert hosts.stdout.split() == [slurm_cluster.node]


def test_stop_leaves_no_daemon_and_no_job_process(tmp_path):
    reason = sc.unavailable_reason()
    if reason is not None:
        from conftest import skip_or_fail

        skip_or_fail(reason)
    cluster = sc.SlurmCluster(tmp_path / "own")
    pid_file = tmp_path / "task.pid"
    try:
        cluster.start()
        script = ("#!/bin/bash\n"
                  f"#SBATCH --output={tmp_path}/job.out\n"
                  f"srun bash -c 'echo $$ > {pid_file}; exec sleep 300'\n")
        job_id = cluster.run("sbatch", "--parsable", input=script).stdout.strip()
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, (
                f"job {job_id} did not start its task: "
                f"{cluster.run('squeue', '-j', job_id, check=False).stdout}")
            time.sleep(0.1)
        task_pid = int(pid_file.read_text())
        daemons = [p.pid for p in cluster._procs.values()]
        assert _alive(task_pid) and all(_alive(p) for p in daemons)
    finally:
        cluster.stop()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in [task_pid, *daemons]) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in [task_pid, *daemons] if _alive(p)]
    assert not left, f"processes left after stop(): {left}"
    assert not cluster._procs


def test_cluster_files_are_under_its_directory(slurm_cluster):
    conf = slurm_cluster.conf.read_text()
    assert "ProctrackType=proctrack/linuxproc" in conf and "TaskPlugin=task/none" in conf
    assert os.environ["SLURM_CONF"] == str(slurm_cluster.conf)
    for line in conf.splitlines():
        if line.split("=")[0] in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldLogFile"):
            assert Path(line.split("=", 1)[1]).is_relative_to(slurm_cluster.dir), line
