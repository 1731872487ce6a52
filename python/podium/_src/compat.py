"""The rest of ``monarch.actor``'s public names, as podium provides them: ChannelTransport,
Uid and ProcId, returns_future, attach, shutdown_context, the worker loops
(start_worker_loop_forever, run_worker_loop_until_shutdown), hosts_from_config, and the older
spelling ``proc_mesh(gpus=N)``.

  PN-1 podium.actor exports every name of Monarch's monarch.actor (0.7.0), debug_controller
    (the debugger, podium.debugger) included; tests/python/monarch_actor_names.txt lists them.
  PN-2 ``proc_mesh(gpus=N, hosts=H, env=E, setup=S)`` returns, at once, a ProcMesh of extent
    {"hosts": H, "gpus": N} on this host whose procs have E in os.environ and ran S before
    any actor; it is awaitable (``await proc_mesh(...)``, once its procs are up) and has
    ``get()``, as the futures of Monarch's older examples.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import enum
import functools
import inspect
import math
import os
import secrets
import threading
import warnings
from typing import Any, Callable, Coroutine, Dict, Optional, TypeVar

from podium._src import proc_mesh as _proc_mesh
from podium._src import runtime
from podium._src.future import CoroFuture, Future, resolved
from podium._src.job.local import LocalJob
from podium._src.proc_mesh import ProcMesh, this_host
from podium._src.worker import run_worker_loop_forever

T = TypeVar("T")


# --- ChannelTransport -------------------------------------------------------------------------


class ChannelTransport(enum.Enum):
    """How processes talk, as Monarch's enum; ``enable_transport(ChannelTransport.X)`` takes
    a member. podium serves ``TcpWithHostname`` (TCP on this machine's address),
    ``TcpWithLocalhost`` (TCP on 127.0.0.1) and ``Unix``/``Local`` (Unix sockets, one host);
    TLS comes with TCP when ``PODIUM_TLS_*`` is set (docs/security.md), so the TLS members
    raise ValueError in enable_transport."""

    TcpWithLocalhost = "tcp(localhost)"
    TcpWithHostname = "tcp(hostname)"
    MetaTlsWithHostname = "metatls(hostname)"
    MetaTlsWithIpV6 = "metatls(ipv6)"
    Tls = "tls"
    Local = "local"
    Unix = "unix"


# --- Uid, ProcId ------------------------------------------------------------------------------

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def _b58(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 58)
        out = _B58[r] + out
        if n == 0:
            return out


def _from_b58(text: str) -> int:
    n = 0
    for c in text:
        i = _B58.find(c)
        if i < 0:
            raise ValueError(f"not a base-58 digit: {c!r}")
        n = n * 58 + i
    if n >= 1 << 64:
        raise ValueError("a Uid value has 64 bits")
    return n


class Uid:
    """A unique identifier, as Monarch's: a singleton (a label alone, e.g. ``service``) or
    an instance (a 64-bit value with an optional label, written ``label<BASE58>``)."""

    __slots__ = ("_label", "_value")

    def __init__(self, label: Optional[str], value: Optional[int]) -> None:
        if label is not None and (not label or any(c in label for c in "<>@ ")):
            raise ValueError(f"a Uid label has no '<', '>', '@' or space: {label!r}")
        if value is None and label is None:
            raise ValueError("a singleton Uid needs a label")
        if value is not None and not 0 <= value < 1 << 64:
            raise ValueError(f"a Uid value has 64 bits, not {value}")
        self._label, self._value = label, value

    @staticmethod
    def anonymous() -> "Uid":
        return Uid(None, secrets.randbits(64))

    @staticmethod
    def instance(label: Optional[str] = None) -> "Uid":
        return Uid(label, secrets.randbits(64))

    @staticmethod
    def instance_from_value(value: int, label: Optional[str] = None) -> "Uid":
        return Uid(label, int(value))

    @staticmethod
    def singleton(label: str) -> "Uid":
        return Uid(label, None)

    @staticmethod
    def from_string(uid: str) -> "Uid":
        if not isinstance(uid, str) or not uid:
            raise ValueError(f"not a Uid: {uid!r}")
        if uid.endswith(">") and "<" in uid:
            label, _, rest = uid[:-1].partition("<")
            return Uid(label or None, _from_b58(rest))
        return Uid(uid, None)

    @property
    def label(self) -> Optional[str]:
        return self._label

    @property
    def is_instance(self) -> bool:
        return self._value is not None

    @property
    def is_singleton(self) -> bool:
        return self._value is None

    @property
    def instance_value(self) -> Optional[int]:
        return self._value

    def __str__(self) -> str:
        if self._value is None:
            return str(self._label)
        return f"{self._label or ''}<{_b58(self._value)}>"

    def __repr__(self) -> str:
        return f"Uid({str(self)!r})"

    def __hash__(self) -> int:
        return hash((self._label, self._value))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Uid) and (self._label, self._value) == (other._label,
                                                                         other._value)

    def __reduce__(self):
        return (Uid, (self._label, self._value))


class ProcId:
    """The identity of a proc: a Uid (as Monarch's)."""

    __slots__ = ("_uid",)

    def __init__(self, uid: Uid) -> None:
        if not isinstance(uid, Uid):
            raise TypeError(f"ProcId(uid) takes a Uid, not {uid!r}")
        self._uid = uid

    @staticmethod
    def from_string(proc_id: str) -> "ProcId":
        return ProcId(Uid.from_string(proc_id))

    @property
    def uid(self) -> Uid:
        return self._uid

    @property
    def label(self) -> Optional[str]:
        return self._uid.label

    def __str__(self) -> str:
        return str(self._uid)

    def __repr__(self) -> str:
        return f"ProcId({str(self)!r})"

    def __hash__(self) -> int:
        return hash(("proc", self._uid))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcId) and self._uid == other._uid

    def __reduce__(self):
        return (ProcId, (self._uid,))


# --- returns_future ---------------------------------------------------------------------------


def returns_future(function: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., "Future[T]"]:
    """Makes an ``async def`` function return a podium Future (await it or ``.get()``), as
    Monarch's: calling it does not start the body; the first ``await`` runs it on the
    awaiting loop, the first ``get()`` on a loop of its own, in the caller's context
    variables; later waits share the outcome."""
    if not inspect.iscoroutinefunction(function):
        raise TypeError("returns_future requires an async function")

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> "Future[T]":
        return CoroFuture(function(*args, **kwargs))

    return wrapped


# --- attach, shutdown_context -----------------------------------------------------------------


def attach(addr: str) -> None:
    """Bootstraps this process's client attached through the remote gateway at ``addr``, as
    Monarch's: ``addr`` is a worker's listening address (``"tcp://host:port"``; the worker's
    port doubles as the gateway, e.g. after ``kubectl port-forward``). This process dials that
    one address and listens nowhere: its traffic to every proc goes through the worker, and
    the worker routes the procs' traffic back over the connection this process opened, so
    the procs need not reach the client (docs/multihost.md, "Attaching through a gateway").

    Call it before the client starts (the first context()/this_host()/this_proc()/spawn):
    repeating the same address does nothing; another address after attaching, or attaching
    after the client started locally, raises RuntimeError. An unreachable gateway, or one
    that does not answer within ``PODIUM_ATTACH_TIMEOUT_MS``, raises naming it."""
    if not isinstance(addr, str) or not addr:
        raise TypeError(f"attach(addr): addr is an address such as 'tcp://host:port', not "
                        f"{addr!r}")
    runtime.attach_via(addr)


_shutdown_lock = threading.Lock()
_shutdown_claimed = False


def shutdown_context(host_timeout: Optional[float] = None) -> "Future[None]":
    """Shuts down this process's podium client, as Monarch's: stops the procs it spawned on
    this host and the runtime (the actor server, the fault thread), once; it cannot start
    again in this process. Returns a Future that resolves when that is done; already complete
    when podium never started here or a shutdown was claimed before. ``host_timeout``
    (seconds, default 10) bounds how long procs may take to stop (ProcMesh.stop's grace)."""
    global _shutdown_claimed
    if host_timeout is not None:
        if (not isinstance(host_timeout, (int, float)) or isinstance(host_timeout, bool)
                or not math.isfinite(host_timeout) or host_timeout < 0):
            raise ValueError(f"shutdown_context: host_timeout must be a finite number of "
                             f"seconds >= 0, not {host_timeout!r}")
    with _shutdown_lock:
        if _shutdown_claimed or not runtime.running():
            return resolved(None)
        _shutdown_claimed = True
    if host_timeout is not None:
        _proc_mesh.STOP_GRACE_MS = int(host_timeout * 1000)
    done: "concurrent.futures.Future[None]" = concurrent.futures.Future()

    def run() -> None:
        try:
            runtime._at_exit()
            done.set_result(None)
        except BaseException as e:  # the future reports it
            done.set_exception(e)

    threading.Thread(target=run, name="podium-shutdown", daemon=True).start()

    async def wait() -> None:
        await asyncio.wrap_future(done)

    return CoroFuture(wait())


# --- worker loops -----------------------------------------------------------------------------


def start_worker_loop_forever(*, address: str, ca: Any = "trust_all_connections",
                              private_key: Any = None) -> "Future[None]":
    """Starts serving as this host's worker on ``address`` (as run_worker_loop_forever) on a
    thread of its own and returns at once a Future of the worker's end: it fails with the
    reason when the worker cannot start (bad address, no secret), and otherwise never
    completes (the worker serves until the process is killed)."""
    done: "concurrent.futures.Future[None]" = concurrent.futures.Future()

    def serve() -> None:
        try:
            run_worker_loop_forever(address=address, ca=ca, private_key=private_key)
            done.set_result(None)
        except BaseException as e:
            done.set_exception(e)

    threading.Thread(target=serve, name="podium-worker", daemon=True).start()

    async def wait() -> None:
        await asyncio.wrap_future(done)

    return CoroFuture(wait())


def run_worker_loop_until_shutdown(*, address: str, ca: Any = "trust_all_connections",
                                   private_key: Any = None) -> None:
    """Serves as this host's worker on ``address`` until the controller that attached it
    shuts its host down (``HostMesh.shutdown()``), then returns (the process lives on); a
    controller that merely leaves does not end it."""
    run_worker_loop_forever(address=address, ca=ca, private_key=private_key,
                            until_shutdown=True)


# --- hosts_from_config ------------------------------------------------------------------------


def hosts_from_config(name: str) -> Any:
    """The host mesh ``name`` of this project's configuration, as Monarch's: two hosts, here
    two worker processes on this machine (a LocalJob), attached. Their workers end when this
    process exits."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"hosts_from_config(name): name must be a non-empty str, not {name!r}")
    job = LocalJob({name: 2})
    state = job.state(cached_path=None)
    atexit.register(job.kill)
    return state[name]


# --- proc_mesh: the older spelling ------------------------------------------------------------


def _set_env_and_run(env: Dict[str, str], setup: Optional[Callable[[], Any]]) -> Any:
    os.environ.update(env)
    if setup is None:
        return None
    result = setup()
    if inspect.iscoroutine(result):  # an async setup
        result = asyncio.run(result)
    return result


def proc_mesh(*, gpus: Optional[int] = None, hosts: int = 1,
              env: Optional[Dict[str, str]] = None,
              setup: Optional[Callable[[], Any]] = None) -> Any:
    """[Deprecated, as in Monarch] ``this_host().spawn_procs(per_host={"hosts": hosts,
    "gpus": gpus})`` (PN-2). ``gpus`` defaults to the number of GPUs torch sees (1 without
    torch or GPUs). ``env`` is set in every proc's os.environ before any actor, and ``setup``
    then runs there (the bootstrap). The result is awaitable and has ``get()``."""
    warnings.warn("proc_mesh() is deprecated: use this_host().spawn_procs(per_host={'hosts': "
                  "..., 'gpus': ...})", DeprecationWarning, stacklevel=2)
    if gpus is None:
        gpus = _local_device_count()
    for what, n in (("gpus", gpus), ("hosts", hosts)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"proc_mesh({what}=...) must be an int >= 1, not {n!r}")
    if env is not None and not all(isinstance(k, str) and isinstance(v, str)
                                   for k, v in env.items()):
        raise TypeError("proc_mesh(env=...) maps str to str")
    bootstrap = None
    if env or setup is not None:
        bootstrap = functools.partial(_set_env_and_run, dict(env or {}), setup)
    pm = this_host().spawn_procs(per_host={"hosts": hosts, "gpus": gpus}, bootstrap=bootstrap)
    pm.__class__ = _LegacyProcMesh
    return pm


def _local_device_count() -> int:
    try:
        import torch  # type: ignore

        return max(1, int(torch.cuda.device_count()))
    except Exception:
        return 1


class _LegacyProcMesh(ProcMesh):
    """A ProcMesh that is also the Future of Monarch's older ``proc_mesh()`` (PN-2)."""

    def __await__(self):
        return self._ready().__await__()

    async def _ready(self) -> "ProcMesh":
        await self.initialized
        return self

    def get(self, timeout: Optional[float] = None) -> "ProcMesh":
        """Waits until the procs are up (and ran ``setup``); returns this mesh."""
        self.initialized.get(timeout)
        return self
