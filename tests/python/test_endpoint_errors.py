"""No silent hang, no nameless error (issue 16; docs/supervision.md "Endpoint errors",
EP-1..EP-4): whatever an endpoint raises, in its body or while its reply is pickled, and
whatever a reply does when it is unpickled, the caller gets an error that names the actor mesh,
the rank and the endpoint, the actor's thread survives to answer, and calls made at the same
time by others complete. Every wait is bounded; a hang fails the test (pytest-timeout)."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from podium.actor import (
    Actor,
    ActorError,
    Channel,
    SupervisionError,
    concurrent_endpoint,
    endpoint,
    send,
)
from podium._src.errors import ReplyDecodeError

T = 20  # bound on each wait

pytestmark = pytest.mark.timeout(120)


# --- values and exceptions that misbehave when pickled or unpickled -------------------------


class ExitWhenPickled:
    """A result whose pickling raises SystemExit (its __reduce__ runs in the actor)."""

    def __reduce__(self):
        raise SystemExit(7)


class FailsWhenPickled:
    def __reduce__(self):
        raise ValueError("this result refuses to be pickled")


def _refuse(what):
    raise ValueError(f"{what} refuses to be unpickled")


def _exit_on_load():
    raise SystemExit(9)


class FailsWhenUnpickled:
    """Pickles fine; its reconstructor raises where it is unpickled (the caller)."""

    def __reduce__(self):
        return (_refuse, ("FailsWhenUnpickled",))


class ExitsWhenUnpickled:
    def __reduce__(self):
        return (_exit_on_load, ())


class StateRefused:
    """Pickles fine; its __setstate__ raises on the caller."""

    def __init__(self):
        self.x = 1

    def __setstate__(self, state):
        raise TypeError("StateRefused.__setstate__ says no")


class StrRaises(Exception):
    def __str__(self):
        raise RuntimeError("__str__ of StrRaises raised")


class ReduceExits(Exception):
    def __reduce__(self):
        raise SystemExit(5)


class NeedsTwoArgs(Exception):
    """The classic: pickles, but unpickling calls __init__ with one argument."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


# --- actors -----------------------------------------------------------------------------------


class Holds(Actor):
    def __init__(self, data) -> None:
        self.n = len(data)

    @endpoint
    def held(self):
        return self.n


class Sync(Actor):
    @endpoint
    def ok(self):
        return os.getpid()

    @endpoint
    def too_large_a_result(self):
        import mmap
        import numpy as np
        self.big = mmap.mmap(-1, 1 << 31)  # untouched pages: nothing is allocated
        return np.frombuffer(self.big, dtype=np.uint8)

    @endpoint
    def slow(self, s):
        time.sleep(s)
        return s

    @endpoint
    def system_exit(self):
        raise SystemExit(3)

    @endpoint
    def result_exits_when_pickled(self):
        return ExitWhenPickled()

    @endpoint
    def result_fails_when_pickled(self):
        return FailsWhenPickled()

    @endpoint
    def raise_str_raises(self):
        raise StrRaises()

    @endpoint
    def raise_reduce_exits(self):
        raise ReduceExits("cannot travel")

    @endpoint
    def raise_needs_two_args(self):
        raise NeedsTwoArgs(1, 2)

    @endpoint
    def result_fails_when_unpickled(self, which):
        return {"reduce": FailsWhenUnpickled, "setstate": StateRefused,
                "exit": ExitsWhenUnpickled}[which]()

    @endpoint
    def stream_then_interrupt(self, port, n):
        """A streaming endpoint: sends n items to `port`, then a BaseException mid-stream."""
        for i in range(n):
            port.send(i)
        raise KeyboardInterrupt("interrupted mid-stream")

    @endpoint
    def rank_exits(self, bad_rank):
        from podium.actor import current_rank

        if current_rank().rank == bad_rank:
            raise SystemExit(11)
        return current_rank().rank


class Async(Actor):
    @endpoint
    async def ok(self):
        return os.getpid()

    @endpoint
    async def keyboard_interrupt(self):
        await asyncio.sleep(0)
        raise KeyboardInterrupt("an async endpoint interrupted")

    @endpoint
    async def stray_task_exits(self):
        async def bad():
            raise SystemExit(13)

        asyncio.get_running_loop().create_task(bad())
        await asyncio.sleep(0.2)
        return "survived"


