"""@concurrent_endpoint, as_endpoint(), Accumulator (API.md "Endpoints and adverbs",
"Results")."""

from __future__ import annotations

import asyncio
import operator
import os

import pytest

from podium.actor import (
    Accumulator,
    Actor,
    ActorError,
    as_endpoint,
    concurrent_endpoint,
    current_rank,
    current_size,
    endpoint,
    Port,
    SupervisionError,
)

T = 10  # seconds: bound on every get() below


class Gate(Actor):
    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.log = []

    @concurrent_endpoint
    async def wait(self) -> str:
        self.entered.set()
        await self.release.wait()
        return f"released {current_rank().rank}"

    @endpoint
    async def open(self) -> str:
        await self.entered.wait()
        self.release.set()
        return "opened"

    @endpoint
    async def step(self, i: int) -> int:
        self.log.append(("start", i))
        await asyncio.sleep(0.01)
        self.log.append(("end", i))
        return i

    @endpoint
    async def steps(self) -> list:
        return self.log

    @concurrent_endpoint(explicit_response_port=True)
    async def started(self, port: Port) -> None:
        port.send("started")
        await self.release.wait()

    @concurrent_endpoint
    async def fail(self) -> None:
        raise ValueError("concurrent boom")


def test_concurrent_endpoint_bodies_overlap(spawn):
    one = spawn(Gate).slice(gpus=0)
    waiting = one.wait.call_one()  # suspends until `open` runs: only possible if they overlap
    assert one.open.call_one().get(timeout=T) == "opened"
    assert waiting.get(timeout=T) == "released 0"


def test_plain_endpoints_of_an_async_actor_stay_one_at_a_time(spawn):
    one = spawn(Gate).slice(gpus=1)
    futures = [one.step.call_one(i) for i in range(4)]
    assert [f.get(timeout=T) for f in futures] == [0, 1, 2, 3]
    assert one.steps.call_one().get(timeout=T) == [(k, i) for i in range(4)
                                                   for k in ("start", "end")]


def test_concurrent_explicit_port_answers_while_it_still_runs(spawn):
    one = spawn(Gate).slice(gpus=0)
    assert one.started.call_one().get(timeout=T) == "started"
    assert one.step.call_one(7).get(timeout=T) == 7  # not blocked by the running body


def test_concurrent_endpoint_exception_reaches_the_caller(spawn):
    one = spawn(Gate).slice(gpus=0)
    with pytest.raises(ActorError, match="concurrent boom"):
        one.fail.call_one().get(timeout=T)
    assert one.step.call_one(1).get(timeout=T) == 1


def test_stop_cancels_running_concurrent_calls_before_cleanup(spawn, tmp_path):
    path = str(tmp_path / "order")

    class Cancellable(Actor):
        def __init__(self, path):
            self.path = path

        @concurrent_endpoint
        async def forever(self):
            try:
                await asyncio.Event().wait()
            finally:
                with open(self.path, "a") as f:
                    f.write("cancelled\n")

        @endpoint
        async def ping(self):
            return "pong"

        async def __cleanup__(self, exc):
            with open(self.path, "a") as f:
                f.write(f"cleanup {exc}\n")

    one = spawn(Cancellable, path).slice(gpus=0)
    pending = one.forever.call_one()
    assert one.ping.call_one().get(timeout=T) == "pong"  # `forever` is running by now
    one.stop().get(timeout=T)
    with pytest.raises(SupervisionError):
        pending.get(timeout=T)
    with open(path) as f:
        assert f.read() == "cancelled\ncleanup None\n"


def test_concurrent_endpoint_checks():
    with pytest.raises(ValueError, match="async"):

        class SyncConcurrent(Actor):
            @concurrent_endpoint
            def ping(self):
                return 1

    with pytest.raises(ValueError, match="does not wrap @endpoint"):

        class Stacked(Actor):
            @concurrent_endpoint
            @endpoint
            async def ping(self):
                return 1


class Plain(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    def helper(self, x: int) -> tuple:  # not an endpoint
        return x + self.n, current_rank().rank

    def answer_on(self, port: Port, x: int) -> None:  # not an endpoint either
        port.send(x * 3)


def test_as_endpoint_calls_a_method_that_is_not_an_endpoint(spawn):
    mesh = spawn(Plain)
    helper = as_endpoint(mesh.helper)
    assert helper.call(1).get(timeout=T).values() == [(1, 0), (1, 1)]
    assert helper.choose(2).get(timeout=T)[0] == 2
    assert as_endpoint(mesh.slice(gpus=1).helper).call_one(3).get(timeout=T) == (3, 0)
    ported = as_endpoint(mesh.answer_on, explicit_response_port=True)
    assert ported.call(2).get(timeout=T).values() == [6, 6]
    with pytest.raises(TypeError):
        helper.call()  # checked against the method's signature
    with pytest.raises(ValueError):
        as_endpoint(mesh.incr)  # already an endpoint
    with pytest.raises(RuntimeError, match="not an endpoint"):
        mesh.helper(1)


def test_accumulator_folds_the_replies(spawn):
    mesh = spawn(Plain)
    mesh.incr.broadcast(2)
    assert Accumulator(mesh.incr, 0, operator.add).accumulate(1).get(timeout=T) == 6

    class Runner(Actor):
        @endpoint
        def run(self, fn):
            return fn()

    runner = spawn(Runner)
    acc = Accumulator(runner.run, 0, operator.add)
    assert acc.accumulate(lambda: current_rank()["gpus"]).get(timeout=T) == 1
    assert acc.accumulate(lambda: current_size()["gpus"]).get(timeout=T) == 4
    ordered = Accumulator(runner.run, [], lambda acc, v: acc + [v])
    assert ordered.accumulate(lambda: current_rank().rank).get(timeout=T) == [0, 1]

    async def main():
        return await acc.accumulate(os.getpid)

    assert asyncio.run(asyncio.wait_for(main(), T)) > 0


def test_accumulator_raises_when_an_actor_raises(spawn):
    class Picky(Actor):
        @endpoint
        def value(self):
            if current_rank().rank == 1:
                raise ArithmeticError("rank 1 refuses")
            return 1

    acc = Accumulator(spawn(Picky).value, 0, operator.add)
    with pytest.raises(ActorError, match="rank 1 refuses"):
        acc.accumulate().get(timeout=T)
