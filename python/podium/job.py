"""podium.job: start the hosts of a job and attach to them, compatible with Monarch's
``monarch.job``.

A job is a specification of host meshes (``{"trainers": 4}``) and how to start a podium
worker on each host: ``LocalJob`` (worker processes on this machine) or ``SlurmJob`` (sbatch
and srun, one worker per node). ``job.state()`` starts the job when needed and returns its
HostMeshes by mesh name; the job's state file (``DEFAULT_JOB_PATH``) lets a new controller
process re-attach to a job that is still running; ``job.kill()`` ends it.

    job = SlurmJob(meshes={"trainers": 2}, partition="gpu")
    trainers = job.state().trainers          # a HostMesh of extent {"hosts": 2}
    procs = trainers.spawn_procs(per_host={"gpus": 8})
    ...
    job.kill()
"""

from podium._src.job.base import (
    DEFAULT_JOB_PATH,
    job_load,
    job_loads,
    JobError,
    JobState,
    JobTrait,
)
from podium._src.job.local import LocalJob
from podium._src.job.slurm import SlurmJob
from podium._src.compat import hosts_from_config

__all__ = [
    "DEFAULT_JOB_PATH",
    "JobError",
    "JobState",
    "JobTrait",
    "LocalJob",
    "SlurmJob",
    "hosts_from_config",
    "job_load",
    "job_loads",
]
