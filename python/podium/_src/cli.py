"""The `podium` command line (also `python -m podium`).

Each sub-command is one `_register_<name>(subparsers)` function that adds its parser and sets
`run=<handler>`; a handler takes the parsed arguments and returns the exit code. To add a
sub-command (`worker`, `sim`, ...), write such a function (here or in its own module) and
append it to `_COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Callable, Sequence

import podium
from podium import _core
from podium._src import bin_dir, find_binary, list_binaries, sim_cast, tls, worker
from podium.debugger import cli as debug_cli

_BENCH_PREFIX = "podium-bench-"
# Benchmarks written in Python: `podium bench NAME` runs main(args) of the module instead of
# a podium-bench-NAME binary.
_PYTHON_BENCHMARKS = {
    "python": "podium._src.bench_python",
    "cast-python": "podium._src.bench_cast_python",
    "attack": "podium._src.bench_attack",
    "soak": "podium._src.bench_soak",
    "rdma": "podium._src.bench_rdma",
    "rdma-net": "podium._src.bench_rdma_net",
    "tensor": "podium._src.bench_tensor",
    "workspace": "podium._src.bench_workspace",
    "rl": "podium._src.bench_rl",
    "ft": "podium._src.bench_ft",
}


def _error(message: str) -> None:
    print(f"podium: {message}", file=sys.stderr)


# --- podium version ----------------------------------------------------------------------


def _run_version(args: argparse.Namespace) -> int:
    info = _core.build_info()
    print(f"podium {podium.__version__}")
    if args.verbose:
        for key in sorted(info):
            print(f"  {key}: {info[key]}")
    else:
        print(f"  core {info['version']} ({info['compiler']}, {info['build_type']})")
    if info["version"] != podium.__version__:
        _error(
            f"the C++ core is version {info['version']} but the Python package is "
            f"{podium.__version__}: reinstall podium (make setup)"
        )
        return 1
    return 0


def _register_version(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("version", help="print podium's version and build information")
    p.add_argument("-v", "--verbose", action="store_true", help="print every build_info() field")
    p.set_defaults(run=_run_version)


# --- podium bench NAME [args...] ---------------------------------------------------------


def available_benchmarks() -> list[str]:
    """Names accepted by `podium bench`: the podium-bench-NAME executables in bin_dir()."""
    return [n[len(_BENCH_PREFIX) :] for n in list_binaries(_BENCH_PREFIX)]


def _benchmark_listing() -> str:
    names = available_benchmarks()
    binaries = ", ".join(names) if names else f"none (no {_BENCH_PREFIX}* in {bin_dir()})"
    return ", ".join([binaries, *sorted(_PYTHON_BENCHMARKS)])


def _run_bench(args: argparse.Namespace) -> int:
    if args.name is None:
        _error(f"bench needs a benchmark NAME; available benchmarks: {_benchmark_listing()}")
        return 2
    if args.name in _PYTHON_BENCHMARKS:
        return importlib.import_module(_PYTHON_BENCHMARKS[args.name]).main(args.args)
    path = find_binary(_BENCH_PREFIX + args.name)
    if path is None:
        _error(f"unknown benchmark '{args.name}'; available benchmarks: {_benchmark_listing()}")
        return 2
    argv = [str(path), *args.args]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # Replace this process: the benchmark's output and exit code are the command's.
        os.execv(argv[0], argv)
    except OSError as e:
        _error(f"cannot run {path}: {e.strerror}")
        return 126


def _register_bench(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="run a benchmark (podium bench NAME [args...])",
        description="Runs <package>/_bin/podium-bench-NAME with the remaining arguments; "
        "its output and exit code pass through. `podium bench python` runs the Python API "
        "benchmark (podium._src.bench_python).",
    )
    # Optional so that a bare `podium bench` lists the benchmarks instead of a usage error.
    p.add_argument("name", nargs="?", metavar="NAME", help="benchmark name, e.g. core")
    p.add_argument(
        "args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to the benchmark"
    )
    p.set_defaults(run=_run_bench)


# -----------------------------------------------------------------------------------------

def _register_sim(subparsers: argparse._SubParsersAction) -> None:
    sim_cast.register(subparsers)


def _run_worker(args: argparse.Namespace) -> int:
    return worker.run(args)


def _register_worker(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "worker",
        help="run this host's agent for a controller on another host",
        description="Serves a controller that attaches with attach_to_workers(); spawns and "
        "watches its procs on this host (docs/multihost.md). It refuses to start without the "
        "job's secret unless --insecure (docs/security.md).",
        epilog=tls.WORKER_HELP,
    )
    worker.add_arguments(p)
    p.set_defaults(run=_run_worker)


def _register_debug(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "debug",
        help="open the debugger's prompt of a running job (list, attach, cast, continue)",
        description="Attaches to a job's controller through its debug address (podium's "
        "channel, which asks for the job's secret: docs/security.md), which listens once an "
        "actor stopped at breakpoint() or the controller called "
        "podium.actor.debug_controller() (docs/interactive.md).",
    )
    debug_cli.add_arguments(p)
    p.set_defaults(run=debug_cli.run)


def _register_exec(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "exec",
        help="run a shell command on the procs of a running job (--all, --one, --point)",
        description="Runs COMMAND in every selected proc of the job whose controller serves "
        "`podium debug` (docs/interactive.md), each output line prefixed with the proc's "
        "coordinates. Exit status 0 when every command exited 0.",
    )
    debug_cli.add_exec_arguments(p)
    p.set_defaults(run=debug_cli.run_exec)


def _register_dashboard(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "dashboard",
        help="start the web dashboard of a running job and print its URL",
        description="Asks the controller of a running job (through its debug address, as "
        "`podium debug` reaches it) to serve its dashboard on its loopback, and prints the "
        "page's URL; with --serve, serves the page here, its data fetched from the controller "
        "through the job's channel: hosts, proc and actor meshes, per-rank health, message "
        "rates, in-flight calls, recent failures and the debugger's stopped actors "
        "(docs/interactive.md).",
    )
    debug_cli.add_dashboard_arguments(p)
    p.set_defaults(run=debug_cli.run_dashboard)


def _register_logs(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "logs",
        help="print the procs' log files of a running job (--rank, --tail, --follow)",
        description="Reads the log file of every selected proc of the job whose controller "
        "serves `podium debug` (docs/interactive.md), each line prefixed with the proc's "
        "coordinates, rank and host.",
    )
    debug_cli.add_logs_arguments(p)
    p.set_defaults(run=debug_cli.run_logs)


_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _register_version,
    _register_bench,
    _register_sim,
    _register_worker,
    _register_debug,
    _register_exec,
    _register_dashboard,
    _register_logs,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="podium", description="podium command line")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
