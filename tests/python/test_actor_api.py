"""podium.actor on one host: meshes, adverbs, results (API.md "Meshes", "Endpoints and
adverbs", "Results")."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from podium.actor import (
    Actor,
    ActorMesh,
    Extent,
    Future,
    Point,
    ProcMesh,
    ValueMesh,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    this_host,
    this_proc,
)

T = 10  # seconds: bound on every get() below


class Counter(Actor):
    def __init__(self, start: int, *, step: int = 1) -> None:
        self.n = start
        self.step = step

    @endpoint
    def incr(self, times: int = 1) -> int:
        self.n += self.step * times
        return self.n

    @endpoint
    def value(self) -> int:
        return self.n

    @endpoint
    def where(self):
        return os.getpid(), current_rank(), current_size(), current_actor_name()

    @endpoint
    def slow(self, s: float) -> str:
        time.sleep(s)
        return str(current_rank())

    @endpoint
    def meet(self, mine: str, theirs: str, bound: float) -> bool:
        """Marks `mine`, then waits (at most `bound` s) for another actor to mark `theirs`:
        True only if both ran at once."""
        open(mine, "w").close()
        deadline = time.monotonic() + bound
        while not os.path.exists(theirs):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def helper(self) -> None:  # not an endpoint
        pass


def test_spawn_procs_returns_at_once_with_the_per_host_extent(new_procs):
    t0 = time.monotonic()
    pm = new_procs(gpus=3)
    assert time.monotonic() - t0 < 1.0  # returns before the procs are up
    assert isinstance(pm, ProcMesh)
    assert isinstance(pm.initialized, Future)
    assert pm.extent == Extent(["gpus"], [3])
    assert pm.sizes == {"gpus": 3} and len(pm) == 3 and pm.size("gpus") == 3
    assert pm.initialized.get(timeout=T) is True  # as Monarch's


def test_spawn_returns_an_actor_mesh_of_the_proc_extent(spawn, procs):
    mesh = spawn(Counter, 5)
    assert isinstance(mesh, ActorMesh)
    assert mesh.extent == procs.extent
    mesh.initialized.get(timeout=T)
    assert mesh.value.call().get(timeout=T).values() == [5, 5]


def test_call_gives_a_value_mesh_in_rank_order(spawn):
    mesh = spawn(Counter, 0, step=10)
    vm = mesh.where.call().get(timeout=T)
    assert isinstance(vm, ValueMesh)
    assert len(vm) == 2
    pids = []
    for i, (point, (pid, rank, size, name)) in enumerate(vm.items()):
        assert isinstance(point, Point) and point.rank == i and point["gpus"] == i
        assert rank == point and size == {"gpus": 2}
        assert mesh.name in name
        pids.append(pid)
    assert len(set(pids)) == 2 and os.getpid() not in pids  # one OS process per rank
    assert mesh.incr.call(2).get(timeout=T).values() == [20, 20]


class Same(Actor):
    @endpoint
    def number(self) -> int:
        return 7

    @endpoint
    def listing(self) -> list:
        return [1, 2]


def test_equal_replies_are_held_once_and_mutable_ones_are_not_shared(spawn):
    """ME-9: byte-equal replies reach the caller as one run, decoded once; a mutable value is
    decoded for each rank, so changing one rank's value leaves the others alone."""
    mesh = spawn(Same)
    vm = mesh.number.call().get(timeout=T)
    assert list(vm.values()) == [7, 7]
    assert vm._base_values.runs() == 1
    lists = mesh.listing.call().get(timeout=T)
    a, b = lists.values()
    assert a == b == [1, 2] and a is not b
    a.append(3)
    assert lists.item(gpus=1) == [1, 2]


