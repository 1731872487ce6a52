"""The dashboard: a web page served by the controller that shows its job as the runtime sees
it (state.py) and updates live (the page polls ``/api/state`` every second).

``podium.dashboard()`` (or ``job.dashboard()``) starts it in this process and returns it;
``podium dashboard`` asks a running controller to start it, through the debug server (as
``podium debug`` does), and prints its address. Serving HTTP is not podium's data path: the
page and its JSON go through Python's ``http.server`` on a thread of the controller; the
state it shows is read from the runtime in this process, with no message to any proc.

  DS-4 The dashboard listens on loopback unless told otherwise
    (PODIUM_DASHBOARD_HOST). Off loopback (or with PODIUM_DASHBOARD_AUTH=1) every request
    must carry the dashboard token, ``HMAC-SHA256(job secret, "podium-dashboard")`` in hex,
    as ``?token=`` (the page passes it on to its JSON requests); a request without it, or
    with a wrong one, gets 403 and nothing of the job. Without a job secret (an insecure
    job) it refuses to listen off loopback.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

from podium._src.dashboard.page import PAGE
from podium._src.dashboard.state import Collector
from podium.debugger import controller as _debug_controller
from podium.debugger.server import is_loopback, job_secret

DEFAULT_HOST = "127.0.0.1"
TOKEN_CONTEXT = b"podium-dashboard"

_lock = threading.Lock()
_running: Optional["Dashboard"] = None


def token_for(secret: bytes) -> str:
    """The dashboard token of a job whose secret is ``secret`` (DS-4)."""
    return hmac.new(secret, TOKEN_CONTEXT, hashlib.sha256).hexdigest()


class Dashboard:
    """A running dashboard: ``url`` (with the token when one is needed), ``stop()``."""

    def __init__(self, host: str, port: int) -> None:
        self.auth = os.environ.get("PODIUM_DASHBOARD_AUTH") == "1" or not is_loopback(host)
        self.token: Optional[str] = None
        if self.auth:
            secret = job_secret()
            if not secret:
                raise PermissionError(
                    f"the dashboard cannot listen on {host}: it is not a loopback address and "
                    f"this job has no secret to guard it with (PODIUM_INSECURE?); listen on "
                    f"127.0.0.1 (PODIUM_DASHBOARD_HOST)")
            self.token = token_for(secret)
        self.collector = Collector()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self.host, self.port = host, self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="podium-dashboard",
                                       daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        url = f"http://{shown}:{self.port}/"
        return url + (f"?token={self.token}" if self.token else "")

    def stop(self) -> None:
        global _running
        self.httpd.shutdown()
        self.httpd.server_close()
        with _lock:
            if _running is self:
                _running = None

    def __repr__(self) -> str:
        return f"<podium dashboard at http://{self.host}:{self.port}/>"

    def _repr_html_(self) -> str:  # a notebook shows a link
        return f'<a href="{self.url}" target="_blank">podium dashboard: {self.url}</a>'


def _handler(dash: Dashboard) -> type:
    class Handler(BaseHTTPRequestHandler):
        server_version = "podium-dashboard"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet: no line per poll
            pass

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            if dash.token is not None:  # DS-4
                given = urllib.parse.parse_qs(url.query).get("token", [""])[0]
                if not hmac.compare_digest(given.encode(), dash.token.encode()):
                    sys.stderr.write(f"podium: dashboard: refused {self.client_address[0]}: "
                                     f"no valid token\n")
                    self._send(403, "text/plain", b"podium dashboard: a valid token is "
                                                  b"needed (podium dashboard prints the URL)\n")
                    return
            if url.path == "/":
                self._send(200, "text/html; charset=utf-8", PAGE.encode())
            elif url.path == "/api/state":
                try:
                    body = json.dumps(dash.collector.snapshot(), default=str).encode()
                except Exception as e:
                    self._send(500, "text/plain", f"{type(e).__name__}: {e}\n".encode())
                    return
                self._send(200, "application/json", body)
            else:
                self._send(404, "text/plain", b"not found\n")

    return Handler


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
        _running = Dashboard(host, port)
        return _running


# `podium dashboard` asks the debug controller, which starts it with this (the controller
# does not import this module: this module reads the debugger's state).
_debug_controller.start_dashboard = dashboard
