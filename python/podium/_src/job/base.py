"""The job base (JobTrait), JobState, and the job state file.

A job is a specification (which meshes, how many hosts each, how to start workers) plus, once
applied, the running allocation: its job id and the address of every worker, by mesh. The
controller attaches to those workers (`podium.actor.attach_to_workers`), one HostMesh per mesh
name, as Monarch's `monarch.job` does.

The state file lets a new controller process re-attach to a job that is still running. It is
JSON (never pickle: loading it runs no code), written atomically with mode 0600:

    {"podium_job_state": 1, "kind": "LocalJob", "job_id": "...", "spec": {...},
     "meshes": {"hosts": ["tcp://127.0.0.1:40123", ...]}, "run": {...}}

`spec` is the constructor's arguments (a cached job is reused only for an equal spec), `run`
is what the kind needs to check and end the allocation (local pids, the SLURM job id),
`secret_file` the path of the secret the job made (job/secret.py, SE-4), or null when the
user manages it. The secret itself is never written here.

Invariants:
  JB-1 `state(cached_path)` trusts a state file only after the job kind confirms that the
       allocation it names is still running (`_gone()` is None) and that its spec equals this
       job's; otherwise the file is reported (a warning naming the job id and why) and
       replaced by a newly applied job.
  JB-2 Every wait of a job (workers starting, a scheduler starting the job, a kill) is bounded
       and its error names the job id and what was last seen.
  JB-3 `kill()` returns only after the job's processes are gone (or raises JobError naming
       what is left), and removes the state file it wrote when that file still names this
       job.
  JB-4 `kill()` first shuts down the HostMeshes that `state()` attached in this process
       (HostMesh.shutdown): the procs on them end as stopped, so ending the workers raises
       no supervision event in the controller that killed its own job; calls to their actors
       raise SupervisionError naming the shutdown.
  NB-2 A persistent job outlives the controller that started it when that controller ends
       cleanly (a notebook kernel restarted, a script that returns): a later controller
       with the same spec and state file re-attaches at once, and finds the same procs and
       actors, with their state, by name (examples/notebook.ipynb). ``job.dashboard()``
       serves the dashboard of whichever controller holds the job now.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Mapping, Optional, Type

from podium._src.dashboard import dashboard as _dashboard
from podium._src.job import secret
from podium._src.job.error import JobError
from podium._src.proc_mesh import attach_to_workers

logger = logging.getLogger("podium.job")

DEFAULT_JOB_PATH = ".podium/job_state.json"
_FORMAT_VERSION = 1
_KINDS: Dict[str, Type["JobTrait"]] = {}


class JobState:
    """The host meshes of a running job, one attribute per mesh name (`state.trainers`)."""

    def __init__(self, hosts: Dict[str, Any]) -> None:
        self._hosts = dict(hosts)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        try:
            return self._hosts[attr]
        except KeyError:
            available = ", ".join(sorted(self._hosts))
            raise AttributeError(
                f"'{attr}' is not a valid host mesh name. Available names: {available}"
            ) from None

    def __getitem__(self, name: str) -> Any:
        return self._hosts[name]

    def __repr__(self) -> str:
        return f"JobState(hosts={self._hosts})"


class JobTrait(ABC):
    """A job: `apply()` starts it (a no-op when it runs), `state()` attaches to its workers
    and returns their HostMeshes by mesh name, `kill()` ends it. Subclasses implement
    `_create`, `_gone`, `_kill`, `_spec` and `_run_state`/`_load_run_state`."""

    def __init__(self) -> None:
        self._job_id: Optional[str] = None
        self._workers: Dict[str, List[str]] = {}  # mesh name -> worker addresses
        self._state_path: Optional[str] = None  # the state file this job wrote
        self._attached: List[Any] = []  # the HostMeshes state() attached in this process
        self._state: Optional[JobState] = None  # what state() returned last
        self._secret_file: Optional[str] = None  # the secret this job made (SE-4)
        self._secret_dir: Optional[str] = None  # where apply() makes it (None: a temp dir)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _KINDS[cls.__name__] = cls

    # --- the public surface ---------------------------------------------------------------

    @property
    def active(self) -> bool:
        """True once applied (or loaded from a state file), until kill()."""
        return self._job_id is not None

    @property
    def job_id(self) -> Optional[str]:
        """The running allocation's id (the SLURM job id; a generated id for a LocalJob)."""
        return self._job_id

    @property
    def workers(self) -> Dict[str, List[str]]:
        """The worker addresses of each mesh (`{"hosts": ["tcp://h:p", ...]}`), once applied."""
        return {k: list(v) for k, v in self._workers.items()}

    def apply(self) -> None:
        """Starts the job as specified; a no-op when it is already running."""
        if self._job_id is None:
            made = None
            if not (secret.user_managed() or secret.insecure()):
                made = self._secret_file = secret.create(self._secret_dir)
            try:
                self._create()
            except BaseException:
                secret.remove(made)
                self._secret_file = None
                raise
            assert self._job_id is not None and self._workers, "_create sets both"

    def state(self, cached_path: Optional[str] = DEFAULT_JOB_PATH) -> JobState:
        """Attaches to the job's workers and returns their HostMeshes by mesh name.

        When the job is not running and `cached_path` names a state file of a job that still
        runs with the same spec, that job is adopted (a new controller re-attaching);
        otherwise (JB-1) the job is applied and its state written to `cached_path`.
        Called again, it returns the same HostMeshes while every host of them serves (a
        worker serves one host mesh of a controller at a time), and attaches anew otherwise."""
        if self._job_id is None:
            adopted = cached_path is not None and self._adopt(cached_path)
            if not adopted:
                if cached_path is not None:
                    self._secret_dir = os.path.dirname(os.path.abspath(cached_path))
                self.apply()
                if cached_path is not None:
                    self.dump(cached_path)
                    self._state_path = cached_path
        elif self._state is not None and all(
                h["failure"] is None for name in self._workers
                for h in self._state[name].hosts()):
            return self._state
        self._state = JobState(self._attach())
        return self._state

    def kill(self) -> None:
        """Ends the job and its workers (JB-3); a no-op when it is not running."""
        if self._job_id is None:
            return
        job_id = self._job_id
        # What this process runs on the job ends as stopped, not as failures: the procs'
        # deaths that ending the workers causes must not reach supervision (JB-4).
        attached, self._attached, self._state = self._attached, [], None
        for done in [hosts.shutdown() for hosts in attached]:  # in parallel: each is bounded
            done.get()
        self._kill()
        secret.remove(self._secret_file)
        self._secret_file = None
        if self._state_path is not None:
            try:
                if _read_json(self._state_path).get("job_id") == job_id:
                    os.remove(self._state_path)
            except (OSError, ValueError):
                pass
        self._job_id = None
        self._workers = {}
        self._state_path = None

    def dashboard(self, host: Optional[str] = None, port: Optional[int] = None) -> Any:
        """The job's web dashboard, served by this (the controller) process: as
        ``podium.dashboard()`` (docs/interactive.md). Returns it; ``.url`` is its address."""
        return _dashboard(host, port)

    def dump(self, filename: str) -> None:
        """Writes the job's state file (JSON, mode 0600, atomically)."""
        _write_private(filename, self.dumps())

    def dumps(self) -> bytes:
        return json.dumps(self._to_dict(), indent=1, sort_keys=True).encode()

    def can_run(self, spec: "JobTrait") -> bool:
        """Whether this (running) job can serve `spec`: same kind, same specification, still
        running."""
        return (type(spec) is type(self) and spec._identity() == self._identity()
                and self._gone() is None)

    # --- what a kind implements ----------------------------------------------------------

    @abstractmethod
    def _create(self) -> None:
        """Starts the allocation and its workers; sets _job_id and _workers (bounded, JB-2)."""

    @abstractmethod
    def _gone(self) -> Optional[str]:
        """None while the allocation runs; else why it is not running (for messages)."""

    @abstractmethod
    def _kill(self) -> None:
        """Ends the allocation; returns when its processes are gone (bounded, JB-2)."""

    @abstractmethod
    def _spec(self) -> Dict[str, Any]:
        """The constructor's arguments, JSON-able; the class is rebuilt from them."""

    # Spec entries that do not change the allocation (timeouts, log places): a job that
    # differs only in them re-attaches.
    _NOT_IDENTITY: frozenset = frozenset()

    def _identity(self) -> Dict[str, Any]:
        return {k: v for k, v in self._spec().items() if k not in self._NOT_IDENTITY}

    def _run_state(self) -> Dict[str, Any]:
        """What, beyond the job id and addresses, checks and ends the running allocation."""
        return {}

    def _load_run_state(self, run: Dict[str, Any]) -> None:
        pass

    # --- internals ------------------------------------------------------------------------

    def _worker_env(self) -> Dict[str, str]:
        """What the workers' environment needs for the job's secret (SE-4)."""
        return secret.worker_env(self._secret_file)

    def _worker_flags(self) -> List[str]:
        """`--insecure` when the user turned authentication off (PODIUM_INSECURE=1)."""
        return ["--insecure"] if secret.insecure() and not secret.user_managed() else []

    def _attach(self) -> Dict[str, Any]:
        meshes = {name: attach_to_workers(workers=list(addrs), name=name)
                  for name, addrs in self._workers.items()}
        self._attached.extend(meshes.values())
        return meshes

    def _adopt(self, path: str) -> bool:
        """Adopts the running job that the state file at `path` names, when it can serve this
        spec (JB-1); a file that cannot be trusted is reported and removed."""
        try:
            cached = job_load(path)
        except FileNotFoundError:
            return False
        except JobError as e:
            logger.warning("%s; ignoring it and starting a new job", e)
            _remove(path)
            return False
        gone = cached._gone()
        if gone is not None:
            logger.warning("job state file %s names %s job %s, which is gone (%s); "
                           "starting a new job", path, type(cached).__name__, cached.job_id, gone)
            try:  # what is left of it: the workers still alive, a requeued SLURM job
                cached._kill()
            except JobError as e:
                logger.warning("could not end what is left of job %s: %s", cached.job_id, e)
            secret.remove(cached._secret_file)
            _remove(path)
            return False
        if type(cached) is not type(self) or cached._identity() != self._identity():
            logger.warning("job state file %s names running %s job %s with a different spec; "
                           "killing it and starting a new job", path, type(cached).__name__,
                           cached.job_id)
            try:
                cached._kill()
            except JobError as e:
                logger.warning("could not kill the old job: %s", e)
            secret.remove(cached._secret_file)
            _remove(path)
            return False
        if cached._secret_file and not secret.user_managed():
            secret.use(cached._secret_file, who=f"{type(self).__name__} job {cached.job_id}")
        logger.info("re-attaching to %s job %s from %s", type(self).__name__, cached.job_id, path)
        self._job_id, self._workers = cached._job_id, cached._workers
        self._secret_file = cached._secret_file
        self._load_run_state(cached._run_state())
        self._state_path = path
        return True

    def _to_dict(self) -> Dict[str, Any]:
        if self._job_id is None:
            raise JobError(f"{type(self).__name__} is not running: apply() it before dump()")
        return {"podium_job_state": _FORMAT_VERSION, "kind": type(self).__name__,
                "job_id": self._job_id, "spec": self._spec(), "meshes": self._workers,
                "run": self._run_state(), "secret_file": self._secret_file}

    def __repr__(self) -> str:
        status = f"job {self._job_id}" if self._job_id else "not running"
        return f"<{type(self).__name__} {self._spec()} {status}>"


