"""The dashboard: a web page that shows a job as its controller's runtime sees it (state.py)
and updates live (the page polls ``/api/state`` every second).

``podium.dashboard()`` (or ``job.dashboard()``) starts it in the controller process and
returns it; ``podium dashboard`` asks a running controller to start it (through the debug
address, as ``podium debug`` reaches it: the channel, the job's secret) and prints its
address; ``podium dashboard --serve`` serves the page in its own process instead. Either
way the page's data is a call to the job's DebugController (``dashboard_state``), an actor
message over podium's channel. The HTTP responder is C++'s (channel/http.h: loopback only,
GET only, bounded: HT-1..HT-3) on the process's io threads; a thread of the Dashboard takes
its requests and answers them. It reads nothing of the job itself, and holds no secret.

  DS-4 A dashboard listens on loopback only (PODIUM_DASHBOARD_HOST may name another loopback
    address; any other is refused with a ValueError that says how to view it from another
    machine: ``podium dashboard --serve`` there, which reaches the controller through the
    channel and its secret, or an SSH tunnel). It has no token and no authentication of its
    own: what reaches a loopback port is this host's.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.parse
from typing import Any, Callable, Dict, Optional, Tuple

from podium._core import mesh as _mesh
from podium._src.dashboard.page import PAGE
from podium._src.proc_mesh import get_or_spawn_controller
from podium._src.runtime import ensure_runtime
from podium.debugger import controller as _debug_controller
from podium.debugger.endpoint import is_loopback

DEFAULT_HOST = "127.0.0.1"

_lock = threading.Lock()
_running: Optional["Dashboard"] = None


class Dashboard:
    """A running dashboard: ``url``, ``stop()``. ``fetch()`` returns one snapshot of the job
    (a DebugController.dashboard_state call). The HTTP is C++'s (``_mesh.HttpServer``:
    channel/http.h, bounded before anything is handed on: HT-2); a thread of this object
    (``podium-dashboard``) answers each request, one at a time."""

    def __init__(self, host: str, port: int, fetch: Callable[[], Dict[str, Any]]) -> None:
        if not is_loopback(host):  # DS-4 (the C++ responder refuses it too: HT-1)
            raise ValueError(
                f"the dashboard listens on loopback only, not {host}: to view it from another "
                f"machine, run `podium dashboard --serve --host CONTROLLER` there (it reaches "
                f"the controller through the job's channel and secret), or tunnel "
                f"(ssh -L PORT:127.0.0.1:PORT)")
        ensure_runtime()
        self.fetch = fetch
        self.http = _mesh.HttpServer(_tcp_address(host, port))
        self.host, self.port = host, int(self.http.address.rsplit(":", 1)[1])
        self.thread = threading.Thread(target=self._serve, name="podium-dashboard",
                                       daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}/"

    def stop(self) -> None:
        global _running
        self.http.stop()
        with _lock:
            if _running is self:
                _running = None

    def _serve(self) -> None:
        while True:
            request = self.http.next(1.0)
            if request is None:
                if self.http.stopped:
                    return
                continue
            rid, target = request
            status, ctype, body = self._answer(target)
            self.http.respond(rid, status, ctype, body)

    def _answer(self, target: str) -> Tuple[int, str, bytes]:
        path = urllib.parse.urlsplit(target).path
        if path == "/":
            return 200, "text/html; charset=utf-8", PAGE.encode()
        if path == "/api/state":
            try:
                return 200, "application/json", json.dumps(self.fetch(), default=str).encode()
            except Exception as e:
                return 500, "text/plain", f"{type(e).__name__}: {e}\n".encode()
        return 404, "text/plain", b"not found\n"

    def __repr__(self) -> str:
        return f"<podium dashboard at http://{self.host}:{self.port}/>"

    def _repr_html_(self) -> str:  # a notebook shows a link
        return f'<a href="{self.url}" target="_blank">podium dashboard: {self.url}</a>'


def _tcp_address(host: str, port: int) -> str:
    return f"tcp:[{host}]:{port}" if ":" in host else f"tcp:{host}:{port}"


def dashboard(host: Optional[str] = None, port: Optional[int] = None) -> Dashboard:
    """Starts the dashboard in this (the controller) process, or returns the running one.
    ``host``: PODIUM_DASHBOARD_HOST, else 127.0.0.1; ``port``: PODIUM_DASHBOARD_PORT, else
    any free port. Its ``url`` is the address to open."""
    global _running
    with _lock:
        if _running is not None:
            return _running
        host = host or os.environ.get("PODIUM_DASHBOARD_HOST") or DEFAULT_HOST
        if port is None:
            port = int(os.environ.get("PODIUM_DASHBOARD_PORT") or 0)
        _running = Dashboard(host, port, _controller_state)
        return _running


def _controller_state() -> Dict[str, Any]:
    """The snapshot, in the controller, through its DebugController as every dashboard's
    (spawned if need be, without making it listen on the debug address)."""
    ctrl = get_or_spawn_controller(_debug_controller.CONTROLLER_NAME,
                                   _debug_controller.DebugController).get(timeout=60)
    return ctrl.dashboard_state.call_one().get(timeout=60)


# `podium dashboard` asks the debug controller, which starts it with this (the controller
# does not import this module: this module reads the debugger's state).
_debug_controller.start_dashboard = dashboard
