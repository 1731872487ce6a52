"""The host agent of a machine that a controller on another host attaches to.

``python -m podium worker --listen tcp://0.0.0.0:PORT`` (or ``run_worker_loop_forever``) runs
the C++ host agent (podium._core.mesh.serve_worker, docs/host_agent.md) in this process: it
spawns procs for one controller at a time, reports their exits, and exchanges heartbeats with
it; procs fork from a zygote as on the controller's host. This module only parses arguments
and says where the agent listens (a line on stdout, and the launcher's ready fd when
PODIUM_READY_FD is set).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from podium._core import host as _host
from podium._core import mesh as _mesh
from podium._src import tls
from podium._src.runtime import PROC_ARGV, _zygote_argv

READY_LINE = "podium worker listening on "


def _announce(address: str) -> None:
    # "tcp:0.0.0.0:7000" -> "tcp://0.0.0.0:7000", "unix:/tmp/w.sock" -> "ipc:///tmp/w.sock":
    # the form attach_to_workers takes (for DIAL@BIND, the DIAL side).
    if address.startswith("tcp:"):
        url = "tcp://" + address[4:]
    elif address.startswith("unix:@"):
        url = "ipc://" + address[6:]
    elif address.startswith("unix:"):
        url = "ipc://" + address[5:]
    else:
        url = address
    print(READY_LINE + url, flush=True)  # for people, and SLURM jobs' output files
    # A worker started by a LocalJob (cpp/podium/host/launcher.h) hands the address to its
    # launcher through PODIUM_READY_FD; a worker started by hand has no such variable.
    _host.announce_ready(url)
    os.environ.pop("PODIUM_READY_FD", None)  # unset in C already; keep os.environ in step


def run_worker_loop_forever(*, address: str, ca: Any = "trust_all_connections",
                            private_key: Any = None, persistent: bool = False,
                            insecure: bool = False, until_shutdown: bool = False) -> None:
    """Serves as this host's agent on ``address`` (``tcp://HOST:PORT``; port 0 picks one)
    until the process is killed. Prints ``podium worker listening on tcp://HOST:PORT`` once it
    accepts connections. Connections must prove the job's secret (``PODIUM_SECRET_FILE``, a
    file of mode 0600, or ``PODIUM_SECRET``): without one the worker refuses to start, unless
    ``insecure`` is true (then anyone who reaches the port can run code in its procs, and it
    says so on stderr; docs/security.md). A ``persistent`` worker keeps its procs and their
    actors when the controller leaves or goes silent; a later controller that attaches takes
    them over by name (``HostMesh.proc_mesh``, ``ProcMesh.actor_mesh``).

    TLS (every TCP connection of the job encrypted, both ends presenting a certificate that
    ``ca`` signed): ``ca`` is the CA bundle, PEM bytes or a path; ``private_key`` is PEM bytes
    or a path of one PEM holding this host's private key and its certificate chain (leaf
    first). ``ca="trust_all_connections"`` (the default) with no key leaves it to the
    environment (``PODIUM_TLS_CERT``, ``PODIUM_TLS_KEY``, ``PODIUM_TLS_CA``), which is off
    when those are unset. The procs this worker starts use the same settings."""
    if not isinstance(address, str):
        raise TypeError(f"run_worker_loop_forever: address is 'tcp://HOST:PORT' (or ipc://PATH, "
                        f"tcp://HOST:fdN, DIAL@BIND), not {address!r}")
    tls.configure(ca, private_key, "run_worker_loop_forever", running=_mesh.is_proc())
    # until_shutdown: return once a controller shuts this host down
    # (run_worker_loop_until_shutdown).
    _mesh.serve_worker(address, PROC_ARGV, _zygote_argv(), persistent, _announce,
                       insecure=bool(insecure), until_shutdown=bool(until_shutdown))


def add_arguments(p: Any) -> None:
    """The worker's command-line options, on an argparse parser (`podium worker`)."""
    p.add_argument("--listen", required=True, metavar="tcp://HOST:PORT",
                   help="where to accept a controller: tcp://HOST:PORT (port 0 picks a free "
                        "one), ipc://PATH (a Unix socket), tcp://HOST:fdN (an inherited "
                        "listening socket) or DIAL@BIND (listen on BIND, controllers dial DIAL)")
    p.add_argument("--persistent", action="store_true",
                   help="keep procs and their actors when the controller goes away, for the "
                        "next controller to take over by name")
    p.add_argument("--insecure", action="store_true",
                   help="accept controllers that hold no secret when PODIUM_SECRET_FILE and "
                        "PODIUM_SECRET are unset (anyone who reaches the port can then run code "
                        "here); without it, such a worker refuses to start")


def run(args: Any) -> int:
    """Runs the worker that parsed `args` ask for; 1 (with the reason on stderr) if it cannot
    start."""
    try:
        run_worker_loop_forever(address=args.listen, persistent=args.persistent,
                                insecure=args.insecure)
    except Exception as e:  # a bad address, a port in use, no secret: say so and fail
        print(f"podium worker: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="podium worker", epilog=tls.WORKER_HELP)
    add_arguments(p)
    return run(p.parse_args(argv))
