"""The job's secret (docs/security.md, SE-4): every process of a job proves it on every TCP
connection (channel CH-8), and a job launcher makes one when the user gave none.

Where the secret comes from, in order:
  1. ``PODIUM_SECRET_FILE`` or ``PODIUM_SECRET`` in the controller's environment: the user
     manages it; the workers inherit the variable.
  2. Otherwise the job makes one: 256 random bits in a file of mode 0600, in a 0700 directory
     next to the job's state file (``.podium/`` by default, which a SLURM job's nodes see on a
     shared file system) or a new private temporary directory. Workers get its path in
     ``PODIUM_SECRET_FILE`` through their environment, never on a command line, and the state
     file records the path (never the secret), so a later controller re-attaches with it.
     When the controller's runtime already runs on a secret it generated itself (SE-1), the
     job writes that one, so the controller and its workers share it.
  3. ``PODIUM_INSECURE=1``: the user turned authentication off; workers start ``--insecure``.

Invariants:
  SE-4 A job started by a launcher (LocalJob, SlurmJob) is authenticated without the user
       doing anything: its workers refuse every connection that does not prove the job's
       secret, and the secret never appears on a command line or in the state file.
  SE-5 A controller re-attaching to a running job uses the job's secret; if its runtime
       already runs on another one, state() raises JobError naming the secret file, instead of
       attaching workers that would refuse it.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from typing import Dict, Optional

from podium._core import mesh as _mesh
from podium._src import runtime
from podium._src.job.error import JobError

ENV_KEYS = ("PODIUM_SECRET", "PODIUM_SECRET_FILE")


def user_managed() -> bool:
    """True when the controller's environment names the secret (case 1)."""
    return any(os.environ.get(k) for k in ENV_KEYS)


def insecure() -> bool:
    return os.environ.get("PODIUM_INSECURE") == "1"


def _runtime_secret() -> Optional[bytes]:
    """The secret the running runtime generated (SE-1), or None."""
    path = _mesh.secret_file()
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read().strip()


def create(directory: Optional[str]) -> str:
    """Writes a new job secret (case 2) and returns its path. `directory`: where the state file
    lives (None: a new private temporary directory)."""
    if directory is None:
        directory = tempfile.mkdtemp(prefix="podium-job-")  # mode 0700
    else:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    value = _runtime_secret() if runtime.running() else None
    if value is None:
        value = secrets.token_hex(32).encode()
    fd, path = tempfile.mkstemp(prefix="job-", suffix=".secret", dir=directory)  # 0600
    with os.fdopen(fd, "wb") as f:
        f.write(value + b"\n")
    use(path, who="the new job")
    return path


def use(path: str, who: str) -> None:
    """Makes this controller use the secret in `path` (SE-5): before its runtime starts, by
    setting PODIUM_SECRET_FILE; once it runs, only if it runs on that secret already."""
    try:
        with open(path, "rb") as f:
            value = f.read().strip()
    except OSError as e:
        raise JobError(f"{who}: cannot read the job's secret file {path}: {e}") from None
    if not runtime.running():
        os.environ["PODIUM_SECRET_FILE"] = os.path.abspath(path)
        return
    if _runtime_secret() != value:
        raise JobError(
            f"{who}: the job's secret is in {path}, and podium already runs in this process "
            f"with another secret: call job.state() before anything starts podium here, or "
            f"start this program with PODIUM_SECRET_FILE={path}")


def worker_env(path: Optional[str]) -> Dict[str, str]:
    """What a worker's environment needs for the job's secret."""
    return {"PODIUM_SECRET_FILE": os.path.abspath(path)} if path else {}


def remove(path: Optional[str]) -> None:
    if not path:
        return
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    # A private temporary directory made for it goes too, when nothing else is left in it.
    parent = os.path.dirname(path)
    if os.path.basename(parent).startswith("podium-job-"):
        try:
            os.rmdir(parent)
        except OSError:
            pass
