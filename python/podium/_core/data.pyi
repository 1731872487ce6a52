"""podium C++ layer data"""

from collections.abc import Sequence

import podium._core.mesh


def copy_now(op: tuple[bool, str, int, str, int, bytes, bytes, object, int, bool, int, bool, object, bool, str], timeout_s: float) -> int | None:
    """
    DA-43: copies the one operation `op` (as transfer() takes each) at once on this thread when it is a same-host one under a usable lease that its caller may copy whole (DA-31); then the sum of a summed read (DA-41), else 0. None when that does not apply or the copy failed: transfer() it then, which also reports the failure.
    """

def available() -> tuple:
    """
    (True, '') when this process's data plane (a UCX context and worker) runs, starting it on first use (DA-1); else (False, why). Before the podium runtime runs: whether UCX can start (a throwaway engine), since the engine is made for the proc's address (DA-21).
    """

def ucx_version() -> str:
    """The version of the UCX library in use."""

def net_devices() -> str:
    """
    The network devices UCX may use in this process (DA-21): UCX_NET_DEVICES when set, else the interface of this process's control-plane address ('lo' on Unix sockets); '' when neither applies (UCX's default, every device). Starts the data plane.
    """

def cuda_supported() -> bool:
    """
    Whether this process's UCX reaches CUDA memory (DA-23). Starts the data plane.
    """

def cma_allowed() -> bool:
    """
    Whether same-host transfers are copied with CMA (DA-10; PODIUM_RDMA_CMA=0: never).
    """

def worker_address() -> bytes:
    """
    This process's UCX worker address (what readers' endpoints are made from).
    """

def register_buffer(obj: object, owner: str, share: bool = True) -> tuple:
    """
    Registers the C-contiguous buffer `obj` (or a tensor's region (address, size, tensor[, cuda]), DA-23) for `owner` (an actor id); returns (id, token, addr, size, rkey, worker_address, writable, window): window is (fd, ino, dev, begin, end) of its shared pages (DA-29), or None. share=False: its pages are not moved into shared pages (DA-38). The buffer stays pinned and registered until drop or release_owner (DA-8).
    """

def drop(owner: str, id: int, token: str, timeout_s: float) -> podium._core.mesh.CoreFuture:
    """
    Asks the proc `owner` to drop its buffer `id` (its registration is released, DA-8, once every reader it leased the buffer to confirmed a revocation, DA-42, or once those leases ended, DA-27; the Future resolves then).
    """

def release_owner(owner: str) -> int:
    """
    Ends every buffer of the actor `owner` (it stopped); returns how many. Their registrations are released once every reader leased one of them confirmed a revocation (DA-42), or once those leases ended (DA-27).
    """

def lease_config() -> tuple:
    """
    (lease ms, max bytes): the lease this process asks for and grants at most, and the largest transfer that uses leases (PODIUM_RDMA_LEASE_MS, PODIUM_RDMA_LEASE_MAX_BYTES; DA-28).
    """

def set_lease(ms: int, max_bytes: int) -> None:
    """
    Sets this process's lease time (0: no leases) and bound, as the environment would (tests, benchmarks).
    """

def lease_left(owner: str, id: int, write: bool) -> float:
    """
    Seconds left of this process's lease on buffer `id` of the proc `owner` (0: none).
    """

def set_tcp_path(on: bool) -> None:
    """
    DA-49: whether this process's own transfers take podium's TCP path between hosts (PODIUM_RDMA_TCP until then); off, they go through UCX. For tests and benchmarks.
    """

def tcp_stats() -> dict:
    """
    Counters of podium's TCP path between hosts (DA-48, DA-49): transfers that took it, those finished by their caller, handed over, failed; idle connections kept; and, where this process serves one, its server's address and counters (DA-45).
    """

def lease_stats() -> dict:
    """
    Counters of leases (DA-26..DA-28, DA-42): checks this process answered as an owner, drops and releases it delayed for a lease, transfers it ran under leases and checked, leases held, drops and owner stops whose buffers it released once every lessee confirmed a revocation (before the leases' end), revocations it answered as a reader, revocations it asked for that a lessee did not confirm (its proc ended, the message failed).
    """

def bulk_now(ops: Sequence[tuple[bool, str, int, str, int, bytes, bytes, object, int, bool, int, bool, object, bool, str]], timeout_s: float) -> object:
    """
    DA-52: runs `ops` (one operation, as transfer() takes it) over podium's TCP path when it goes that way (DA-49): its sum (0 when not summed, DA-41) when its caller finished it at once, else the CoreFuture it runs under (handed over, or failed); None when it does not go over the TCP path (transfer() it then).
    """

def transfer(ops: Sequence[tuple[bool, str, int, str, int, bytes, bytes, object, int, bool, int, bool, object, bool, str]], timeout_s: float) -> podium._core.mesh.CoreFuture:
    """
    Runs one-sided operations, each (write, owner_proc, id, token, remote_addr, rkey, worker_address, local, size, same_host, owner_pid, remote_cuda, window, checksum): checked by their owners, then in parallel (same_host: the owner runs on this host, DA-9; its pid: CMA, DA-10; window: the buffer's shared pages, register_buffer's, DA-30). A CoreFuture of one reply; with a summed read (checksum, DA-41), its one part holds every operation's word sum (DA-40), 8 bytes little-endian each.
    """

def registration_count() -> int:
    """Regions this process has registered now (DA-2)."""

def buffer_count() -> int:
    """Buffers this process owns now."""

def wait_given_back() -> None:
    """
    Waits until the pages of every buffer of this process that ended are private again (DA-32: the give-back runs on a thread of its own; benchmarks wait for it so that it does not share the CPU with what they time next).
    """

def stats() -> dict:
    """
    The engine's counters, and whether UCX's tcp transport runs in it (DA-51).
    """
