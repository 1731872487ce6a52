"""The examples of ../shared/docs/API.md (single-host sections), run as written.

Each test quotes the sentence it runs. Multi-host, supervision hooks (``__supervise__``,
``unhandled_fault_hook``) and the C++ API are covered elsewhere or by other issues."""

from __future__ import annotations

import asyncio
import operator
import os
import pickle
import time

import pytest

from podium.actor import (
    Accumulator,
    Actor,
    ActorError,
    ActorMesh,
    Channel,
    Extent,
    Future,
    HostMesh,
    Point,
    ProcMesh,
    SupervisionError,
    ValueMesh,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    this_host,
    this_proc,
)

T = 20  # seconds: bound on every get() below


class Trainer(Actor):
    def __init__(self, lr: float = 0.1) -> None:
        self.lr = lr
        self.steps = 0

    @endpoint
    def step(self) -> int:
        self.steps += 1
        return self.steps

    @endpoint
    def whoami(self) -> tuple:
        return os.getpid(), current_rank().rank, current_size(), current_actor_name()

    @endpoint
    def env(self, key: str):
        return os.environ.get(key)

    @endpoint
    def fail(self) -> None:
        raise KeyError("bad key")


@pytest.fixture(scope="module")
def gpus8():
    """`this_host().spawn_procs(per_host={"gpus": 8})`"""
    procs = this_host().spawn_procs(per_host={"gpus": 8})
    try:
        yield procs
    finally:
        procs.stop().get(timeout=T)


@pytest.fixture
def trainers(gpus8, spawn):
    return spawn(Trainer, on=gpus8)


# --- Meshes -------------------------------------------------------------------------------


def test_this_host_is_the_local_host_with_no_dimensions():
    """`this_host()` is the local host as a mesh with no dimensions."""
    host = this_host()
    assert isinstance(host, HostMesh) and host.sizes == {} and len(host) == 1


def test_spawn_procs_gpus_8(gpus8, trainers):
    """`this_host().spawn_procs(per_host={"gpus": 8})` starts 8 OS processes and returns a
    `ProcMesh` of extent `{"gpus": 8}` ... Returns at once; `mesh.initialized` is a Future."""
    t0 = time.monotonic()
    other = this_host().spawn_procs(per_host={"gpus": 8})
    try:
        assert time.monotonic() - t0 < 1.0
        assert isinstance(other.initialized, Future)
        assert other.extent == Extent(["gpus"], [8])
        other.initialized.get(timeout=T)
    finally:
        other.stop().get(timeout=T)
    assert isinstance(gpus8, ProcMesh) and gpus8.sizes == {"gpus": 8}
    pids = {pid for pid, _, _, _ in trainers.whoami.call().get(timeout=T).values()}
    assert len(pids) == 8 and os.getpid() not in pids  # 8 OS processes


def test_spawn_procs_on_a_host_mesh_keeps_the_hosts_dimension():
    """on a host mesh of extent `{"hosts": H}` the result has extent
    `{"hosts": H, "gpus": 8}` (here H = 1: this host)."""
    hosts = this_host().flatten("hosts")
    procs = hosts.spawn_procs(per_host={"gpus": 8})
    try:
        assert procs.extent == Extent(["hosts", "gpus"], [1, 8])
    finally:
        procs.stop().get(timeout=T)


def _bootstrap() -> None:
    os.environ["API_EXAMPLE_BOOT"] = "yes"


def test_spawn_procs_bootstrap_sets_env():
    """`spawn_procs(..., bootstrap=fn)` runs `fn` in every proc before any actor (to set
    env)."""
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_bootstrap)
    try:
        mesh = procs.spawn("t", Trainer)
        assert mesh.env.call("API_EXAMPLE_BOOT").get(timeout=T).values() == ["yes", "yes"]
    finally:
        procs.stop().get(timeout=T)


def test_this_proc_spawn_runs_in_the_controller(request):
    """`this_proc().spawn(...)` on the controller runs the actor inside the controller's OS
    process."""
    mesh = this_proc().spawn(f"local-{request.node.name}", Trainer)
    try:
        assert mesh.whoami.call_one().get(timeout=T)[0] == os.getpid()
    finally:
        mesh.stop().get(timeout=T)


def test_procs_spawn_checks(gpus8, request):
    """`procs.spawn(name, ActorClass, *args, **kwargs)` creates one actor per proc and returns
    an `ActorMesh` of the same extent, at once. `__init__` runs before the first message. A
    wrong number of constructor arguments raises `TypeError` at the call site. A class that
    mixes sync and async endpoints raises `ValueError`."""
    mesh = gpus8.spawn(f"spawn-{request.node.name}"[:60], Trainer, lr=0.5)
    try:
        assert isinstance(mesh, ActorMesh) and mesh.extent == gpus8.extent
        assert mesh.step.call().get(timeout=T).values() == [1] * 8
    finally:
        mesh.stop().get(timeout=T)
    with pytest.raises(TypeError):
        gpus8.spawn("bad", Trainer, 0.1, 0.2)

    class Mixed(Actor):
        @endpoint
        def a(self):
            pass

        @endpoint
        async def b(self):
            pass

    with pytest.raises(ValueError):
        gpus8.spawn("mixed", Mixed)