class Answers(Actor):
    """Explicit response-port endpoints, plain and concurrent."""

    @endpoint(explicit_response_port=True)
    async def exits_before_answering(self, port):
        raise SystemExit(31)

    @concurrent_endpoint(explicit_response_port=True)
    async def raises_before_answering(self, port):
        await asyncio.sleep(0)
        raise ValueError("no answer from me")

    @concurrent_endpoint(explicit_response_port=True)
    async def raises_after_answering(self, port):
        port.send("answered")
        raise ValueError("raised after the answer")

    @endpoint
    async def ok(self):
        return os.getpid()


class Owner(Actor):
    """Owns a child mesh; its __supervise__ raises SystemExit."""

    @endpoint
    def spawn_child(self, procs):
        self.child = procs.spawn(f"child-of-{os.getpid()}", Sync)
        self.child.initialized.get(timeout=T)
        return self.child.name

    @endpoint
    def fail_child(self):
        self.child.slice(gpus=0).system_exit.broadcast()

    @endpoint
    def ok(self):
        return 1

    def __supervise__(self, failure):
        raise SystemExit(41)


class ExitInInit(Actor):
    def __init__(self):
        raise SystemExit(21)

    @endpoint
    def ok(self):
        return 1


class ExitInCleanup(Actor):
    @endpoint
    def ok(self):
        return 1

    def __cleanup__(self):
        raise SystemExit(22)


def _names(e: BaseException, mesh, rank: int, endpoint_name: str) -> str:
    """Asserts that the error's text names the mesh, the rank and the endpoint."""
    text = str(e)
    assert mesh.name in text, text
    assert f"rank {rank}" in text, text
    assert endpoint_name in text, text
    return text


def _failed_actor(e: SupervisionError, mesh, rank: int, endpoint_name: str, cause: str) -> None:
    text = _names(e, mesh, rank, endpoint_name)
    assert e.endpoint == endpoint_name, e.endpoint
    assert e.mesh_name == mesh.name and e.rank == rank, (e.mesh_name, e.rank)
    assert cause in text and cause in e.cause, text


def _stops_at_once(mesh) -> None:
    """The stop is answered (a failed actor's stop raises its failure), not escalated to a
    kill of the proc after the 10 s grace."""
    t = time.monotonic()
    try:
        mesh.stop().get(timeout=T)
    except SupervisionError:
        pass
    assert time.monotonic() - t < 5


# --- EP-1: an endpoint's BaseException fails the actor; its Exception fails the call ----------


def test_system_exit_in_a_sync_endpoint_fails_the_actor_not_the_proc(spawn, faults):
    """EP-1: SystemExit fails the actor (Monarch: a BaseException kills the actor and is
    supervised); the caller's error names it; its proc and other callers go on."""
    mesh = spawn(Sync)
    neighbour = spawn(Sync)  # same procs
    pending = neighbour.slow.call(0.3)
    with pytest.raises(SupervisionError) as info:
        mesh.slice(gpus=1).system_exit.call_one().get(timeout=T)
    _failed_actor(info.value, mesh, 1, "system_exit", "SystemExit: 3")
    assert pending.get(timeout=T).values() == [0.3, 0.3]
    with pytest.raises(SupervisionError) as later:
        mesh.slice(gpus=1).ok.call_one().get(timeout=T)
    _failed_actor(later.value, mesh, 1, "ok", "SystemExit: 3")
    assert mesh.slice(gpus=0).ok.call_one().get(timeout=T) > 0  # rank 0 lives
    assert len(set(neighbour.ok.call().get(timeout=T).values())) == 2  # so does the proc
    (failure,) = [f for f in faults.wait(1) if f.mesh_name == mesh.name]
    assert failure.rank == 1 and "SystemExit: 3" in failure.cause, failure.report()


def test_keyboard_interrupt_in_an_async_endpoint_fails_the_actor(spawn, faults):
    """EP-1 for async actors."""
    mesh = spawn(Async)
    with pytest.raises(SupervisionError) as info:
        mesh.slice(gpus=0).keyboard_interrupt.call_one().get(timeout=T)
    _failed_actor(info.value, mesh, 0, "keyboard_interrupt",
                  "KeyboardInterrupt: an async endpoint interrupted")
    assert mesh.slice(gpus=1).ok.call_one().get(timeout=T) > 0
    with pytest.raises(SupervisionError):
        mesh.slice(gpus=0).ok.call_one().get(timeout=T)
    assert [f.rank for f in faults.wait(1) if f.mesh_name == mesh.name] == [0]


