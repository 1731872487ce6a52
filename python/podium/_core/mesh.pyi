"""podium C++ layer mesh"""

from collections.abc import Sequence
from typing import overload

import podium._core.ndslice


class Notifier:
    def __init__(self) -> None: ...

    def fileno(self) -> int: ...

    def drain(self) -> list[int]: ...

class CoreFuture:
    def ready(self) -> bool: ...

    @property
    def drives_loop(self) -> bool:
        """
        Whether wait() drives the proc's loop (False: the future is completed off the loop, DA-35).
        """

    def wait(self, timeout_s: float | None) -> bool: ...

    def replies(self) -> list: ...

    def reply_runs(self) -> list: ...

    def rank(self) -> int | None: ...

    def notify(self, notifier: Notifier, token: int) -> None: ...

def all_of(futures: Sequence[CoreFuture]) -> CoreFuture:
    """
    A future that completes once every one of `futures` is ready (read them then).
    """

def serve_faults() -> None:
    """
    Failures of meshes this process's root owns queue for next_fault() (instead of ending the process).
    """

def next_fault(timeout_s: float) -> dict | None:
    """
    The next failure for the root (a dict), or None after timeout_s or interrupt_faults().
    """

def interrupt_faults() -> None:
    """Makes the waiting next_fault() return None at once."""

def fault_raised(actor_id: str) -> bool:
    """
    Whether this process's Supervisor raised a failure of that actor to its owner (SV-7).
    """

class HttpServer:
    """
    DS-4: a loopback-only HTTP GET responder in C++ (channel/http.h, HT-1..HT-3) on this process's io threads; a Python thread takes its requests with next() and answers them with respond().
    """

    def __init__(self, addr: str) -> None:
        """Listens on `addr` ('tcp:127.0.0.1:PORT'; a loopback address only)."""

    @property
    def address(self) -> str:
        """The bound address."""

    def next(self, timeout_s: float) -> tuple[int, str] | None:
        """
        (request id, path with its query), or None after timeout_s or once stopped.
        """

    def respond(self, id: int, status: int, content_type: str, body: bytes) -> None:
        """Answers request `id` (once)."""

    @property
    def stopped(self) -> bool: ...

    def stop(self) -> None:
        """Closes the listener and every connection."""

def set_poll(runners_us: float, drivers_us: float) -> None:
    """
    How long idle runners and waiting callers poll the reactor before they sleep (µs).
    """

def init_controller(proc_argv: Sequence[str], zygote_argv: Sequence[str] = [], listen: str | None = None, via: str | None = None) -> None:
    """
    Starts the controller runtime; procs are started with `proc_argv`, forked from a zygote started with `zygote_argv` when it is given. `listen`: this process's address ('tcp:HOST:0' puts the job on TCP); None: a private Unix socket. `via`: a worker's address ('tcp://HOST:PORT') to attach this client through (its gateway; then `listen` is unused and this process listens nowhere). A second call does nothing.
    """

def default_host_address() -> str:
    """
    This machine's address as other hosts reach it (PODIUM_HOST_ADDR, else the default route's source address).
    """

def serve_worker(listen: str, proc_argv: Sequence[str], zygote_argv: Sequence[str], persistent: bool = False, on_listening: object | None = None, insecure: bool = False, until_shutdown: bool = False) -> None:
    """
    Runs this process as a host agent listening on `listen` (tcp://HOST:PORT, ipc://PATH, tcp://HOST:fdN or DIAL@BIND) until it is killed (with `until_shutdown`: until a controller shuts this host down, then returns); `on_listening(address)` runs once it listens. Without a secret in the environment it refuses to start unless `insecure` (SE-2).
    """

def secret_file() -> str:
    """
    PODIUM_SECRET_FILE as this process's C environment holds it now: the runtime sets it when it generates the controller's secret (SE-1), which os.environ does not see.
    """

def is_proc() -> bool:
    """True in a process that podium spawned as a proc, until it serves."""

def serve_proc() -> None:
    """Serves this proc until the controller says exit (or dies)."""

def shutdown() -> None:
    """
    Kills every proc this process spawned and stops its runtime. Idempotent.
    """

