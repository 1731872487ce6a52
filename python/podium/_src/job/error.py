"""JobError: the one exception of podium.job (apart from base.py so that secret.py, which
base.py imports, can raise it too)."""

from __future__ import annotations

from typing import Optional


class JobError(RuntimeError):
    """A job could not be started, found, attached to or stopped; the message names the job
    (`job_id`) and what was seen."""

    def __init__(self, message: str, job_id: Optional[str] = None) -> None:
        super().__init__(message)
        self.job_id = job_id
