"""Supervision while the owner is busy (issue 18, part 2; docs/supervision.md SV-6, SV-7).

As in Monarch, a child's failure reaches an async owner's ``__supervise__`` while one of its
endpoints is awaiting (the supervision runs as a task of the owner's event loop), not after
the endpoint returns. A failure the owner does not handle (a falsy return, or
``__supervise__`` raises) fails the owner at once, with its calls in progress: their callers
get SupervisionError without waiting for the bodies. And the owner's own code never sees the
child's error before ``__supervise__`` ran: an owner that awaits (or, sync, ``.get()``s) a
call on its failed child gets the error only after its ``__supervise__`` has handled it.

No timed assertions: the order is read from the owner's own log, and every wait is bounded
well below the in-flight calls' own waits (IN_FLIGHT_S)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from podium.actor import Actor, SupervisionError, concurrent_endpoint, endpoint

T = 30  # bound on each wait
IN_FLIGHT_S = 300  # how long an in-flight call would wait if nothing ended it

pytestmark = pytest.mark.timeout(120)


class Child(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def die(self) -> None:
        os._exit(9)

    @endpoint
    def exits(self) -> None:
        raise SystemExit(5)  # a BaseException: the actor fails, its proc lives

    @endpoint
    def sleep(self, s: float) -> float:
        time.sleep(s)
        return s


class Gate(Actor):
    """Another actor the owner awaits a call on: the call returns once `open` is called."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    @concurrent_endpoint
    async def wait_open(self) -> str:
        await asyncio.wait_for(self.opened.wait(), T)
        return "opened"

    @concurrent_endpoint
    async def open(self) -> None:
        self.opened.set()