def max_frame_bytes() -> int:
    """
    The largest frame this process's channel sends or accepts: a call's arguments must fit in one, with its header.
    """

def this_proc_id() -> str:
    """The ProcId (channel address) of this process's root proc."""

def channel_stats() -> dict:
    """
    This process's root proc's channel counters (CH-15), its parts lent to peers and not yet acknowledged (CH-26), this process's pulls of lent parts (CH-25) and its parts sent and received in shared blocks (CH-29).
    """

def serve_gateway(addr: str) -> str:
    """
    DB-8: this process's root proc also accepts on `addr` ('tcp:HOST:PORT') as a gateway (channel GW-1..GW-4): clients that attach there (`podium debug`, `exec`, `logs`, `dashboard`) pass the channel's setup (the job's secret, TLS) and reach this proc's actors. Returns the bound address; again with the same address (or port 0) returns it.
    """

def probe(addr: str, timeout_ms: int) -> str | None:
    """
    One plain connect to `addr` (no handshake), closed at once: None when something accepted it, else why not (refused, unreachable, timed out).
    """

def lineage() -> list[str]:
    """
    This process's proc key, then those of the procs it descends from (ME-15).
    """

def cast_fanout() -> int:
    """
    Fan-out of the cast tree for casts from this process (0: always a star).
    """

def set_cast_fanout(k: int) -> None:
    """
    Sets the cast tree's fan-out for casts from this process (docs/cast.md).
    """

def traffic() -> tuple[int, int]:
    """
    (sent, received): envelopes this process's root proc exchanged with other procs.
    """

class PortReceiver:
    def __init__(self, once: bool) -> None: ...

    @property
    def port_id(self) -> str: ...

    def recv(self) -> CoreFuture:
        """
        A future of the next message, in arrival order: one reply, (True, parts) or (False, error).
        """

    def close(self) -> None: ...

def send_port(port: str, parts: object) -> None:
    """
    Sends `parts` to the port `port` (a PortId text), one-way; in order per sender.
    """

def send_reply(port: str, rank: int, parts: object) -> None:
    """
    Answers the call whose reply port is `port` as rank `rank` of its cast.
    """

class HostMesh:
    def __init__(self) -> None:
        """This host (no dimensions)."""

    @staticmethod
    def attach(workers: Sequence[str]) -> HostMesh:
        """The workers (tcp://HOST:PORT) as a mesh {'hosts': N}; returns at once."""

    @property
    def region(self) -> podium._core.ndslice.Region: ...

    def with_region(self, region: podium._core.ndslice.Region) -> HostMesh: ...

    def initialized(self) -> CoreFuture: ...

    def shutdown(self) -> CoreFuture:
        """
        Ends this controller's use of these hosts: their procs are killed, as stopped.
        """

    def spawn_procs(self, per_host: Sequence[tuple[str, int]], name: str = '', launches: Sequence[tuple[str, Sequence[str], Sequence[tuple[str, str]], Sequence[str], bool, Sequence[tuple[str, str]]]] = []) -> ProcMesh:
        """
        `launches`: none, or one per proc: (program, argv, env, unset, inherit_env, bind) (mesh/launch.h).
        """

    def find_procs(self, name: str) -> ProcMesh:
        """
        The proc mesh `name` that persistent workers kept; this process owns it now.
        """

    def hosts(self) -> list[tuple[str, str, bool, str | None]]:
        """Per host: (worker address, host name, attached, failure or None)."""