def test_slicing_and_shape(trainers, gpus8):
    """`mesh.slice(gpus=2)` removes the dimension; `mesh.slice(gpus=slice(0, 4))` keeps it;
    unknown label -> `TypeError`; out of range -> `IndexError`. Also `split`,
    `flatten(name)`, `rename(**old_to_new)`, `size(dim)`, `sizes`, `extent`, `len()`."""
    for mesh in (trainers, gpus8, this_host().flatten("gpus").split(gpus=("a", "b"), a=1)
                 .flatten("gpus")):
        n = mesh.size("gpus")
        assert mesh.slice(gpus=n - 1).sizes == {}
        assert mesh.slice(gpus=slice(0, 1)).sizes == {"gpus": 1}
        with pytest.raises(TypeError):
            mesh.slice(hosts=0)
        with pytest.raises(IndexError):
            mesh.slice(gpus=n)
    assert trainers.slice(gpus=2).sizes == {} and trainers.slice(gpus=slice(0, 4)).sizes == {
        "gpus": 4}
    split = trainers.split(gpus=("node", "dev"), dev=4)
    assert split.sizes == {"node": 2, "dev": 4} and split.size("dev") == 4
    assert split.flatten("gpus").extent == trainers.extent
    assert trainers.rename(gpus="ranks").sizes == {"ranks": 8}
    assert len(trainers) == 8 and trainers.size() == 8
    vm = trainers.step.call().get(timeout=T)
    assert vm.split(gpus=("node", "dev"), dev=4).item(node=1, dev=0) == 1


def test_meshes_ports_value_meshes_are_picklable(trainers, gpus8):
    """Meshes, ports and ValueMeshes are picklable and can be passed to other actors as
    arguments or returned from endpoints."""

    class Relay(Actor):
        @endpoint
        def relay(self, mesh, port):
            vm = mesh.step.call().get(timeout=10)
            port.send(vm)
            return mesh

    relay = gpus8.slice(gpus=0).spawn("relay", Relay)
    try:
        port, receiver = Channel.open()
        back = relay.relay.call_one(trainers, port).get(timeout=T)
        vm = receiver.recv().get(timeout=T)
        assert isinstance(back, ActorMesh) and isinstance(vm, ValueMesh)
        assert list(vm.values()) == [1] * 8
        assert back.step.call().get(timeout=T).values() == [2] * 8
        for obj in (gpus8, trainers, vm, port):
            pickle.loads(pickle.dumps(obj))
    finally:
        relay.stop().get(timeout=T)


def test_stop_drains_runs_cleanup_then_calls_raise(gpus8, tmp_path):
    """`mesh.stop()` -> Future: drains queued messages, runs `__cleanup__`, stops meshes the
    actors own first. Calls on a stopped mesh raise `SupervisionError`."""
    log = tmp_path / "cleanup"

    class Owner(Actor):
        def __init__(self, path):
            self.path = path
            self.seen = 0
            self.child = this_proc().spawn(f"owned-{os.getpid()}", Trainer)

        @endpoint
        def work(self):
            self.seen += 1

        def __cleanup__(self, exc):
            try:
                self.child.step.call_one().get(timeout=5)
                child = "alive"
            except SupervisionError:
                child = "stopped"
            with open(self.path, "a") as f:
                f.write(f"{self.seen} {child}\n")

    mesh = gpus8.slice(gpus=slice(0, 2)).spawn("owner", Owner, str(log))
    for _ in range(3):
        mesh.work.broadcast()
    stop = mesh.stop()
    assert isinstance(stop, Future) and stop.get(timeout=T) is None
    assert log.read_text().splitlines() == ["3 stopped", "3 stopped"]
    with pytest.raises(SupervisionError):
        mesh.work.call().get(timeout=T)


# --- Endpoints and adverbs ------------------------------------------------------------------


def test_adverbs_table(trainers):
    """call -> Future[ValueMesh]; call_one -> Future[R] (exactly one actor, else ValueError at
    once); choose -> Future[R]; stream -> N futures in arrival order; broadcast -> None."""
    vm = trainers.step.call().get(timeout=T)
    assert isinstance(vm, ValueMesh) and list(vm.values()) == [1] * 8
    with pytest.raises(ValueError):
        trainers.step.call_one()
    assert trainers.slice(gpus=3).step.call_one().get(timeout=T) == 2
    assert trainers.step.choose().get(timeout=T) in (2, 3)
    assert len([f.get(timeout=T) for f in trainers.whoami.stream()]) == 8
    assert trainers.step.broadcast() is None
    with pytest.raises(ActorError):
        trainers.fail.call().get(timeout=T)


