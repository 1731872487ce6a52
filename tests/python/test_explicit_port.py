"""Explicit response ports (issue 18, part 4; docs/supervision.md EP-7).

An ``@endpoint(explicit_response_port=True)`` or ``@concurrent_endpoint(
explicit_response_port=True)`` method answers through its port, so an exception that escapes
it has no caller to go to: as in Monarch, it fails the actor. A caller still waiting for the
answer gets SupervisionError naming the cause (never a hang: every wait below is bounded by
T and would time out instead); a caller answered before the raise keeps its answer, and the
actor has failed all the same. Actors elsewhere (other procs) serve on."""

from __future__ import annotations

import asyncio
import os

import pytest

from podium.actor import (
    Actor,
    Port,
    SupervisionError,
    concurrent_endpoint,
    endpoint,
)

T = 20  # bound on each wait: a hang fails the test with TimeoutError

pytestmark = pytest.mark.timeout(120)


class SyncPorts(Actor):
    @endpoint(explicit_response_port=True)
    def raises(self, port: Port) -> None:
        raise ValueError("sync: no answer")

    @endpoint(explicit_response_port=True)
    def answers_then_raises(self, port: Port) -> None:
        port.send("sync answer")
        raise ValueError("sync: raised after answering")

    @endpoint(explicit_response_port=True)
    def answers(self, port: Port) -> None:
        port.send(os.getpid())


class AsyncPorts(Actor):
    @endpoint(explicit_response_port=True)
    async def raises(self, port: Port) -> None:
        await asyncio.sleep(0)
        raise ValueError("async: no answer")

    @endpoint(explicit_response_port=True)
    async def answers_then_raises(self, port: Port) -> None:
        port.send("async answer")
        await asyncio.sleep(0)
        raise ValueError("async: raised after answering")

    @concurrent_endpoint(explicit_response_port=True)
    async def concurrent_raises(self, port: Port) -> None:
        await asyncio.sleep(0)
        raise ValueError("concurrent: no answer")

    @concurrent_endpoint(explicit_response_port=True)
    async def concurrent_answers_then_raises(self, port: Port) -> None:
        port.send("concurrent answer")
        await asyncio.sleep(0)
        raise ValueError("concurrent: raised after answering")

    @concurrent_endpoint(explicit_response_port=True)
    async def concurrent_exits(self, port: Port) -> None:
        raise SystemExit(17)

    @endpoint(explicit_response_port=True)
    async def answers(self, port: Port) -> None:
        port.send(os.getpid())


RAISES = [(SyncPorts, "raises", "sync: no answer"),
          (AsyncPorts, "raises", "async: no answer"),
          (AsyncPorts, "concurrent_raises", "concurrent: no answer"),
          (AsyncPorts, "concurrent_exits", "SystemExit: 17")]
ANSWERS = [(SyncPorts, "answers_then_raises", "sync"),
           (AsyncPorts, "answers_then_raises", "async"),
           (AsyncPorts, "concurrent_answers_then_raises", "concurrent")]


def _ids(cases):
    return [f"{cls.__name__}.{name}" for cls, name, _ in cases]


@pytest.mark.parametrize("cls,name,cause", RAISES, ids=_ids(RAISES))
def test_call_one_of_a_method_that_raises_fails_the_actor(spawn, faults, cls, name, cause):
    """The caller gets SupervisionError naming the actor, the endpoint and the cause; the
    actor has failed (later calls are refused), its owner (here the root) is told, and the
    other rank of the mesh serves on."""
    mesh = spawn(cls)
    with pytest.raises(SupervisionError) as info:
        getattr(mesh.slice(gpus=0), name).call_one().get(timeout=T)
    e = info.value
    assert cause in str(e) and "explicit response-port endpoint" in str(e), str(e)
    assert (e.mesh_name, e.rank, e.endpoint) == (mesh.name, 0, name)
    with pytest.raises(SupervisionError, match=cause):
        mesh.slice(gpus=0).answers.call_one().get(timeout=T)
    assert mesh.slice(gpus=1).answers.call_one().get(timeout=T) > 0
    assert [(f.mesh_name, f.rank) for f in faults.wait(1)] == [(mesh.name, 0)]


@pytest.mark.parametrize("cls,name,cause", RAISES, ids=_ids(RAISES))
def test_call_on_a_mesh_of_a_method_that_raises_fails_every_rank(spawn, faults, cls, name,
                                                                  cause):
    """call() on the whole mesh: each rank raises, each fails, the caller gets
    SupervisionError (not a hang waiting for answers that never come)."""
    mesh = spawn(cls)
    with pytest.raises(SupervisionError, match=cause):
        getattr(mesh, name).call().get(timeout=T)
    got = faults.wait(2)
    assert sorted((f.mesh_name, f.rank) for f in got) == [(mesh.name, 0), (mesh.name, 1)]


@pytest.mark.parametrize("cls,name,kind", ANSWERS, ids=_ids(ANSWERS))
def test_a_method_that_answers_then_raises_keeps_the_answer_and_fails(spawn, faults, cls,
                                                                      name, kind):
    """As in Monarch: the answer sent before the raise reaches the caller; the exception
    then fails the actor."""
    mesh = spawn(cls)
    one = mesh.slice(gpus=0)
    assert getattr(one, name).call_one().get(timeout=T) == f"{kind} answer"
    got = faults.wait(1)
    assert [(f.mesh_name, f.rank) for f in got] == [(mesh.name, 0)]
    assert f"{kind}: raised after answering" in got[0].report()
    assert "after it answered" in got[0].report()
    with pytest.raises(SupervisionError, match=f"{kind}: raised after answering"):
        one.answers.call_one().get(timeout=T)


def test_actors_on_other_procs_serve_on(spawn, new_procs, faults):
    """A failed explicit-port actor is contained: actors of other meshes, on other procs
    and on its own, keep serving."""
    pm = new_procs(gpus=2)
    failing = spawn(AsyncPorts, on=pm)
    neighbour = spawn(SyncPorts, on=pm)
    elsewhere = spawn(SyncPorts, on=new_procs(gpus=1))
    with pytest.raises(SupervisionError):
        failing.concurrent_raises.call().get(timeout=T)
    assert len(neighbour.answers.call().get(timeout=T)) == 2
    assert len(elsewhere.answers.call().get(timeout=T)) == 1
    assert sorted(f.rank for f in faults.wait(2) if f.mesh_name == failing.name) == [0, 1]