def test_value_mesh_item_values_and_slice(spawn):
    vm = spawn(Counter, 0).where.call().get(timeout=T)
    assert vm.item(gpus=1) == list(vm.values())[1]
    assert list(vm.slice(gpus=1).values()) == [vm.item(gpus=1)]
    assert vm.slice(gpus=slice(0, 1)).sizes == {"gpus": 1}
    with pytest.raises(TypeError):
        vm.item(hosts=0)


def test_point_str_rank_and_extent():
    p = Point(3, Extent(["hosts", "gpus"], [2, 2]))
    assert str(p) == "{'hosts': 1/2, 'gpus': 1/2}"
    assert p.rank == 3 and p.extent == Extent(["hosts", "gpus"], [2, 2])
    assert list(p.items()) == [("hosts", 1), ("gpus", 1)]


def test_mesh_slicing(spawn, procs):
    mesh = spawn(Counter, 0)
    one = mesh.slice(gpus=1)
    assert one.sizes == {} and len(one) == 1  # an int removes the dimension
    kept = mesh.slice(gpus=slice(1, 2))
    assert kept.sizes == {"gpus": 1}  # a slice keeps it
    assert kept.where.call().get(timeout=T).item(gpus=0)[1] == Point(0, Extent(["gpus"], [1]))
    with pytest.raises(TypeError):
        mesh.slice(hosts=0)
    with pytest.raises(IndexError):
        mesh.slice(gpus=2)
    with pytest.raises(IndexError):
        procs.slice(gpus=slice(5, 9))
    assert procs.slice(gpus=0).sizes == {}


def test_call_one_needs_exactly_one_actor(spawn):
    mesh = spawn(Counter, 0)
    with pytest.raises(ValueError, match="exactly one"):
        mesh.incr.call_one()
    assert mesh.value.call().get(timeout=T).values() == [0, 0]  # nothing was sent
    assert mesh.slice(gpus=1).incr.call_one(3).get(timeout=T) == 3


def test_choose_picks_the_least_loaded_actor(spawn):
    mesh = spawn(Counter, 0)
    busy = mesh.slice(gpus=slice(0, 1)).slow.call(1.0)  # rank 0 has a call outstanding
    try:
        assert mesh.slow.choose(0).get(timeout=T) == "{'gpus': 1/2}"
    finally:
        busy.get(timeout=T)
    # Nobody busy: the lowest rank.
    assert mesh.slow.choose(0).get(timeout=T) == "{'gpus': 0/2}"


def test_stream_yields_replies_in_arrival_order(spawn):
    class Delayed(Actor):
        @endpoint
        def rank_after(self, delays):
            r = current_rank().rank
            time.sleep(delays[r])
            return r

    mesh = spawn(Delayed)
    futures = list(mesh.rank_after.stream([0.6, 0.0]))
    assert len(futures) == 2
    assert [f.get(timeout=T) for f in futures] == [1, 0]


def test_broadcast_is_fire_and_forget_and_ordered(spawn):
    mesh = spawn(Counter, 0)
    assert mesh.incr.broadcast(5) is None
    assert mesh.value.call().get(timeout=T).values() == [5, 5]


def test_messages_run_one_at_a_time_in_arrival_order(spawn):
    class Log(Actor):
        def __init__(self):
            self.seen = []
            self.inside = 0
            self.overlap = False

        @endpoint
        def add(self, i):
            self.inside += 1
            self.overlap |= self.inside > 1
            time.sleep(0.001)
            self.seen.append(i)
            self.inside -= 1

        @endpoint
        def get(self):
            return self.seen, self.overlap

    one = spawn(Log).slice(gpus=0)
    futures = []
    for i in range(50):
        if i % 2:
            one.add.broadcast(i)
        else:
            futures.append(one.add.call_one(i))
    for f in futures:
        f.get(timeout=T)
    seen, overlap = one.get.call_one().get(timeout=T)
    assert seen == list(range(50)) and not overlap


