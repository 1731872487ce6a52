"""The cast tree from Python (docs/cast.md): call(), stream(), Accumulator and broadcast keep
their results and their order when a mesh is larger than the fan-out, and the controller sends
and receives at most fan-out + 1 messages per call (CT-1)."""

from __future__ import annotations

import operator
import os
import signal
import time

import pytest

from podium._core import mesh as _core
from podium.actor import Accumulator, Actor, current_rank, endpoint

T = 20  # seconds: bound on every get() below


class Node(Actor):
    def __init__(self) -> None:
        self.last = -1
        self.count = 0
        self.out_of_order = False

    @endpoint
    def where(self):
        return current_rank().rank, os.getpid()

    @endpoint
    def same(self) -> str:
        return "equal"

    @endpoint
    def seen(self, i: int) -> None:
        if i <= self.last:
            self.out_of_order = True
        self.last = i
        self.count += 1

    @endpoint
    def seen_count(self) -> int:
        return -1 if self.out_of_order else self.count


@pytest.fixture
def fanout2():
    old = _core.cast_fanout()
    _core.set_cast_fanout(2)
    yield
    _core.set_cast_fanout(old)


@pytest.fixture
def grid(new_procs):
    return new_procs(hosts=2, gpus=5)  # 10 procs: trees 3 levels deep at fan-out 2


def test_call_through_the_tree_answers_in_rank_order(grid, fanout2):
    mesh = grid.spawn("tree_where", Node)
    pids = mesh.where.call().get(timeout=T)
    assert [r for r, _ in pids.values()] == list(range(10))
    assert len({p for _, p in pids.values()}) == 10
    sent0, recv0 = _core.traffic()
    same = mesh.same.call().get(timeout=T)
    sent1, recv1 = _core.traffic()
    assert list(same.values()) == ["equal"] * 10
    assert sent1 - sent0 <= 3 and recv1 - recv0 <= 3  # CT-1 at k = 2
    # A strided, two-dimensional slice: hosts 0..1 x gpus 1, 3.
    sub = mesh.slice(gpus=slice(1, 5, 2))
    got = sub.where.call().get(timeout=T)
    assert [r for r, _ in got.values()] == [0, 1, 2, 3]
    want = [pids.item(hosts=h, gpus=g)[1] for h in range(2) for g in (1, 3)]
    assert [p for _, p in got.values()] == want


def test_stream_and_accumulator_keep_their_semantics(grid, fanout2):
    mesh = grid.spawn("tree_stream", Node)
    assert sorted(f.get(timeout=T)[0] for f in mesh.where.stream()) == list(range(10))
    total = Accumulator(mesh.where, 0, lambda acc, v: acc + v[0]).accumulate().get(timeout=T)
    assert total == sum(range(10))
    assert Accumulator(mesh.same, "", operator.add).accumulate().get(timeout=T) == "equal" * 10


def test_broadcasts_and_single_sends_keep_sender_order(grid, fanout2):  # AC-11
    mesh = grid.spawn("tree_order", Node)
    expected = [0] * 10
    for i in range(600):
        if i % 3 == 0:
            mesh.seen.broadcast(i)
            expected = [e + 1 for e in expected]
        else:
            r = (i * 7) % 10
            mesh.slice(hosts=r // 5, gpus=r % 5).seen.broadcast(i)
            expected[r] += 1
    assert list(mesh.seen_count.call().get(timeout=T).values()) == expected


def test_strided_slice_casts_among_single_sends_keep_sender_order(grid, fanout2):  # AC-11
    # Casts to gpus 0, 2, 4 of both hosts (a strided slice: its rank tables are cut into runs)
    # interleaved with whole-mesh casts and single sends: each rank's AC-11 numbers differ, so
    # every chunk carries several runs of them (docs/cast.md, "Compact rank tables").
    mesh = grid.spawn("tree_order_slice", Node)
    sub = mesh.slice(gpus=slice(0, 5, 2))
    in_sub = [h * 5 + g for h in range(2) for g in (0, 2, 4)]
    expected = [0] * 10
    for i in range(600):
        if i % 5 == 0:
            mesh.seen.broadcast(i)
            expected = [e + 1 for e in expected]
        elif i % 5 in (1, 3):
            sub.seen.broadcast(i)
            for r in in_sub:
                expected[r] += 1
        else:
            r = (i * 7) % 10
            mesh.slice(hosts=r // 5, gpus=r % 5).seen.broadcast(i)
            expected[r] += 1
    assert list(mesh.seen_count.call().get(timeout=T).values()) == expected
    got = sub.where.call().get(timeout=T)
    assert [r for r, _ in got.values()] == list(range(6))


class Driver(Actor):
    """Sends from an actor's own thread: a Python actor is a sender of its own (AC-11)."""

    @endpoint
    def drive(self, mesh, n: int) -> list:
        from podium._core import mesh as core

        core.set_cast_fanout(2)  # this proc's casts go through trees too
        expected = [0] * 10
        for i in range(n):
            if i % 4 == 0:
                mesh.seen.broadcast(i)
                expected = [e + 1 for e in expected]
            else:
                r = (i * 3) % 10
                mesh.slice(hosts=r // 5, gpus=r % 5).seen.broadcast(i)
                expected[r] += 1
        # A call from the same sender comes after all of them.
        got = list(mesh.seen_count.call().get(timeout=20).values())
        return [got, expected]


def test_casts_from_a_python_actor_keep_sender_order(grid, fanout2, spawn):  # AC-11
    mesh = grid.spawn("tree_order_actor", Node)
    mesh.initialized.get(timeout=T)
    driver = spawn(Driver)
    got, expected = driver.slice(gpus=0).drive.call_one(mesh, 600).get(timeout=60)
    assert got == expected


def test_a_dead_relay_fails_only_its_own_rank(grid, fanout2):  # CT-4
    mesh = grid.spawn("tree_dead", Node)
    pids = [p for _, p in mesh.where.call().get(timeout=T).values()]
    # Fan-out 2 over 10 ranks: rank 1 relays ranks 2..4 (CT-2).
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(Exception) as e:
        mesh.same.call().get(timeout=T)
    assert "rank 1" in str(e.value) and "SIGKILL" in str(e.value), str(e.value)
    # A one-way cast goes around the dead relay: ranks 2..4 get it too.
    mesh.seen.broadcast(1)
    below = mesh.slice(hosts=0, gpus=slice(2, 5))
    assert list(below.seen_count.call().get(timeout=T).values()) == [1, 1, 1]
    assert list(mesh.slice(hosts=1).seen_count.call().get(timeout=T).values()) == [1] * 5
