"""spawn_procs(bootstrap=...), get_or_spawn_controller, context(), ProcMesh.stop() and
``async with`` (API.md "Meshes", "Results")."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from podium.actor import (
    Actor,
    ActorMesh,
    context,
    current_actor_name,
    current_rank,
    endpoint,
    get_or_spawn_controller,
    ProcMesh,
    SupervisionError,
    this_host,
    this_proc,
)

T = 10  # seconds: bound on every get() below


class EnvReader(Actor):
    def __init__(self) -> None:
        self.at_init = os.environ.get("PODIUM_TEST_BOOT")

    @endpoint
    def read(self) -> tuple:
        return self.at_init, os.environ.get("PODIUM_TEST_BOOT"), os.getpid()


def _set_env() -> None:
    os.environ["PODIUM_TEST_BOOT"] = f"set in {os.getpid()}"


async def _set_env_async() -> None:
    await asyncio.sleep(0.01)
    os.environ["PODIUM_TEST_BOOT"] = "async"


def test_bootstrap_runs_in_every_proc_before_any_actor(new_procs):
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_set_env)
    try:
        mesh = pm.spawn("env", EnvReader)  # sent at once: __init__ waits for the bootstrap
        got = mesh.read.call().get(timeout=T).values()
        assert [(a, b) for a, b, _ in got] == [(f"set in {p}", f"set in {p}") for _, _, p in got]
        assert pm.initialized.get(timeout=T) is True
        # Spawns on a slice of the mesh wait for it as well.
        assert pm.slice(gpus=1).spawn("env2", EnvReader).read.call_one().get(timeout=T)[0]
    finally:
        pm.stop().get(timeout=T)


def test_async_bootstrap_and_a_failing_bootstrap():
    pm = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=_set_env_async)
    try:
        assert pm.spawn("env", EnvReader).read.call_one().get(timeout=T)[0] == "async"
    finally:
        pm.stop().get(timeout=T)

    def broken():
        raise OSError("no such device")

    pm = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=broken)
    try:
        with pytest.raises(Exception, match="no such device"):
            pm.initialized.get(timeout=T)
        mesh = pm.spawn("env", EnvReader)
        with pytest.raises(Exception, match="bootstrap"):
            mesh.initialized.get(timeout=T)
    finally:
        pm.stop().get(timeout=T)
    with pytest.raises(TypeError):
        this_host().spawn_procs(per_host={"gpus": 1}, bootstrap="not callable")


class Registry(Actor):
    def __init__(self, label: str) -> None:
        self.label = label
        self.hits = 0

    @endpoint
    def hit(self) -> tuple:
        self.hits += 1
        return self.label, self.hits, os.getpid()


class AsksForController(Actor):
    @endpoint
    def ask(self, name: str) -> tuple:
        ctrl = get_or_spawn_controller(name, Registry, "from an actor").get(timeout=5)
        return ctrl.hit.call_one().get(timeout=5)


def test_get_or_spawn_controller_is_one_actor_per_name(spawn, request):
    name = f"ctrl-{request.node.name}"[:50]
    first = get_or_spawn_controller(name, Registry, "from the controller").get(timeout=T)
    try:
        assert isinstance(first, ActorMesh)
        label, hits, pid = first.hit.call_one().get(timeout=T)
        assert (label, hits, pid) == ("from the controller", 1, os.getpid())  # in-process
        again = get_or_spawn_controller(name, Registry, "ignored").get(timeout=T)
        assert again.hit.call_one().get(timeout=T)[:2] == ("from the controller", 2)
        # From actors in other processes: the same controller.
        got = spawn(AsksForController).ask.call(name).get(timeout=T).values()
        assert sorted(h for _, h, _ in got) == [3, 4]
        assert all(lbl == "from the controller" and p == os.getpid() for lbl, _, p in got)
        with pytest.raises(TypeError):
            get_or_spawn_controller(name + "-2", Registry)  # missing argument: at the call site
    finally:
        first.stop().get(timeout=T)


class Introspect(Actor):
    @endpoint
    def info(self) -> dict:
        ctx = context()
        inst = ctx.actor_instance
        return {
            "name": inst.name,
            "rank": dict(inst.rank),
            "message_rank": dict(ctx.message_rank),
            "actor_id": str(inst.actor_id),
            "class_name": inst.class_name,
            "proc_mesh": inst.proc_mesh.sizes,
            "proc": inst.proc.sizes,
            "current": (current_actor_name(), current_rank().rank),
        }


def test_context_inside_an_actor(spawn):
    mesh = spawn(Introspect)
    info = mesh.info.call().get(timeout=T).item(gpus=1)
    assert info["name"] == mesh.name and info["rank"] == {"gpus": 1}
    assert info["message_rank"] == {"gpus": 1}
    assert info["actor_id"].endswith(f"#{mesh.name}[1]")
    assert info["class_name"].endswith("Introspect")
    assert info["proc_mesh"] == {"gpus": 2} and info["proc"] == {}
    assert info["current"] == (info["actor_id"], 1)
    # Called through a slice, the message rank is the point in the slice, the actor's rank
    # stays its point in the proc mesh.
    sliced = mesh.slice(gpus=slice(1, 2)).info.call().get(timeout=T).item(gpus=0)
    assert sliced["rank"] == {"gpus": 1} and sliced["message_rank"] == {"gpus": 0}
    client = context()
    assert client.actor_instance.name == "client" and len(client.message_rank) == 0
    assert client.actor_instance.proc_mesh.sizes == {}


class Child(Actor):
    def __init__(self, log: str) -> None:
        self.log = log

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc) -> None:
        with open(self.log, "a") as f:
            f.write(f"child {current_rank().rank} {exc}\n")


class Parent(Actor):
    def __init__(self, log: str) -> None:
        self.log = log
        self.child = this_proc().spawn(f"child-{os.getpid()}-{id(self)}", Child, log)

    @endpoint
    def ping_child(self) -> str:
        return self.child.ping.call_one().get(timeout=5)

    def __cleanup__(self, exc) -> None:
        # The child stopped first: calling it now fails.
        try:
            self.child.ping.call_one().get(timeout=5)
            state = "alive"
        except SupervisionError:
            state = "stopped"
        with open(self.log, "a") as f:
            f.write(f"parent {current_rank().rank} child {state}\n")


def test_proc_mesh_stop_stops_owned_meshes_first_and_runs_cleanup(tmp_path):
    log = str(tmp_path / "log")
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        parents = pm.spawn("parent", Parent, log)
        assert parents.ping_child.call().get(timeout=T).values() == ["pong", "pong"]
    finally:
        pm.stop().get(timeout=T)
    with open(log) as f:
        lines = sorted(f.read().splitlines())
    assert lines == ["child 0 None", "child 0 None", "parent 0 child stopped",
                     "parent 1 child stopped"]
    with pytest.raises(SupervisionError):
        parents.ping_child.call().get(timeout=T)  # the procs are gone
    with pytest.raises(SupervisionError):
        pm.spawn("late", Parent, log)


def test_actor_mesh_stop_then_calls_raise_supervision_error(spawn):
    mesh = spawn(Child, os.devnull)
    assert mesh.ping.call().get(timeout=T).values() == ["pong", "pong"]
    mesh.slice(gpus=0).stop().get(timeout=T)
    with pytest.raises(SupervisionError):
        mesh.ping.call().get(timeout=T)
    assert mesh.slice(gpus=1).ping.call_one().get(timeout=T) == "pong"  # the others live


def test_async_with_stops_the_proc_mesh():
    async def main():
        async with this_host().spawn_procs(per_host={"gpus": 2}) as pm:
            assert isinstance(pm, ProcMesh)
            mesh = pm.spawn("child", Child, os.devnull)
            assert (await mesh.ping.call()).values() == ["pong", "pong"]
        return pm, mesh

    pm, mesh = asyncio.run(asyncio.wait_for(main(), T))
    t0 = time.monotonic()
    with pytest.raises(SupervisionError):
        mesh.ping.call().get(timeout=T)
    assert time.monotonic() - t0 < T

    async def again():
        async with pm:
            pass

    with pytest.raises(RuntimeError, match="stopped"):
        asyncio.run(again())