def test_system_exit_while_the_result_is_pickled_fails_the_actor(spawn, faults):
    """EP-1: the reply's encoding runs user code (__reduce__); its SystemExit fails the
    actor like one raised in the body. Before issue 16 it killed the actor's thread and the
    caller waited forever."""
    mesh = spawn(Sync)
    neighbour = spawn(Sync)
    pending = neighbour.slow.call(0.3)
    with pytest.raises(SupervisionError) as info:
        mesh.slice(gpus=1).result_exits_when_pickled.call_one().get(timeout=T)
    _failed_actor(info.value, mesh, 1, "result_exits_when_pickled", "SystemExit: 7")
    assert "while its result was pickled" in str(info.value)
    assert pending.get(timeout=T).values() == [0.3, 0.3]
    with pytest.raises(SupervisionError):  # the thread still answers, refusing
        mesh.slice(gpus=1).ok.call_one().get(timeout=T)
    _stops_at_once(mesh)
    assert [f.rank for f in faults.wait(1) if f.mesh_name == mesh.name] == [1]


def test_an_exception_while_the_result_is_pickled_fails_the_call_only(spawn):
    mesh = spawn(Sync).slice(gpus=0)
    with pytest.raises(ActorError) as info:
        mesh.result_fails_when_pickled.call_one().get(timeout=T)
    _names(info.value, mesh, 0, "result_fails_when_pickled")
    assert "this result refuses to be pickled" in str(info.value)
    assert mesh.ok.call_one().get(timeout=T) > 0


def test_arguments_too_large_for_one_message_are_refused_and_the_actor_serves_on(spawn):
    # 2 GiB of arguments cannot go in one frame. Refused before anything is sent: the sender's
    # channel refused it after the call took its place in the ordered stream, so the actor was
    # reported failed and its next call waited 10 s for the missing one.
    import mmap
    import numpy as np
    mesh = spawn(Sync).slice(gpus=0)
    big = mmap.mmap(-1, 1 << 31)  # untouched pages: nothing is allocated (unmapped with it)
    arr = np.frombuffer(big, dtype=np.uint8)  # an out-of-band part, pickled without a copy
    with pytest.raises(ValueError, match=r"the arguments of Sync.slow\(\) \(\d+ bytes\) cannot "
                                         r"go in one message between procs, which holds at "
                                         r"most \d+ bytes \(max_frame_bytes"):
        mesh.slow.call_one(arr)
    with pytest.raises(ValueError, match="cannot go in one message between procs"):
        mesh.slow.broadcast(arr)
    from podium.actor import Channel
    port, _receiver = Channel.open()
    with pytest.raises(ValueError, match="the value .* cannot go in one message"):
        port.send(arr)
    with pytest.raises(ValueError, match=r"the arguments of Holds\(\) \(\d+ bytes\) cannot go"):
        spawn(Holds, arr)  # a spawn's arguments travel in one message too
    # A result too large fails its call (ActorError naming it), not the caller's wait.
    with pytest.raises(ActorError, match=r"the result of .*too_large_a_result \(\d+ bytes\) "
                                         r"cannot go in one message"):
        mesh.too_large_a_result.call_one().get(timeout=T)
    assert mesh.ok.call_one().get(timeout=T) > 0


@pytest.mark.parametrize("name, kept", [
    ("raise_reduce_exits", "ReduceExits: cannot travel"),
    ("raise_needs_two_args", "NeedsTwoArgs: 1/2"),
])
def test_an_exception_that_cannot_travel_still_fails_the_call_with_its_name(spawn, name, kept):
    """EP-2: an exception whose __reduce__ raises SystemExit, or that pickles but cannot be
    unpickled, reaches the caller as ActorError naming the actor, rank and endpoint, with a
    RuntimeError that keeps its type and text; the actor lives. Before issue 16 the first
    killed the actor's thread (the caller hung) and the second reached the caller as a bare
    TypeError naming nothing."""
    mesh = spawn(Sync)
    one = mesh.slice(gpus=1)
    with pytest.raises(ActorError) as info:
        getattr(one, name).call_one().get(timeout=T)
    _names(info.value, mesh, 1, name)
    assert isinstance(info.value.exception, RuntimeError), info.value.exception
    assert str(info.value.exception) == kept
    assert one.ok.call_one().get(timeout=T) > 0