def test_async_endpoints_run_to_completion_one_at_a_time(spawn):
    class AsyncLog(Actor):
        def __init__(self):
            self.events = []

        @endpoint
        async def work(self, i):
            self.events.append(("start", i))
            await asyncio.sleep(0.02)
            self.events.append(("end", i))
            return i * 2

        @endpoint
        async def events_(self):
            return self.events

    one = spawn(AsyncLog).slice(gpus=0)
    futures = [one.work.call_one(i) for i in range(5)]
    assert [f.get(timeout=T) for f in futures] == [0, 2, 4, 6, 8]
    events = one.events_.call_one().get(timeout=T)
    assert events == [(kind, i) for i in range(5) for kind in ("start", "end")]


def test_mixing_sync_and_async_endpoints_is_a_value_error(procs):
    class Mixed(Actor):
        @endpoint
        def a(self):
            pass

        @endpoint
        async def b(self):
            pass

    with pytest.raises(ValueError, match="mixes"):
        procs.spawn("mixed", Mixed)


def test_actors_of_one_process_run_in_parallel(spawn, tmp_path):
    a = spawn(Counter, 0).slice(gpus=0)
    b = spawn(Counter, 0).slice(gpus=0)  # same proc as a
    # Each waits for the other: one after the other, the first would give up (False).
    fa = a.meet.call_one(str(tmp_path / "a"), str(tmp_path / "b"), T / 2)
    fb = b.meet.call_one(str(tmp_path / "b"), str(tmp_path / "a"), T / 2)
    assert fa.get(timeout=T) and fb.get(timeout=T)


class Gate(Actor):
    @endpoint
    def ping(self, x):
        return x + 1


class Asker(Actor):
    """Spawns a Gate in its own process and blocks on it inside a sync endpoint."""

    def __init__(self):
        self.gate = this_proc().spawn(f"gate-{os.getpid()}-{id(self)}", Gate)

    @endpoint
    def ask(self, x):
        # Blocks this actor's thread; the Gate runs in the same process meanwhile.
        return self.gate.ping.call_one(x).get(timeout=5)


def test_sync_endpoint_may_block_on_another_actor_of_its_process(spawn):
    asker = spawn(Asker)
    assert asker.ask.call(41).get(timeout=T).values() == [42, 42]


def test_endpoint_arguments_are_checked_before_sending(spawn):
    mesh = spawn(Counter, 0)
    with pytest.raises(TypeError, match="Counter.incr"):
        mesh.incr.call(1, 2)
    with pytest.raises(TypeError):
        mesh.incr.choose(nope=1)
    # A plain method is reachable (for as_endpoint) but calling it is a clear error.
    with pytest.raises(AttributeError, match="not an endpoint"):
        mesh.helper.call()
    with pytest.raises(RuntimeError, match="not an endpoint"):
        mesh.helper()
    with pytest.raises(AttributeError, match="no endpoint 'nope'"):
        mesh.nope
    assert mesh.value.call().get(timeout=T).values() == [0, 0]


def test_constructor_arguments_are_checked_at_the_call_site(procs):
    with pytest.raises(TypeError, match="Counter"):
        procs.spawn("bad-ctor", Counter)
    with pytest.raises(TypeError):
        procs.spawn("bad-ctor", Counter, 1, stride=2)
    with pytest.raises(TypeError):
        procs.spawn("bad-ctor", object)


def test_an_unpicklable_argument_is_named_and_nothing_is_sent(spawn):
    mesh = spawn(Counter, 0)
    lock = threading.Lock()
    with pytest.raises(TypeError, match="argument 0"):
        mesh.incr.call(lock)
    with pytest.raises(TypeError, match="argument 'times'"):
        mesh.incr.broadcast(times=lock)
    assert mesh.value.call().get(timeout=T).values() == [0, 0]


def test_future_get_timeout_does_not_consume_the_result(spawn):
    one = spawn(Counter, 0).slice(gpus=0)
    f = one.slow.call_one(0.5)
    with pytest.raises(TimeoutError):
        f.get(timeout=0.05)
    assert f.get(timeout=T) == "{}"
    assert f.result() == "{}" and f.get() == "{}"  # repeated gets: same value
    assert f.exception() is None


