"""Workers for the benchmarks that need one on this machine (`podium bench attack`, `soak`):
a LocalJob of one host, so a benchmark starts, secures (SE-4) and ends its workers exactly as a
user's program does, with no launcher of its own."""

from __future__ import annotations

import os
from typing import Tuple

from podium._src.job.local import LocalJob


def start_local_worker() -> Tuple[LocalJob, str, int]:
    """A running LocalJob of one worker on 127.0.0.1: (the job, the worker's address, its pid).
    The job makes the secret unless the environment names one; `job.kill()` ends it."""
    job = LocalJob(hosts={"hosts": 1})
    job.apply()
    return job, job.workers["hosts"][0], job._procs[0].pid


def job_secret() -> bytes:
    """The secret this process's workers hold (PODIUM_SECRET_FILE, else PODIUM_SECRET), as
    podium reads it (docs/security.md)."""
    path = os.environ.get("PODIUM_SECRET_FILE")
    if path:
        with open(path, "rb") as f:
            return f.read().rstrip(b"\r\n")
    return os.environ.get("PODIUM_SECRET", "").encode()
