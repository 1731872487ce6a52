"""Errors as Monarch raises them (issue 18, part 3): the classes and the opening words of
Monarch's messages, with podium's details (actor, rank, host, pid, cause) after them.
MW-1, MW-2 (python/podium/_src/errors.py); docs/errors.md has the table."""

from __future__ import annotations

import os
import re

import pytest

import podium
from podium.actor import Actor, ActorError, endpoint, MeshFailure, SupervisionError, this_host

T = 30


class Victim(Actor):
    @endpoint
    def ok(self):
        return os.getpid()

    @endpoint
    def exit_process(self, code):
        os._exit(code)


def test_supervision_error_is_a_runtime_error():
    assert issubclass(SupervisionError, RuntimeError)
    e = SupervisionError("why", "ping", mesh_name="m")
    assert isinstance(e, RuntimeError)


def test_a_call_on_a_failed_actor_names_the_endpoint_call_and_its_descendants(new_procs):
    # MW-1: "Endpoint call <mesh>.<endpoint>() failed, The actor <mesh>{<point>} and all its
    # descendants have failed: " then podium's place and cause.
    procs = new_procs(gpus=2)
    victims = procs.spawn("victims", Victim)
    one = victims.slice(gpus=1)
    pid = one.ok.call_one().get(timeout=T)
    with pytest.raises(SupervisionError) as info:
        one.exit_process.call_one(3).get(timeout=T)
    text = str(info.value)
    assert text.startswith("Endpoint call victims.exit_process() failed, "), text
    assert re.search(r"The actor .* and all its descendants have failed", text), text
    assert "The actor victims{'gpus': 1/2} and all its descendants have failed: " in text
    assert f"actor victims[1] of mesh 'victims' (rank 1 {{'gpus': 1/2}}, host " in text
    assert f"pid {pid}): its proc (pid {pid}) exited with status 3" in text
    # A later call says the same, with its own endpoint.
    with pytest.raises(SupervisionError, match=r"^Endpoint call victims\.ok\(\) failed, The actor"):
        one.ok.call_one().get(timeout=T)
    # The attributes, as Monarch's and podium's.
    e = info.value
    assert (e.endpoint, e.mesh_name, e.rank, e.pid) == ("exit_process", "victims", 1, pid)


def test_a_stopped_proc_mesh_says_so_as_monarch_does():
    # MW-1, MW-2: calls on the actors of a stopped ProcMesh, and spawns on it.
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        healthy = procs.spawn("healthy", Victim)
        healthy.ok.call().get(timeout=T)
    finally:
        procs.stop().get(timeout=T)
    with pytest.raises(SupervisionError, match="actor mesh is stopped due to proc mesh shutdown"
                       ) as info:
        healthy.ok.call().get(timeout=T)
    assert str(info.value).startswith("Endpoint call healthy.ok() failed, actor mesh is stopped")
    assert "actor healthy[0] of mesh 'healthy'" in str(info.value)
    with pytest.raises(RuntimeError, match="`ProcMesh` has already been stopped"):
        procs.spawn("immediate", Victim)


def test_a_stopped_actor_mesh_says_its_actor_exited_stopped(new_procs):
    # MW-1: Monarch's "Actor <id> exited because of the following reason: ... stopped".
    procs = new_procs(gpus=1)
    printer = procs.spawn("printer", Victim)
    printer.ok.call().get(timeout=T)
    printer.stop().get(timeout=T)
    with pytest.raises(SupervisionError,
                       match=r"(?s)Actor .*printer.* exited because of the following reason:.*"
                             r"stopped"):
        printer.ok.call().get(timeout=T)


class Mixed(Actor):
    @endpoint
    def sync_one(self):
        return 1

    @endpoint
    async def async_one(self):
        return 2


class AsyncWithSyncCleanup(Actor):
    @endpoint
    async def a(self):
        return 1

    def __cleanup__(self, exc):
        pass


class SyncWithAsyncSupervise(Actor):
    @endpoint
    def a(self):
        return 1

    async def __supervise__(self, failure):
        return True


class EndpointNamedSlice(Actor):
    @endpoint
    def slice(self):
        return 1