def test_an_exception_whose_str_raises(spawn, faults):
    """EP-1/EP-2: its text is "<its str() raised>" wherever podium writes it, in the
    caller's ActorError and in the failure of an actor that raised it in a broadcast (before
    issue 16 that killed the actor's thread: later calls hung)."""
    mesh = spawn(Sync)
    with pytest.raises(ActorError) as info:
        mesh.slice(gpus=0).raise_str_raises.call_one().get(timeout=T)
    _names(info.value, mesh, 0, "raise_str_raises")
    assert type(info.value.exception).__name__ == "StrRaises"
    mesh.slice(gpus=1).raise_str_raises.broadcast()
    with pytest.raises(SupervisionError) as info:
        mesh.slice(gpus=1).ok.call_one().get(timeout=T)
    _failed_actor(info.value, mesh, 1, "ok", "StrRaises: <its str() raised>")
    assert [f.rank for f in faults.wait(1) if f.mesh_name == mesh.name] == [1]


# --- EP-3: the actor's thread is never lost ---------------------------------------------------


def test_a_stray_task_that_raises_system_exit_fails_the_actor_and_the_thread_serves_on(
        spawn, faults):
    """EP-3: asyncio lets SystemExit out of the event loop from a task the actor created;
    the actor fails (pending and later callers learn it) and its thread answers the stop."""
    mesh = spawn(Async)
    one = mesh.slice(gpus=0)
    with pytest.raises(SupervisionError) as info:
        one.stray_task_exits.call_one().get(timeout=T)
    assert "SystemExit: 13" in str(info.value), str(info.value)
    _names(info.value, mesh, 0, "stray_task_exits")
    with pytest.raises(SupervisionError):
        one.ok.call_one().get(timeout=T)
    _stops_at_once(mesh)
    assert [f.rank for f in faults.wait(1) if f.mesh_name == mesh.name] == [0]


def test_explicit_response_port_endpoints(spawn, faults):
    """EP-1 and EP-7 for explicit response ports: whatever escapes the method fails the
    actor, as Monarch does. A caller still waiting gets SupervisionError naming the cause
    (before issue 16 a concurrent one waited forever; before issue 18 an Exception failed the
    call only); a caller answered before the raise keeps its answer, and the actor fails."""
    mesh = spawn(Answers)
    with pytest.raises(SupervisionError) as info:
        mesh.slice(gpus=0).raises_before_answering.call_one().get(timeout=T)
    _failed_actor(info.value, mesh, 0, "raises_before_answering",
                  "ValueError: no answer from me")
    with pytest.raises(SupervisionError) as info:
        mesh.slice(gpus=1).exits_before_answering.call_one().get(timeout=T)
    _failed_actor(info.value, mesh, 1, "exits_before_answering", "SystemExit: 31")
    later = spawn(Answers)
    assert later.slice(gpus=0).raises_after_answering.call_one().get(timeout=T) == "answered"
    with pytest.raises(SupervisionError) as info:
        later.slice(gpus=0).ok.call_one().get(timeout=T)
    _failed_actor(info.value, later, 0, "ok", "ValueError: raised after the answer")
    assert "after it answered" in str(info.value)
    assert later.slice(gpus=1).ok.call_one().get(timeout=T) > 0  # its other rank serves on
    got = faults.wait(3)
    assert sorted((f.mesh_name, f.rank) for f in got) == sorted(
        [(mesh.name, 0), (mesh.name, 1), (later.name, 0)])


