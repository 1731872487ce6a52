"""The handle on this process's podium runtime: the bottom of the private package.

``ensure_runtime()`` starts the C++ runtime once (a controller, unless this process is a
proc; podium._core.mesh.init_controller), with the actor server (server.py) and podium's exit
handler; ``enable_transport()`` chooses how it listens, before it starts. Modules that need a
running runtime (actor_mesh, ports, proc_mesh, worker) import this one; it imports only
``_core``, ``server``, ``supervision``, ``port_ref`` and ``line_guard``, never a module above
it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any, Optional

from podium._core import mesh as _mesh
from podium._src import line_guard, port_ref, server, supervision

# How the C++ runtime starts a proc: ``python -m podium._src.proc`` (PODIUM_BOOT set).
PROC_ARGV = [sys.executable, "-m", "podium._src.proc"]
# Procs fork from a warm interpreter (podium._src.zygote) that has imported podium once;
# PODIUM_ZYGOTE=0 starts each proc as a new interpreter instead.
ZYGOTE_ARGV = [sys.executable, "-m", "podium._src.zygote"]

_lock = threading.Lock()
_running = False
# Where this process listens (enable_transport): None for a private Unix socket, else a TCP
# address such as "tcp:10.0.0.1:0".
_listen: Optional[str] = None
# The gateway this client attached through (attach(addr)), as the caller wrote it; None: not
# attached.
_via: Optional[str] = None


def _zygote_argv() -> list:
    return [] if os.environ.get("PODIUM_ZYGOTE", "1") == "0" else ZYGOTE_ARGV


def running() -> bool:
    """Whether ensure_runtime() has started the runtime of this process."""
    return _running


def listen_address() -> Optional[str]:
    """The address enable_transport() chose (None: a private Unix socket)."""
    return _listen


def ensure_runtime() -> None:
    """Starts this process's podium runtime (a controller, unless it is a proc) once."""
    global _running
    if _running:
        return
    with _lock:
        if _running:
            return
        # Does nothing in a proc, whose runtime is serving.
        _mesh.init_controller(PROC_ARGV, _zygote_argv(), _listen, _via)
        if not _mesh.is_proc():  # procs' lines never split the controller's (LG-8)
            line_guard.install()
        server.start()
        atexit.register(_at_exit)
        _running = True


def attach_via(addr: str) -> None:
    """Starts this process's runtime as a client attached through the gateway (a worker) at
    ``addr`` (channel GW-1..GW-4): it listens nowhere, and the procs reach it through the
    duplex it dials. Same address again: nothing; another, or a runtime already started
    without one: RuntimeError, in Monarch's words."""
    global _via, _running
    with _lock:
        if _running or _mesh.is_proc():
            if _via == addr:
                return
            if _via is not None:
                raise RuntimeError(
                    f"client is already attached through {_via}, not {addr}; detaching is not "
                    f"supported, so use a new process to attach through a different address")
            raise RuntimeError(
                "client was initialized without a remote attachment; call attach(addr) before "
                "the first context()/this_host()/this_proc()")
        _via = addr
        try:
            _mesh.init_controller(PROC_ARGV, _zygote_argv(), None, addr)
        except BaseException:
            _via = None
            raise
        line_guard.install()  # streamed lines never split the client's (LG-8)
        server.start()
        atexit.register(_at_exit)
        _running = True


def attached_via() -> Optional[str]:
    """The address attach() attached this client through, or None."""
    return _via


def _at_exit() -> None:
    supervision.at_exit()
    server.stop()
    _mesh.shutdown()


def _tcp_address(host: str, port: int) -> str:
    return f"tcp:[{host}]:{port}" if ":" in host else f"tcp:{host}:{port}"


def enable_transport(transport: Any) -> None:
    """Chooses how this job's processes talk, before anything starts podium in this process:
    ``"tcp"`` (this machine's address, from ``PODIUM_HOST_ADDR`` or the default route, and a
    free port), ``"tcp://HOST:PORT"`` (that address), or ``"ipc"``/``"unix"`` (Unix sockets,
    the default; one host only). TCP is needed to attach workers on other hosts; every TCP
    connection proves the job's secret (``PODIUM_SECRET``). Calling it again with the same
    choice does nothing; a different one once podium runs raises RuntimeError."""
    global _listen
    name = getattr(transport, "name", transport)  # an enum member names its transport
    if not isinstance(name, str):
        raise TypeError(f"enable_transport: expected a str such as 'tcp', got {transport!r}")
    t = name.strip()
    if t.lower() in ("ipc", "unix", "local"):  # ChannelTransport.Unix / .Local
        listen = None
    elif t.lower() in ("tcp", "tcpwithhostname", "tcp_with_hostname"):
        listen = _tcp_address(_mesh.default_host_address(), 0)
    elif t.lower() in ("tcpwithlocalhost", "tcp_with_localhost"):  # one host, over TCP
        listen = _tcp_address("127.0.0.1", 0)
    elif t.startswith("tcp://") or t.startswith("tcp:"):
        rest = t[6:] if t.startswith("tcp://") else t[4:]
        host, sep, port = rest.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"enable_transport({transport!r}): expected tcp://HOST:PORT")
        listen = _tcp_address(host.strip("[]"), int(port))
    else:
        raise ValueError(f"enable_transport({transport!r}): podium supports 'tcp', "
                         f"'tcp://HOST:PORT' and 'ipc'")
    with _lock:
        if _via is not None:
            return  # attached through a gateway: the job is on TCP already (GW-1)
        if _running or _mesh.is_proc():
            same = (listen is None) == (_listen is None) and (
                listen is None or t.lower() == "tcp" or listen == _listen)
            if not same:
                raise RuntimeError(
                    f"enable_transport({transport!r}) must be called before podium starts in "
                    f"this process; it already listens on {_mesh.this_proc_id()}")
            return
        _listen = listen


# A Port sent on in a process that has not started podium starts it first (port_ref.py sits
# below this module, so it is handed the function instead of importing it).
port_ref.bind_runtime(ensure_runtime)