class AsyncOwner(Actor):
    """Owns a child mesh; logs what happens in which order. `handle` is what __supervise__
    returns ("raise": it raises)."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.log: list = []
        self.supervised = asyncio.Event()

    async def __supervise__(self, failure) -> bool:
        self.log.append(("supervise", failure.mesh_name, failure.rank))
        self.supervised.set()
        if getattr(self, "gate", None) is not None:
            self.gate.open.broadcast()
        if self.handle == "raise":
            raise ValueError("this owner refuses its child's failure")
        return self.handle

    @endpoint
    async def spawn_child(self, procs, name: str) -> None:
        self.child = procs.spawn(name, Child)
        await self.child.initialized

    @endpoint
    async def kill_child_and_await_supervision(self, how: str) -> list:
        """Kills the child, then awaits (an event) until __supervise__ has run."""
        self.log.append(("endpoint", "started"))
        getattr(self.child, how).broadcast()
        await asyncio.wait_for(self.supervised.wait(), T)
        await asyncio.sleep(0.01)  # a handled failure leaves the endpoint to go on
        self.log.append(("endpoint", "resumed"))
        return list(self.log)

    @endpoint
    async def kill_child_and_await_another_call(self, gate) -> list:
        """Kills the child, then awaits a call on another actor that only __supervise__
        lets return."""
        self.gate = gate
        self.log.append(("endpoint", "started"))
        self.child.die.broadcast()
        self.log.append(("endpoint", await gate.wait_open.call_one()))
        return list(self.log)

    @endpoint
    async def kill_child_and_poll(self) -> list:
        """Kills the child, then sleeps in steps (asyncio.sleep) until __supervise__ ran."""
        self.log.append(("endpoint", "started"))
        self.child.die.broadcast()
        deadline = time.monotonic() + T
        while not self.supervised.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.log.append(("endpoint", "resumed"))
        return list(self.log)

    @endpoint
    async def kill_child_and_sleep(self, how: str) -> str:
        """A plain endpoint in flight when its child fails (it kills the child itself:
        calls that come after it wait for it to end, concurrent ones included)."""
        self.log.append(("endpoint", "sleeping"))
        getattr(self.child, how).broadcast()
        await asyncio.sleep(IN_FLIGHT_S)
        return "slept"

    @concurrent_endpoint
    async def concurrent_sleep(self) -> str:
        self.log.append(("concurrent", "sleeping"))
        await asyncio.sleep(IN_FLIGHT_S)
        return "slept"

    @endpoint
    async def call_child(self, how: str) -> list:
        """Awaits a call on the child that fails: the error comes after __supervise__."""
        try:
            await getattr(self.child, how).call_one()
        except SupervisionError as e:
            self.log.append(("endpoint saw", e.mesh_name, e.rank))
        return list(self.log)

    @concurrent_endpoint
    async def kill_child(self, how: str) -> None:
        getattr(self.child, how).broadcast()

    @concurrent_endpoint
    async def get_log(self) -> list:
        return list(self.log)


class SyncOwner(Actor):
    def __init__(self, handle) -> None:
        self.handle = handle
        self.log: list = []

    def __supervise__(self, failure) -> bool:
        self.log.append(("supervise", failure.mesh_name, failure.rank))
        return self.handle

    @endpoint
    def spawn_child(self, procs, name: str) -> None:
        self.child = procs.spawn(name, Child)
        self.child.initialized.get(timeout=T)

    @endpoint
    def call_child(self, how: str, whole_mesh: bool = False) -> list:
        """Blocks in .get() on a call on the child that fails: __supervise__ runs on this
        thread before the error is raised here."""
        ep = getattr(self.child, how)
        try:
            (ep.call() if whole_mesh else ep.call_one()).get(timeout=T)
        except SupervisionError as e:
            self.log.append(("endpoint saw", e.mesh_name, e.rank))
        return list(self.log)

    @endpoint
    def get_log(self) -> list:
        return list(self.log)


def _owner(spawn, new_procs, cls, handle, child: str):
    owner = spawn(cls, handle, on=new_procs(gpus=1)).slice(gpus=0)
    owner.spawn_child.call_one(new_procs(gpus=1), child).get(timeout=T)
    return owner


def _eventually(what, check):
    deadline = time.monotonic() + T
    while True:
        got = what()
        if check(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


@pytest.mark.parametrize("how", ["die", "exits"])
def test_supervise_runs_while_the_owner_awaits_in_an_endpoint(spawn, new_procs, faults, how):
    """SV-6: the endpoint awaits an event that only __supervise__ sets; it resumes, so
    __supervise__ ran during the await (before, it waited for the endpoint to end: a
    deadlock, ended by asyncio.wait_for's TimeoutError)."""
    owner = _owner(spawn, new_procs, AsyncOwner, True, f"busy_child_{how}")
    log = owner.kill_child_and_await_supervision.call_one(how).get(timeout=T)
    assert log == [("endpoint", "started"), ("supervise", f"busy_child_{how}", 0),
                   ("endpoint", "resumed")]
    assert faults() == []  # handled: nothing reaches the root


def test_supervise_runs_while_the_owner_awaits_a_call_on_another_actor(spawn, new_procs,
                                                                      faults):
    """SV-6: the owner's endpoint awaits a call that returns only once __supervise__ ran (it
    opens the gate): so __supervise__ ran during that await."""
    owner = _owner(spawn, new_procs, AsyncOwner, True, "busy_child_gate")
    gate = spawn(Gate, on=new_procs(gpus=1))
    gate.initialized.get(timeout=T)  # before another process calls it
    gate = gate.slice(gpus=0)
    log = owner.kill_child_and_await_another_call.call_one(gate).get(timeout=T)
    assert log == [("endpoint", "started"), ("supervise", "busy_child_gate", 0),
                   ("endpoint", "opened")]
    assert faults() == []


def test_supervise_runs_while_the_owner_sleeps_in_asyncio(spawn, new_procs, faults):
    owner = _owner(spawn, new_procs, AsyncOwner, True, "busy_child_sleep")
    log = owner.kill_child_and_poll.call_one().get(timeout=T)
    assert log == [("endpoint", "started"), ("supervise", "busy_child_sleep", 0),
                   ("endpoint", "resumed")]
    assert faults() == []


@pytest.mark.parametrize("handle", [False, None, "raise"])
def test_an_unhandled_failure_fails_the_owner_and_its_calls_in_flight_at_once(
        spawn, new_procs, faults, handle):
    """SV-6: a falsy __supervise__ (or one that raises) fails the owner at once: its call in
    progress and its concurrent calls raise SupervisionError now, not after IN_FLIGHT_S,
    naming the failure it did not handle; later calls are refused; the root hears of the
    owner's failure."""
    owner = _owner(spawn, new_procs, AsyncOwner, handle, "unhandled_busy_child")
    concurrent = owner.concurrent_sleep.call_one()
    _eventually(owner.get_log.call_one().get, lambda l: len(l) == 1)  # in flight
    sleeping = owner.kill_child_and_sleep.call_one("die")
    for pending in (sleeping, concurrent):
        with pytest.raises(SupervisionError) as info:
            pending.get(timeout=T)  # T is well below IN_FLIGHT_S
        text = str(info.value)
        how = "did not handle" if handle != "raise" else "raised in __supervise__ for"
        assert f"{how} the failure of mesh 'unhandled_busy_child' it owns" in text, text
        assert "actor unhandled_busy_child[0] of mesh 'unhandled_busy_child'" in text, text
    if handle == "raise":
        assert "this owner refuses its child's failure" in str(info.value)
    with pytest.raises(SupervisionError):
        owner.get_log.call_one().get(timeout=T)
    got = faults.wait(1)
    assert [f.mesh_name for f in got] == [owner.name], [f.report() for f in got]


@pytest.mark.parametrize("how", ["die", "exits"])
def test_an_async_owner_sees_its_childs_error_only_after_supervise(spawn, new_procs, faults,
                                                                    how):
    """SV-7: the owner's await of a call on its failed child raises after __supervise__ ran
    for that failure (the failure report and the call's error travel apart: before, the
    error could come first)."""
    owner = _owner(spawn, new_procs, AsyncOwner, True, f"ordered_child_{how}")
    log = owner.call_child.call_one(how).get(timeout=T)
    assert log == [("supervise", f"ordered_child_{how}", 0),
                   ("endpoint saw", f"ordered_child_{how}", 0)]
    assert faults() == []


@pytest.mark.parametrize("whole_mesh", [False, True], ids=["call_one", "call"])
@pytest.mark.parametrize("how", ["die", "exits"])
def test_a_sync_owner_sees_its_childs_error_only_after_supervise(spawn, new_procs, faults,
                                                                  how, whole_mesh):
    """SV-7 for an owner whose endpoints are `def`: blocked in .get() on its child
    (`child.x.call_one().get()` or `child.x.call().get()`), it runs __supervise__ on its own
    thread before .get() raises; a failure that is supervised once is not supervised again
    when another call on that actor fails."""
    owner = _owner(spawn, new_procs, SyncOwner, True, f"sync_ordered_child_{how}")
    log = owner.call_child.call_one(how, whole_mesh).get(timeout=T)
    assert log == [("supervise", f"sync_ordered_child_{how}", 0),
                   ("endpoint saw", f"sync_ordered_child_{how}", 0)]
    log = owner.call_child.call_one("pid").get(timeout=T)
    assert log[2:] == [("endpoint saw", f"sync_ordered_child_{how}", 0)]
    assert faults() == []


@pytest.mark.parametrize("cls", [AsyncOwner, SyncOwner])
def test_an_unhandled_child_failure_reaches_the_owners_caller_as_the_owners_failure(
        spawn, new_procs, faults, cls):
    """SV-6 with SV-7: an owner awaiting a call on its child when the child fails and the
    owner does not handle it: the owner's caller gets SupervisionError for the owner, whose
    cause is the child's report, so __supervise__ had run before that caller saw anything."""
    owner = _owner(spawn, new_procs, cls, False, f"unhandled_ordered_{cls.__name__}")
    with pytest.raises(SupervisionError) as info:
        owner.call_child.call_one("die").get(timeout=T)
    text = str(info.value)
    assert (f"did not handle the failure of mesh 'unhandled_ordered_{cls.__name__}' it owns"
            in text), text
    assert info.value.mesh_name == owner.name and info.value.endpoint == "call_child"
    got = faults.wait(1)
    assert [f.mesh_name for f in got] == [owner.name], [f.report() for f in got]