def test_system_exit_in_supervise_fails_the_owner(spawn, procs, faults):
    """EP-1 for __supervise__: SystemExit there means "not handled": the owner fails, its
    owner (here the root) is told, with both causes, and callers of the owner learn it."""
    owner = spawn(Owner).slice(gpus=1)
    child = owner.spawn_child.call_one(procs).get(timeout=T)
    owner.fail_child.call_one().get(timeout=T)
    got = [f for f in faults.wait(1) if f.mesh_name == owner.name]
    assert got, [f.report() for f in faults()]
    report = got[0].report()
    assert "raised in __supervise__" in report and "SystemExit: 41" in report, report
    assert f"mesh '{child}'" in report and "SystemExit: 3" in report, report
    with pytest.raises(SupervisionError) as info:
        owner.ok.call_one().get(timeout=T)
    assert "SystemExit: 41" in str(info.value) and info.value.endpoint == "ok"


def test_system_exit_in_init_and_in_cleanup(spawn, faults):
    bad = spawn(ExitInInit)
    with pytest.raises(SupervisionError) as info:
        bad.initialized.get(timeout=T)
    assert "SystemExit: 21" in str(info.value) and bad.name in str(info.value)
    clean = spawn(ExitInCleanup)
    assert clean.ok.call().get(timeout=T).values() == [1, 1]
    _stops_at_once(clean)


def test_a_streaming_endpoint_interrupted_mid_stream(spawn, faults):
    """EP-1 for a streaming endpoint (it sends items to a port, then raises a BaseException):
    the items sent arrive, the call fails naming actor, rank and endpoint; stream() over a
    mesh where one rank exits gives the others' values and that rank's error."""
    mesh = spawn(Sync)
    port, receiver = Channel.open()
    with pytest.raises(SupervisionError) as info:
        mesh.slice(gpus=1).stream_then_interrupt.call_one(port, 3).get(timeout=T)
    _failed_actor(info.value, mesh, 1, "stream_then_interrupt",
                  "KeyboardInterrupt: interrupted mid-stream")
    assert [receiver.recv().get(timeout=T) for _ in range(3)] == [0, 1, 2]

    other = spawn(Sync)
    results, errors = [], []
    for f in other.rank_exits.stream(1):
        try:
            results.append(f.get(timeout=T))
        except SupervisionError as e:
            errors.append(e)
    assert results == [0]
    (e,) = errors
    _failed_actor(e, other, 1, "rank_exits", "SystemExit: 11")
    assert sorted(f.mesh_name for f in faults.wait(2)
                  if f.mesh_name in (mesh.name, other.name)) == sorted([mesh.name, other.name])


# --- EP-4: a reply that cannot be unpickled by the caller -------------------------------------


@pytest.mark.parametrize("which, cause", [
    ("reduce", "ValueError: FailsWhenUnpickled refuses to be unpickled"),
    ("setstate", "TypeError: StateRefused.__setstate__ says no"),
    ("exit", "SystemExit: 9"),
])
def test_a_reply_that_cannot_be_unpickled_names_actor_rank_and_endpoint(spawn, which, cause):
    """EP-4, on every path that decodes replies: call_one, choose, call (ValueMesh), stream;
    SystemExit raised by unpickling is such an error too, not an exit of the caller."""
    mesh = spawn(Sync)
    ep = "result_fails_when_unpickled"

    def check(e, rank):
        assert isinstance(e, ReplyDecodeError), repr(e)
        assert isinstance(e, ActorError)
        text = _names(e, mesh, rank, ep)
        assert cause in text, text
        assert (e.mesh_name, e.endpoint, e.rank) == (mesh.name, ep, rank)
        assert e.__cause__ is e.exception and cause.split(":")[0] == type(e.exception).__name__

    with pytest.raises(ReplyDecodeError) as info:
        mesh.slice(gpus=1).result_fails_when_unpickled.call_one(which).get(timeout=T)
    check(info.value, 1)  # named by its rank in the mesh, not in the slice
    with pytest.raises(ReplyDecodeError) as info:
        mesh.result_fails_when_unpickled.call(which).get(timeout=T)
    check(info.value, 0)
    with pytest.raises(ReplyDecodeError) as info:
        mesh.result_fails_when_unpickled.choose(which).get(timeout=T)
    check(info.value, info.value.rank)
    for f in mesh.result_fails_when_unpickled.stream(which):
        with pytest.raises(ReplyDecodeError) as info:
            f.get(timeout=T)
        check(info.value, info.value.rank)
    assert len(set(mesh.ok.call().get(timeout=T).values())) == 2  # the actors live on