def test_arguments_are_checked_and_explicit_response_port(gpus8):
    """Arguments are checked against the signature before sending (`TypeError` locally).
    `@endpoint(explicit_response_port=True)` passes a `Port` as the first argument after
    `self`."""

    class Echo(Actor):
        @endpoint(explicit_response_port=True)
        def echo(self, port, value):
            port.send(value)

    mesh = gpus8.slice(gpus=1).spawn("echo", Echo)
    try:
        with pytest.raises(TypeError):
            mesh.echo.call_one()
        assert mesh.echo.call_one("v").get(timeout=T) == "v"
    finally:
        mesh.stop().get(timeout=T)


# --- Results --------------------------------------------------------------------------------


def test_future_get_await_result_exception(trainers):
    """`Future.get(timeout=None)` blocks; a timeout raises `TimeoutError` and does not consume
    the result ... `await fut` inside asyncio. `result()` is an alias of `get()`;
    `exception()` returns the exception or None. Repeated gets return the same value."""
    one = trainers.slice(gpus=0)
    f = one.step.call_one()
    assert f.get(timeout=T) == f.result() == f.get()
    assert f.exception() is None
    assert isinstance(one.fail.call_one().exception(timeout=T), ActorError)

    async def main():
        return await one.step.call_one()

    assert asyncio.run(asyncio.wait_for(main(), T)) == 2


def test_a_timeout_is_none_or_a_finite_non_negative_number(trainers):
    """As Monarch's `Future.get`: a negative or non-finite timeout raises `ValueError` before
    anything waits, whether the future is done or not; `exception()` raises it too."""
    one = trainers.slice(gpus=0)
    done = one.step.call_one()
    done.get(timeout=T)
    fresh = one.step.call_one()  # asked right away: done or not, the refusal comes first
    for bad in (-1, -0.5, float("nan"), float("inf"), float("-inf")):
        for f in (done, fresh):
            with pytest.raises(ValueError, match="invalid timeout"):
                f.get(timeout=bad)
            with pytest.raises(ValueError, match="invalid timeout"):
                f.exception(timeout=bad)
    assert isinstance(fresh.get(timeout=T), int)  # the refusals consumed nothing
    assert done.get(timeout=0) == done.get()


def test_value_mesh_and_point(trainers):
    """`ValueMesh`: `items()` yields `(Point, value)` in rank order, `values()`,
    `item(**coords)`, `len()`, slicing as meshes. `Point` is a mapping dim -> index with
    `.rank` and `.extent`; `str(point)` looks like `{'hosts': 0/1, 'gpus': 1/2}`."""
    vm = trainers.whoami.call().get(timeout=T)
    ranks = [(p.rank, v[1]) for p, v in vm.items()]
    assert ranks == [(i, i) for i in range(8)] and len(vm) == 8
    assert vm.item(gpus=5)[1] == 5 and len(list(vm.values())) == 8
    assert [v[1] for v in vm.slice(gpus=slice(2, 4)).values()] == [2, 3]
    p = Point(1, Extent(["hosts", "gpus"], [1, 2]))
    assert str(p) == "{'hosts': 0/1, 'gpus': 1/2}" and p["gpus"] == 1 and p.rank == 1
    assert p.extent == Extent(["hosts", "gpus"], [1, 2])


def test_channel_ports():
    """`Channel.open()` -> `(Port, PortReceiver)`; `port.send(v)` is fire and forget, in order
    per sender; `receiver.recv()` -> Future. `port.exception(e)` makes the receiver raise
    `e`."""
    port, receiver = Channel.open()
    for i in range(5):
        port.send(i)
    port.exception(ValueError("e"))
    assert [receiver.recv().get(timeout=T) for _ in range(5)] == list(range(5))
    with pytest.raises(ValueError):
        receiver.recv().get(timeout=T)


def test_accumulator(trainers):
    """`Accumulator(endpoint, identity, combine).accumulate(*a)` -> Future of the fold over
    all replies."""
    total = Accumulator(trainers.step, 0, operator.add).accumulate().get(timeout=T)
    assert total == 8


def test_context_functions(trainers):
    """`context()`, `current_rank()` (a Point within the cast), `current_size()` (dict),
    `current_actor_name()`."""
    _, rank, size, name = trainers.slice(gpus=slice(4, 8)).whoami.call().get(
        timeout=T).item(gpus=1)
    assert isinstance(rank, int) and rank == 1 and size == {"gpus": 4}
    assert name.endswith(f"#{trainers.name}[5]")
    assert context().actor_instance.name == "client"


# --- Errors ---------------------------------------------------------------------------------


def test_actor_error_keeps_the_exception_and_the_actor_lives(trainers):
    """An endpoint that raises an `Exception` while the caller awaits a reply: the caller gets
    `ActorError` (the original exception as `.exception`, the remote traceback in the
    message); the actor lives on."""
    with pytest.raises(ActorError) as info:
        trainers.slice(gpus=2).fail.call_one().get(timeout=T)
    assert isinstance(info.value.exception, KeyError)
    assert "Traceback" in str(info.value) and "bad key" in str(info.value)
    assert trainers.slice(gpus=2).step.call_one().get(timeout=T) == 1