def job_loads(data: bytes) -> JobTrait:
    """The job a state file's contents describe (not checked for being alive: `state()`
    checks)."""
    try:
        d = json.loads(data)
    except ValueError as e:
        raise JobError(f"not a podium job state file (not JSON: {e})") from None
    return _from_dict(d)


def job_load(filename: str = DEFAULT_JOB_PATH) -> JobTrait:
    """The job that the state file `filename` describes; FileNotFoundError when there is
    none."""
    with open(filename, "rb") as f:
        data = f.read()
    try:
        job = job_loads(data)
    except JobError as e:
        raise JobError(f"job state file {filename}: {e}") from None
    job._state_path = filename  # kill() removes it
    return job


def _from_dict(d: Any) -> JobTrait:
    if not isinstance(d, dict) or d.get("podium_job_state") != _FORMAT_VERSION:
        raise JobError("not a podium job state file (no podium_job_state: "
                       f"{_FORMAT_VERSION} field)")
    kind = _KINDS.get(d.get("kind", ""))
    if kind is None:
        raise JobError(f"unknown job kind {d.get('kind')!r} (known: {', '.join(sorted(_KINDS))})")
    try:
        job = kind(**d["spec"])
        job._job_id = str(d["job_id"])
        job._workers = {str(k): [str(a) for a in v] for k, v in d["meshes"].items()}
        job._load_run_state(d.get("run", {}))
        secret_file = d.get("secret_file")
        job._secret_file = str(secret_file) if secret_file else None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise JobError(f"malformed {d.get('kind')} job state ({type(e).__name__}: {e})",
                       job_id=d.get("job_id")) from None
    return job


def _check_env(env: Optional[Mapping[str, str]]) -> None:
    """The secret, and a TLS private key given as PEM text, reach workers through the
    controller's environment, never through a job's `env`, which the state file (and a SLURM
    batch script) records. (A PODIUM_TLS_KEY that names a file is fine there.)"""
    for key, value in (env or {}).items():
        if key in ("PODIUM_SECRET", "PODIUM_SECRET_FILE") or (
                key in ("PODIUM_TLS_KEY", "PODIUM_TLS_CERT") and "-----BEGIN" in str(value)):
            raise ValueError(f"{key} is not passed in a job's env (the job state file records "
                             "env): set it in the controller's environment, which the "
                             "workers inherit")


def _read_json(path: str) -> Dict[str, Any]:
    with open(path, "rb") as f:
        return json.loads(f.read())


def _write_private(path: str, data: bytes) -> None:
    """Writes `data` to `path` atomically (a temporary file in the same directory, renamed),
    with mode 0600; creates the directory (0700) when missing."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".job_state.", dir=directory)  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
