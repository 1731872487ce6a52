"""Meshes, ports and ValueMeshes are picklable: passed to actors as arguments, returned from
endpoints, called from there (API.md "Meshes")."""

from __future__ import annotations

import os
import pickle

import pytest

from podium.actor import (
    Actor,
    ActorMesh,
    Channel,
    current_actor_name,
    current_rank,
    endpoint,
    HostMesh,
    Point,
    ProcMesh,
    this_host,
    ValueMesh,
)

T = 10  # seconds: bound on every get() below


class To(Actor):
    def __init__(self, tag: str = "to") -> None:
        self.tag = tag

    @endpoint
    def whoami(self) -> tuple:
        return self.tag, current_actor_name(), os.getpid()


class From(Actor):
    @endpoint
    def fetch(self, to: ActorMesh) -> list:
        return [f.get(timeout=5) for f in to.whoami.stream()]

    @endpoint
    def fetch_call(self, to: ActorMesh) -> list:
        return list(to.whoami.call().get(timeout=5).values())

    @endpoint
    def spawn_on(self, procs: ProcMesh, name: str) -> ActorMesh:
        return procs.spawn(name, To, "spawned by an actor")

    @endpoint
    def echo(self, value):
        return value

    @endpoint
    def forward(self, port, value) -> None:
        port.send((current_rank().rank, value))


def test_an_actor_mesh_passed_to_another_actor_is_called_from_there(spawn):
    to = spawn(To)
    to.initialized.get(timeout=T)
    src = spawn(From)
    results = src.fetch.call(to).get(timeout=T).values()
    assert len(results) == 2 and all(len(r) == 2 for r in results)
    names = {name for r in results for _, name, _ in r}
    assert len(names) == 2  # both actors of `to` answered each caller
    # A slice travels as a slice.
    one = src.slice(gpus=0).fetch_call.call_one(to.slice(gpus=1)).get(timeout=T)
    assert len(one) == 1 and one[0][1] == to.slice(gpus=1).whoami.call_one().get(timeout=T)[1]


def test_an_actor_mesh_on_other_procs_passed_to_an_actor(spawn, new_procs):
    other = new_procs(gpus=2)
    to = spawn(To, on=other)
    to.initialized.get(timeout=T)
    pids = {p for _, _, p in spawn(From).slice(gpus=1).fetch.call_one(to).get(timeout=T)}
    assert len(pids) == 2 and os.getpid() not in pids


def test_a_mesh_returned_from_an_endpoint_is_callable(spawn, procs, request):
    src = spawn(From).slice(gpus=0)
    made = src.spawn_on.call_one(procs, f"spawned-{request.node.name}").get(timeout=T)
    try:
        assert isinstance(made, ActorMesh) and made.extent == procs.extent
        made.initialized.get(timeout=T)
        tags = [t for t, _, _ in made.whoami.call().get(timeout=T).values()]
        assert tags == ["spawned by an actor"] * 2
    finally:
        made.stop().get(timeout=T)


def test_value_meshes_and_points_travel_both_ways(spawn):
    src = spawn(From).slice(gpus=1)
    vm = spawn(To).whoami.call().get(timeout=T)
    back = src.echo.call_one(vm).get(timeout=T)
    assert isinstance(back, ValueMesh) and list(back.values()) == list(vm.values())
    sliced = vm.slice(gpus=1)
    assert list(src.echo.call_one(sliced).get(timeout=T).values()) == list(sliced.values())
    p = Point(1, vm.extent)
    assert src.echo.call_one(p).get(timeout=T) == p


def test_ports_pass_through_actors(spawn):
    mesh = spawn(From)
    port, receiver = Channel.open()
    mesh.forward.broadcast(port, "hi")
    got = sorted(receiver.recv().get(timeout=T) for _ in range(2))
    assert got == [(0, "hi"), (1, "hi")]


def test_meshes_pickle_in_the_controller(spawn, procs):
    mesh = spawn(To)
    again = pickle.loads(pickle.dumps(mesh))
    assert isinstance(again, ActorMesh) and again.extent == mesh.extent
    assert [n for _, n, _ in again.whoami.call().get(timeout=T).values()] == [
        n for _, n, _ in mesh.whoami.call().get(timeout=T).values()
    ]
    pm = pickle.loads(pickle.dumps(procs.slice(gpus=1)))
    assert isinstance(pm, ProcMesh) and pm.sizes == {}
    with pytest.raises(RuntimeError, match="another process"):
        pm.stop()  # only the process that spawned the procs stops them
    host = pickle.loads(pickle.dumps(this_host()))
    assert isinstance(host, HostMesh) and host.sizes == {}