class ProcMesh:
    @staticmethod
    def spawn_procs(per_host: Sequence[tuple[str, int]], launches: Sequence[tuple[str, Sequence[str], Sequence[tuple[str, str]], Sequence[str], bool, Sequence[tuple[str, str]]]] = []) -> ProcMesh: ...

    @staticmethod
    def this_proc() -> ProcMesh: ...

    @property
    def region(self) -> podium._core.ndslice.Region: ...

    @property
    def extent(self) -> podium._core.ndslice.Extent: ...

    @property
    def size(self) -> int: ...

    @overload
    def slice(self, arg0: str, arg1: int, /) -> ProcMesh: ...

    @overload
    def slice(self, arg0: str, arg1: podium._core.ndslice.Range, /) -> ProcMesh: ...

    def split(self, arg0: str, arg1: Sequence[str], arg2: Sequence[int], /) -> ProcMesh: ...

    def flatten(self, arg: str, /) -> ProcMesh: ...

    def rename(self, arg0: str, arg1: str, /) -> ProcMesh: ...

    def initialized(self) -> CoreFuture: ...

    def spawn(self, type: str, name: str, parts: object, owner: str | None = '') -> ActorMesh:
        """
        Spawns; `owner` (an actor id, '' for this process's root, None for nobody) is told when an actor of the mesh fails.
        """

    def adopt(self, name: str, owner: str | None = '') -> ActorMesh:
        """
        The running actors `name` of these procs, now supervised by `owner` (as in spawn).
        """

    def stop(self, grace_ms: int) -> CoreFuture: ...

    def pid(self, arg: int, /) -> int: ...

    def exit_status(self, arg: int, /) -> str | None: ...

    def state(self) -> tuple:
        """
        (root labels, root sizes, [(proc id, pid, host)], region state, spawners), for pickling.
        """

    @staticmethod
    def from_state(labels: Sequence[str], sizes: Sequence[int], procs: Sequence[tuple[str, int, str]], region: tuple[Sequence[str], int, Sequence[int], Sequence[int]], spawners: Sequence[str] = []) -> ProcMesh:
        """A handle on procs that another process spawned (see state())."""

    def spawned_for(self, lineage: Sequence[str]) -> None:
        """
        ME-15: these procs (spawned here on attached hosts) belong to the proc lineage[0] (then the procs it descends from): they stop when one of those stops and are killed when one fails.
        """

    def ended(self) -> CoreFuture:
        """Resolves once every proc of the mesh is known here to have ended."""

    def stop_after(self, first: Sequence[CoreFuture], wait_ms: int, grace_ms: int) -> CoreFuture:
        """
        Stops the procs once every future in `first` is ready or after wait_ms.
        """

class ActorMesh:
    @property
    def name(self) -> str: ...

    @property
    def region(self) -> podium._core.ndslice.Region: ...

    @property
    def extent(self) -> podium._core.ndslice.Extent: ...

    @property
    def size(self) -> int: ...

    @overload
    def slice(self, arg0: str, arg1: int, /) -> ActorMesh: ...

    @overload
    def slice(self, arg0: str, arg1: podium._core.ndslice.Range, /) -> ActorMesh: ...

    def split(self, arg0: str, arg1: Sequence[str], arg2: Sequence[int], /) -> ActorMesh: ...

    def flatten(self, arg: str, /) -> ActorMesh: ...

    def rename(self, arg0: str, arg1: str, /) -> ActorMesh: ...

    def initialized(self) -> CoreFuture: ...

    def call(self, endpoint: str, parts: object) -> CoreFuture: ...

    def call_rank(self, rank: int, endpoint: str, parts: object) -> CoreFuture: ...

    def stream(self, endpoint: str, per_rank_parts: object) -> list[CoreFuture]:
        """Calls every rank; future k resolves with the k-th reply to arrive."""

    def broadcast(self, endpoint: str, parts: object) -> None: ...

    def least_loaded_rank(self) -> int: ...

    def cast_to_port(self, endpoint: str, parts: object, reply_port: str, only: int | None = None) -> None:
        """
        Sends to every actor of the region (or to rank `only`), answers going to `reply_port` (empty: one-way).
        """

    def state(self) -> tuple:
        """
        (name, root labels, root sizes, [(proc id, pid, host)], [target], region state, spawners).
        """

    @staticmethod
    def from_state(name: str, labels: Sequence[str], sizes: Sequence[int], procs: Sequence[tuple[str, int, str]], targets: Sequence[tuple[str, str, str, str] | None], region: tuple[Sequence[str], int, Sequence[int], Sequence[int]], spawners: Sequence[str] = []) -> ActorMesh:
        """A handle on actors that another process spawned (see state())."""

    def stop(self, grace_ms: int = 10000) -> CoreFuture:
        """
        Stops the actors; those not stopped after grace_ms have their proc killed.
        """

    def rank_info(self, rank: int) -> tuple:
        """
        (actor id, pid of its proc, host, rank and coordinates in the ProcMesh) of rank `rank` of this region.
        """
