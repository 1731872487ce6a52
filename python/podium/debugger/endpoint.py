"""How `podium debug`, `podium exec`, `podium logs` and `podium dashboard` reach a running
controller: over podium's own channel, as a client attached through a gateway (channel GW-1),
never through a socket or a handshake of Python's.

The controller's root proc also accepts TCP connections on the debug address
(PODIUM_DEBUG_SERVER_HOST, default ``localhost``; PODIUM_DEBUG_SERVER_PORT, default 27000;
Monarch's MONARCH_DEBUG_SERVER_HOST / _PORT are read when podium's are unset) and serves
them as a gateway (``podium._core.mesh.serve_gateway``, C++). A command dials that address
with ``attach`` (the channel's setup: the job's secret, CH-8; TLS when the job has it, CH-9),
and then every prompt line, `exec` command and output, `logs` read and dashboard snapshot is
a call to the job's DebugController actor (controller.py), an ordinary actor message.

  DB-8 The debug address is a channel listener of the controller's root proc: a peer that
    does not prove the job's secret (and its certificate when TLS is on) is refused by the
    channel before any frame is read, and the proc goes on serving everyone else. A job
    without a secret (PODIUM_INSECURE=1) refuses to listen off loopback. The commands find
    the secret in --secret-file, PODIUM_SECRET_FILE or PODIUM_SECRET, else, for a loopback
    address, in the note the controller leaves for its user (``note_path``: a file of mode
    0600 in a 0700 directory of this user, holding the path of the secret file, never the
    secret).
  DB-9 A controller that cannot listen on the debug address (port in use, refused) does not
    stop breakpoints: the sessions still open, a warning on the controller's stderr names
    the address and cause once, and podium.debug() still reaches them.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import socket
import stat
import sys
import tempfile
import time
import uuid
from typing import Any, Optional, Tuple

from podium._core import mesh as _mesh
from podium._src import runtime

DEFAULT_HOST = "localhost"
DEFAULT_PORT = 27000
CONTROLLER_NAME = "debug_controller"  # the DebugController's name in the controller's proc
PROBE_MS = 1000
ATTACH_TIMEOUT_MS = "5000"  # a refused secret fails the command this soon (unless set)


def _env(name: str) -> Optional[str]:
    return os.environ.get(f"PODIUM_{name}") or os.environ.get(f"MONARCH_{name}") or None


def configured_address() -> Tuple[str, int]:
    host = _env("DEBUG_SERVER_HOST") or DEFAULT_HOST
    port = _env("DEBUG_SERVER_PORT")
    return host, int(port) if port else DEFAULT_PORT


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (resolving it here is a
    name lookup, not a connection)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback
                               for a in addrs)


def channel_address(host: str, port: int) -> str:
    """The channel address of the debug address (``localhost`` as 127.0.0.1, so that the
    controller and the commands name the same one)."""
    if host == "localhost":
        host = "127.0.0.1"
    return f"tcp:[{host}]:{port}" if ":" in host else f"tcp:{host}:{port}"


def job_secret_file() -> Optional[str]:
    """The file of the job's secret as this (controller) process holds it: PODIUM_SECRET_FILE,
    or the one its runtime generated (SE-1)."""
    return os.environ.get("PODIUM_SECRET_FILE") or _mesh.secret_file() or None


def has_secret() -> bool:
    return bool(job_secret_file() or os.environ.get("PODIUM_SECRET"))


# --- the controller's side ----------------------------------------------------------------


def note_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"podium-debug-{os.getuid()}")


def note_path(port: int) -> str:
    """DB-8: where a controller listening on loopback port ``port`` notes its secret file."""
    return os.path.join(note_dir(), str(port))


def _private_dir(path: str) -> bool:
    """Whether ``path`` is a directory of this user that nobody else can read or write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and stat.S_IMODE(st.st_mode) & 0o077 == 0)


