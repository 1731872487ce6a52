"""podium C++ layer host"""

from collections.abc import Sequence


def stdio_mark(fd: int, open: bool) -> None:
    """
    Marks this process's fd 1 or 2 open (its content may end inside a line: procs' lines wait) or closed (held lines are written now) (SG-1).
    """

def stdio_write_lines(fd: int, text: str) -> None:
    """
    Writes whole lines to this process's fd 1 or 2: now, or after the line open there closes, at most the gate's hold later (SG-1, SG-2).
    """

def stdio_hold() -> float:
    """
    How long (seconds) an open line of this process holds its procs' lines (SG-2).
    """

def zygote_serve(fd: int) -> tuple:
    """
    Serves fork requests on `fd` until the controller closes it (then raises CoreError). Returns (argv, env, cwd) in each forked child.
    """

def launch_workers(job: str, workers: Sequence[tuple[str, Sequence[str], Sequence[tuple[str, str]], str]], timeout: float) -> list[tuple[int, int, str]]:
    """
    Starts each worker (path, argv, env pairs added to this environment, log) in a session of its own and waits at most `timeout` seconds for every one to write its address to PODIUM_READY_FD. Returns [(pid, start_time, address)]; on a failure every worker is ended and HostErrc.NOT_READY (or the spawn error) names the job, the worker and its log's tail (WP-1). Releases the GIL while it waits.
    """

def stop_worker(pid: int, start_time: int | None, grace: float) -> None:
    """
    Ends worker `pid` (when it still has `start_time`) and everything in its session: SIGTERM to its group, SIGKILL to what is left after `grace` seconds; returns when none is left (WP-2, WP-3). Releases the GIL while it waits.
    """

def worker_alive(pid: int, start_time: int) -> bool:
    """
    Whether live process `pid` has `start_time` (a reused pid is not the worker).
    """

def announce_ready(address: str) -> None:
    """
    The worker's side of the launch handshake: writes `address` to PODIUM_READY_FD and closes it (nothing when the variable is unset).
    """
