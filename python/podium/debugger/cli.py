"""``podium debug [--host H] [--port P]``: the debugger's prompt in this terminal, from a
process attached to the controller through its debug address (endpoint.py: the channel, the
job's secret: DB-8); and ``podium.debug()``, the same prompt inside the controller process (a
notebook, a script). Both drive the prompt with DebugController.exchange calls."""

from __future__ import annotations

import argparse
import os
import select
import sys
from typing import Any, Optional

from podium._src import dashboard as _dashboard
from podium._src.actor_mesh import ActorMesh
from podium.debugger.controller import LOCAL, DebugController, debug_controller
from podium.debugger import logs as logs_cli
from podium.debugger import shell
from podium.debugger.endpoint import client_id, configured_address, connect_core


def connect(host: str, port: int, wait_s: float, secret_file: Optional[str]) -> Any:
    """The DebugController of the job whose controller listens on host:port (endpoint.py,
    DB-8), as an ActorMesh of this process."""
    return ActorMesh(DebugController, connect_core(host, port, wait_s, secret_file), None)


def debug() -> None:
    """Runs the debugger's prompt here, in the controller process, until ``quit``."""
    _prompt(debug_controller(), LOCAL)


def _prompt(ctrl: Any, client: str) -> None:
    """Shows what the prompt writes and hands it this terminal's lines until it finishes;
    the end of input (or ^C) ends it as `quit` does. A `podium debug` (not podium.debug())
    also watches for another prompt taking over while it waits for its terminal."""
    text, done = ctrl.exchange.call_one(None, client).get()
    watch = None if client == LOCAL else ctrl.watch_prompt.call_one(client)
    reader = _LineReader(watch)
    while True:
        sys.stdout.write(text)
        sys.stdout.flush()
        if done:
            return
        try:
            line = input() if watch is None else reader.line()
        except (EOFError, KeyboardInterrupt):
            ctrl.close_prompt.call_one(client).get()
            return
        if line is None:  # replaced: the controller said so
            sys.stdout.write(watch.get() or "")
            sys.stdout.flush()
            return
        text, done = ctrl.exchange.call_one(line, client).get()


class _LineReader:
    """This terminal's next line, or None once ``watch`` (a Future) resolved with a text.
    Reads the terminal's file descriptor as a terminal in canonical mode hands it over (a
    line at a time), and looks at ``watch`` between waits."""

    def __init__(self, watch: Any) -> None:
        self.watch = watch
        self.buffer = b""
        self.eof = False

    def line(self) -> Optional[str]:
        fd = sys.stdin.fileno()
        while b"\n" not in self.buffer:
            if self.eof:
                if self.buffer:
                    rest, self.buffer = self.buffer, b""
                    return rest.decode(errors="replace")
                raise EOFError()
            if self.watch.done() and self.watch.get():
                return None
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                data = os.read(fd, 65536)
                if data:
                    self.buffer += data
                else:
                    self.eof = True
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode(errors="replace").rstrip("\r")


def add_arguments(p: argparse.ArgumentParser) -> None:
    host, port = configured_address()
    p.add_argument("--host", default=host,
                   help=f"the controller's debug address: host (PODIUM_DEBUG_SERVER_HOST; "
                        f"default {host})")
    p.add_argument("--port", type=int, default=port,
                   help=f"its port (PODIUM_DEBUG_SERVER_PORT; default {port})")
    p.add_argument("--wait", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for the controller to listen (default 30)")
    p.add_argument("--secret-file", default=None, metavar="PATH",
                   help="the job's secret (default: PODIUM_SECRET_FILE or PODIUM_SECRET, else "
                        "on loopback the file the controller noted for this user)")


def _connect(args: argparse.Namespace, what: str) -> Any:
    try:
        return connect(args.host, args.port, args.wait, args.secret_file)
    except Exception as e:  # nothing listens, or the channel refused this client (DB-8)
        print(f"podium {what}: {e}", file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    ctrl = _connect(args, "debug")
    if ctrl is None:
        return 1
    try:
        _prompt(ctrl, client_id())
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the controller went away
        print(f"podium debug: {e}", file=sys.stderr)
        return 1


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="podium debug")
    add_arguments(p)
    return run(p.parse_args(argv))


def run_dashboard(args: argparse.Namespace) -> int:
    """``podium dashboard``: the controller starts its dashboard (or has one), on its
    loopback, and this prints its URL; with ``--serve``, this process serves the page on its
    own loopback instead, its data fetched from the controller through the channel."""
    ctrl = _connect(args, "dashboard")
    if ctrl is None:
        return 1
    if getattr(args, "serve", None) is not None:
        try:
            dash = _dashboard.Dashboard(
                "127.0.0.1", args.serve,
                lambda: ctrl.dashboard_state.call_one().get(timeout=60))
        except Exception as e:
            print(f"podium dashboard: {e}", file=sys.stderr)
            return 1
        print(dash.url, flush=True)
        try:
            dash.thread.join()
        except KeyboardInterrupt:
            dash.stop()
            return 0
        return 0
    try:
        url = ctrl.dashboard_url.call_one().get(timeout=60)
    except Exception as e:
        print(f"podium dashboard: the controller did not start it: {e}", file=sys.stderr)
        return 1
    print(url, flush=True)
    return 0


def add_dashboard_arguments(p: argparse.ArgumentParser) -> None:
    add_arguments(p)
    p.add_argument("--serve", type=int, nargs="?", const=0, default=None, metavar="PORT",
                   help="serve the page here, on 127.0.0.1:PORT (default any free port), its "
                        "data fetched from the controller through the job's channel: for a "
                        "controller on another machine")


def run_exec(args: argparse.Namespace) -> int:
    return shell.run(args, connect)


def add_exec_arguments(p: argparse.ArgumentParser) -> None:
    add_arguments(p)
    shell.add_arguments(p)


def run_logs(args: argparse.Namespace) -> int:
    return logs_cli.run(args, connect)


def add_logs_arguments(p: argparse.ArgumentParser) -> None:
    add_arguments(p)
    logs_cli.add_arguments(p)