def _write_note(port: int) -> None:
    path = job_secret_file()
    if not path:
        return
    d = note_dir()
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        if not _private_dir(d):
            return
        tmp = os.path.join(d, f".{port}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.path.abspath(path) + "\n")
        os.replace(tmp, note_path(port))
        atexit.register(_remove_note, port, os.path.abspath(path))
    except OSError:
        pass  # the commands then need PODIUM_SECRET_FILE or --secret-file


def _remove_note(port: int, path: str) -> None:
    try:
        with open(note_path(port)) as f:
            if f.read().strip() == path:
                os.unlink(note_path(port))
    except OSError:
        pass


class Listener:
    """The controller's debug address (DB-8, DB-9): started once, by the DebugController."""

    def __init__(self) -> None:
        self.host, self.port = configured_address()
        self.address: Optional[str] = None  # the channel address, once it listens
        self.error: Optional[str] = None

    def start(self) -> None:
        if self.address is not None or self.error is not None:
            return
        loopback = is_loopback(self.host)
        try:
            if not loopback and not has_secret():
                raise PermissionError(
                    f"{self.host} is not a loopback address, and this job has no secret for "
                    f"clients to prove (PODIUM_INSECURE?); set PODIUM_DEBUG_SERVER_HOST to a "
                    f"loopback address")
            self.address = _mesh.serve_gateway(channel_address(self.host, self.port))
            self.port = int(self.address.rsplit(":", 1)[1])
        except Exception as e:  # DB-9
            self.error = f"{type(e).__name__}: {e}"
            sys.stderr.write(
                f"podium: debugger: the debug server cannot listen on {self.host}:"
                f"{self.port} ({self.error}); breakpoints still stop actors, but `podium "
                f"debug` cannot reach this job: use podium.debug() in the controller, or "
                f"set PODIUM_DEBUG_SERVER_PORT\n")
            sys.stderr.flush()
            return
        if loopback:
            _write_note(self.port)
        else:  # say where clients find the secret (never the secret itself)
            path = job_secret_file()
            where = f"PODIUM_SECRET_FILE={path}" if path else "PODIUM_SECRET, as this controller's"
            sys.stderr.write(f"podium: debugger: the debug server listens on {self.host}:"
                             f"{self.port}; `podium debug` and `podium exec` must prove the "
                             f"job's secret ({where})\n")
            sys.stderr.flush()

    def where(self) -> Tuple[str, int]:
        if self.address is None:
            raise RuntimeError(f"the debug server is not listening: {self.error}")
        return self.host, self.port


# --- the commands' side -------------------------------------------------------------------


def _client_secret(host: str, port: int, secret_file: Optional[str]) -> None:
    """Puts the job's secret where this process's runtime reads it (DB-8), before it starts."""
    if secret_file:
        os.environ["PODIUM_SECRET_FILE"] = os.path.abspath(secret_file)
        os.environ.pop("PODIUM_SECRET", None)
        return
    if os.environ.get("PODIUM_SECRET_FILE") or os.environ.get("PODIUM_SECRET"):
        return
    if os.environ.get("PODIUM_INSECURE") == "1" or not is_loopback(host):
        return
    try:
        if not _private_dir(note_dir()):
            return
        with open(note_path(port)) as f:
            path = f.read().strip()
    except OSError:
        return
    if path:
        os.environ["PODIUM_SECRET_FILE"] = path


def connect_core(host: str, port: int, wait_s: float, secret_file: Optional[str]) -> Any:
    """The DebugController of the job whose controller listens on host:port, as the core of
    an ActorMesh of this process (a podium client attached through that address: GW-1).
    Waits up to ``wait_s`` seconds for something to listen there (the controller starts
    listening with its debug controller: at the first breakpoint, or debug_controller())."""
    address = channel_address(host, port)
    deadline = time.monotonic() + wait_s
    said = False
    local = is_loopback(host)
    while True:
        here = _listening_here(port) if local else None
        if here is not None:
            why = None if here else "nothing listens on this host's port"
        else:  # another host (or no /proc): one plain connect
            why = _mesh.probe(address, PROBE_MS)
        if why is None:
            break
        if time.monotonic() >= deadline:
            raise ConnectionRefusedError(
                f"nothing listens on {host}:{port} ({why}): no actor of this job has stopped "
                f"at a breakpoint yet, or its debug server listens elsewhere "
                f"(PODIUM_DEBUG_SERVER_HOST / _PORT)")
        if not said:
            print(f"podium debug: waiting for the debug server at {host}:{port}",
                  file=sys.stderr, flush=True)
            said = True
        time.sleep(0.2)
    _client_secret(host, port, secret_file)
    os.environ.setdefault("PODIUM_ATTACH_TIMEOUT_MS", ATTACH_TIMEOUT_MS)
    try:
        runtime.attach_via("tcp://" + address[len("tcp:"):])
    except Exception as e:
        raise PermissionError(
            f"the controller at {host}:{port} did not accept this client ({e}); it asks for "
            f"the job's secret: set PODIUM_SECRET_FILE or give --secret-file") from None
    actor = f"{address}#{CONTROLLER_NAME}[0]"
    return _mesh.ActorMesh.from_state(
        CONTROLLER_NAME, [], [], [(address, 0, host)],
        [(address, actor + ":0", actor, address)], ([], 0, [], []), [])


def _listening_here(port: int) -> Optional[bool]:
    """Whether a socket of this host listens on TCP ``port`` (its LISTEN rows in
    /proc/net/tcp and tcp6), without connecting to it (a connection that does not run the
    channel's setup is a warning at the controller); None when /proc cannot tell."""
    seen = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for row in f:
                    cols = row.split()
                    seen = True
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return False if seen else None


def client_id() -> str:
    """Names this command's prompt at the controller (one prompt at a time: a new one
    replaces the one before, which is told so)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