def test_await_a_future_in_asyncio(spawn):
    one = spawn(Counter, 0).slice(gpus=1)

    async def main():
        # 1 s: long enough for six 10 ms ticks even where a loaded machine stretches each
        # sleep to 60 ms or more (0.3 s once gave only 4 under a CI run's load).
        slow = one.slow.call_one(1.0)
        ticks = 0
        while not slow.done():  # the loop keeps running while the call is in flight
            ticks += 1
            await asyncio.sleep(0.01)
        a = await slow
        b = await one.incr.call_one(2)
        c = await asyncio.wait_for(one.incr.call_one(1).as_asyncio(), T)
        return ticks, a, b, c

    ticks, a, b, c = asyncio.run(asyncio.wait_for(main(), T))
    assert ticks > 5 and a == "{}" and b == 2 and c == 3


def test_await_inside_an_async_endpoint(spawn):
    class Forwarder(Actor):
        def __init__(self):
            self.counter = this_proc().spawn(f"fw-{os.getpid()}-{id(self)}", Counter, 100)

        @endpoint
        async def forward(self, by):
            return await self.counter.incr.call_one(by)

    one = spawn(Forwarder).slice(gpus=0)
    assert one.forward.call_one(5).get(timeout=T) == 105


def test_this_proc_runs_actors_in_the_controller(request):
    mesh = this_proc().spawn(f"local-{request.node.name}", Counter, 1)
    try:
        assert this_proc().sizes == {}
        pid, rank, size, _ = mesh.where.call_one().get(timeout=T)
        assert pid == os.getpid() and size == {}
        assert mesh.incr.call_one().get(timeout=T) == 2
    finally:
        mesh.stop().get(timeout=T)


def test_context_outside_actors_is_the_client():
    assert current_size() == {}
    assert current_rank().rank == 0
    assert current_actor_name() == "client"


def test_this_host_has_no_dimensions():
    assert this_host().sizes == {} and len(this_host()) == 1


def test_spawn_on_a_slice_and_bad_names(spawn, procs):
    mesh = spawn(Counter, 0, on=procs.slice(gpus=1))
    assert mesh.sizes == {}
    pid, rank, size, _ = mesh.where.call_one().get(timeout=T)
    assert size == {} and pid == spawn(Counter, 0).slice(gpus=1).where.call_one().get(
        timeout=T
    )[0]
    with pytest.raises(ValueError):
        procs.spawn("bad#name", Counter, 0)


def test_value_mesh_and_point_pickle():
    import pickle

    vm = ValueMesh._from_values(["gpus"], [2], ["a", "b"])
    back = pickle.loads(pickle.dumps(vm))
    assert list(back.items()) == list(vm.items())
    p = Point(1, Extent(["gpus"], [2]))
    assert pickle.loads(pickle.dumps(p)) == p


def test_spawn_procs_refuses_sizes_no_host_can_run():
    # Refused with a clear ValueError before anything starts: a size under 1 (a negative one
    # reached the binding as nanobind's "incompatible function arguments"), and more procs
    # than one host runs (10**12 reached C++ as a std::bad_alloc).
    from podium._src.proc_mesh import MAX_PROCS_PER_HOST
    host = this_host()
    for size in (0, -1):
        with pytest.raises(ValueError, match=f"dimension 'gpus' has size {size}; a size is at "
                                             "least 1"):
            host.spawn_procs(per_host={"gpus": size})
    with pytest.raises(ValueError, match=f"procs per host; at most {MAX_PROCS_PER_HOST}"):
        host.spawn_procs(per_host={"gpus": 10**12})
    with pytest.raises(ValueError, match="procs per host"):
        host.spawn_procs(per_host={"hosts": 1 << 9, "gpus": 1 << 8})