def test_a_message_to_a_port_that_cannot_be_unpickled_names_the_port(spawn):
    """EP-4 for send(..., port=p): the receiver's error names the port (a port's messages do
    not carry their sender) and chains the cause."""
    mesh = spawn(Sync)
    port, receiver = Channel.open()
    send(mesh.result_fails_when_unpickled, ("setstate",), {}, port=port)
    for _ in range(2):
        with pytest.raises(ReplyDecodeError) as info:
            receiver.recv().get(timeout=T)
        assert port._port_id in str(info.value)
        assert isinstance(info.value.__cause__, TypeError)


# --- SV-4: a failure names the host the actor ran on ------------------------------------------

ELSEWHERE = "podium-elsewhere"  # the worker's host name, in a UTS namespace of its own


def test_failures_of_an_actor_on_another_host_name_that_host(tmp_path):
    """SV-4: the SupervisionError a caller gets (in the controller, and in a proc that holds
    a reference to the mesh) and the MeshFailure its owner gets name the host where the actor
    ran, not the host of the process that builds the report. The worker runs with a host
    name of its own (unshare --uts). Before issue 16 the SupervisionError named the
    controller's host."""
    import shutil
    import subprocess

    from test_multihost import Worker, run_controller

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a host name of its own")
    probe = subprocess.run(["unshare", "--uts", "hostname", ELSEWHERE], capture_output=True,
                           timeout=10)
    if probe.returncode != 0:
        pytest.skip(f"unshare --uts is refused here: {probe.stderr!r}")
    here = os.uname().nodename
    assert here != ELSEWHERE
    worker = Worker(argv=["unshare", "--uts", "sh", "-c",
                          f"hostname {ELSEWHERE} && exec {sys.executable} -m podium worker "
                          f"--listen tcp://127.0.0.1:0"])
    try:
        r = run_controller(tmp_path, """
            import socket
            from podium.actor import this_host
            enable_transport("tcp://127.0.0.1:0")
            seen = []
            podium.actor.unhandled_fault_hook = seen.append
            hosts, err, _ = try_attach(WORKERS)
            assert err is None, err

            class Bad(Actor):
                @endpoint
                def host(self):
                    return socket.gethostname()

                @endpoint
                def die(self):
                    raise SystemExit(4)

            class Relay(Actor):
                @endpoint
                def call(self, mesh):
                    try:
                        mesh.host.call_one().get(timeout=30)
                    except SupervisionError as e:
                        return (socket.gethostname(), e.host, named(e))

            def named(e):
                # Which host the error's text names (short: the runtime's log lines share
                # this stdout, so only short, flushed lines are printed).
                text = str(e)
                return [h for h in (ELSEWHERE, socket.gethostname()) if f"host {h}," in text]

            ELSEWHERE = "@ELSEWHERE@"

            bad = hosts.spawn_procs(per_host={"gpus": 1}).spawn("bad", Bad)
            print("ACTOR_HOST", bad.host.call_one().get(timeout=30), flush=True)
            try:
                bad.die.call_one().get(timeout=30)
            except SupervisionError as e:
                print("ERROR_HOST", e.host, flush=True)
                print("ERROR_NAMES", *named(e), flush=True)
            t = time.monotonic()
            while not seen and time.monotonic() - t < 10:
                time.sleep(0.02)
            print("FAILURE_HOST", seen[0].host if seen else None, flush=True)
            relay = this_host().spawn_procs(per_host={"p": 1}).spawn("relay", Relay)
            local, host, names = relay.call.call_one(bad).get(timeout=30)
            print("RELAY", local, host, flush=True)
            print("RELAY_NAMES", *names, flush=True)
            """.replace("@ELSEWHERE@", ELSEWHERE), [worker.address])
    finally:
        worker.kill()
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines()
                 if line.split(" ", 1)[0].isupper() and " " in line)
    assert lines.get("ACTOR_HOST") == ELSEWHERE, out
    assert lines.get("ERROR_HOST") == ELSEWHERE, out
    assert lines.get("ERROR_NAMES") == ELSEWHERE, out  # and not the controller's host
    assert lines.get("FAILURE_HOST") == ELSEWHERE, out
    assert lines.get("RELAY") == f"{here} {ELSEWHERE}", out
    assert lines.get("RELAY_NAMES") == ELSEWHERE, out
