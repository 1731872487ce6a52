"""``podium debug [--host H] [--port P]``: the debugger's prompt in this terminal, over the
controller's debug server (server.py); and ``podium.debug()``, the same prompt inside the
controller process (a notebook, a script) without a socket."""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from podium.debugger.controller import debug_controller
from podium.debugger import logs as logs_cli
from podium.debugger import shell
from podium.debugger.server import (MODE_DASHBOARD, ask_prompt, configured_address, connect,
                                     relay)


def debug() -> None:
    """Runs the debugger's prompt here, in the controller process, until ``quit``."""
    ctrl = debug_controller()
    text, done = ctrl.exchange.call_one(None).get()
    while True:
        sys.stdout.write(text)
        sys.stdout.flush()
        if done:
            return
        try:
            line = input()
        except (EOFError, KeyboardInterrupt):
            line = "quit"
        text, done = ctrl.exchange.call_one(line).get()


def add_arguments(p: argparse.ArgumentParser) -> None:
    host, port = configured_address()
    p.add_argument("--host", default=host,
                   help=f"the debug server's host (PODIUM_DEBUG_SERVER_HOST; default {host})")
    p.add_argument("--port", type=int, default=port,
                   help=f"its port (PODIUM_DEBUG_SERVER_PORT; default {port})")
    p.add_argument("--wait", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for the server to listen (default 30)")
    p.add_argument("--secret-file", default=None, metavar="PATH",
                   help="the job's secret, for a server off loopback (default: "
                        "PODIUM_SECRET_FILE or PODIUM_SECRET)")


def run(args: argparse.Namespace) -> int:
    try:
        sock = connect(args.host, args.port, args.wait, args.secret_file)
    except (OSError, ValueError) as e:
        print(f"podium debug: {e}", file=sys.stderr)
        return 1
    try:
        ask_prompt(sock)
        return relay(sock)
    except KeyboardInterrupt:
        return 130
    finally:
        sock.close()


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="podium debug")
    add_arguments(p)
    return run(p.parse_args(argv))


def run_dashboard(args: argparse.Namespace) -> int:
    """``podium dashboard``: the controller starts its dashboard (or has one); prints its
    URL (with its token when it listens off loopback: docs/security.md)."""
    try:
        sock = connect(args.host, args.port, args.wait, args.secret_file)
    except (OSError, ValueError) as e:
        print(f"podium dashboard: {e}", file=sys.stderr)
        return 1
    try:
        sock.sendall((MODE_DASHBOARD + "\n").encode())
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    line = data.decode(errors="replace").strip()
    if line.startswith(MODE_DASHBOARD + " "):
        print(line[len(MODE_DASHBOARD) + 1:], flush=True)
        return 0
    print(f"podium dashboard: the controller did not start it: "
          f"{line.split(' ', 1)[-1] or 'connection closed'}", file=sys.stderr)
    return 1


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