def test_mixing_async_and_sync_endpoints_raises_monarchs_value_error(new_procs):
    # MW-2
    procs = new_procs(gpus=1)
    with pytest.raises(ValueError, match="mixes both async and sync") as info:
        procs.spawn("mixed", Mixed)
    assert "sync_one" in str(info.value) and "async_one" in str(info.value)
    with pytest.raises(ValueError, match="has async endpoints, but a synchronous __cleanup__"):
        procs.spawn("cleanup", AsyncWithSyncCleanup)
    # A sync actor's __supervise__ runs before its next call: a coroutine there would be a
    # truthy object, a failure swallowed unseen.
    with pytest.raises(ValueError, match="has sync endpoints, but an async __supervise__"):
        procs.spawn("supervise", SyncWithAsyncSupervise)


def test_an_endpoint_an_actor_mesh_attribute_would_hide_is_refused(new_procs):
    # MW-2: `mesh.slice` is the mesh's own method; Monarch refuses such a class at spawn.
    procs = new_procs(gpus=1)
    with pytest.raises(ValueError, match="ActorMesh has an attribute that collides with an "
                                         "endpoint name: attribute=slice"):
        procs.spawn("named_slice", EndpointNamedSlice)


def test_str_of_a_mesh_failure_names_it_and_its_crashed_ranks():
    # MW-2: str() as Monarch's; report() stays podium's text alone.
    report = ("actor w[1] of mesh 'w' (rank 1 {'gpus': 1/2}, host vm, pid 42) failed: its "
              "proc (pid 42) exited with status 3")
    f = MeshFailure({"kind": "proc", "mesh_name": "w", "actor_id": "unix:/x#w[1]", "rank": 1,
                     "point": "{'gpus': 1/2}", "host": "vm", "pid": 42, "signal": None,
                     "exit_code": 3, "cause": "its proc (pid 42) exited with status 3",
                     "report": report})
    text = str(f)
    assert text.startswith("MeshFailure(mesh_name=w, crashed_ranks=[1], event=")
    assert "The actor w{'gpus': 1/2} and all its descendants have failed" in text
    assert report in text
    assert f.report() == report


def test_a_failing_bootstrap_raises_actor_error():
    # MW-2: spawn_procs(bootstrap=fn) where fn raises: `initialized` raises ActorError.
    def refuse():
        raise ValueError("the bootstrap refuses")

    procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=refuse)
    try:
        with pytest.raises(ActorError) as info:
            procs.initialized.get(timeout=T)
        assert "ValueError: the bootstrap refuses" in str(info.value)
        assert isinstance(info.value.exception, SupervisionError)
    finally:
        procs.stop().get(timeout=T)


def test_shape_at_raises_value_error():
    shape = podium.Shape(["hosts", "gpus"], podium.Slice(offset=0, sizes=[2, 4], strides=[4, 1]))
    assert shape.at("gpus", 3).ranks() == [3, 7]
    with pytest.raises(ValueError, match="no dimension 'racks'"):
        shape.at("racks", 0)
    with pytest.raises(ValueError, match="index 4 out of range for 'gpus' of size 4"):
        shape.at("gpus", 4)
    with pytest.raises(ValueError, match="index -1 out of range"):
        shape.at("hosts", -1)


class InitRaises(Actor):
    def __init__(self):
        raise ValueError("This is an exception from __init__")

    @endpoint
    def noop(self):
        return None


def test_an_exception_in_init_raises_actor_error_from_calls(new_procs):
    # MW-2: as Monarch, calls on an actor whose __init__ raised raise ActorError naming the
    # exception; podium's error is a SupervisionError as well (the actor is failed for good).
    procs = new_procs(gpus=2)
    broken = procs.spawn("broken", InitRaises)
    for call in (lambda: broken.noop.call().get(timeout=T),
                 lambda: broken.slice(gpus=0).noop.call_one().get(timeout=T),
                 lambda: broken.initialized.get(timeout=T)):
        with pytest.raises(ActorError, match="This is an exception from __init__") as info:
            call()
        assert isinstance(info.value, SupervisionError)
        assert "failed in its constructor" in str(info.value)
    with pytest.raises(ActorError) as info:
        broken.noop.call().get(timeout=T)
    assert str(info.value).startswith("Endpoint call broken.noop() failed, The actor broken")
    assert "ValueError: This is an exception from __init__" in str(info.value.exception)
    import pickle

    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is type(info.value) and str(again) == str(info.value)
