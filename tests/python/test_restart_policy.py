"""ProcMesh.spawn(..., restart=RestartPolicy(...)): a failed actor's proc is replaced and the
actor re-created from its last checkpoint; its owner's __supervise__ still hears of it;
calls made while it restarts fail fast or wait; after max_restarts it fails as without a
policy; nothing it started outlives it (RS-1..RS-5, supervision SV-8)."""

from __future__ import annotations

import os
import signal

import pytest

from conftest import eventually, gone_within, WAIT_S
from podium.actor import Actor, endpoint, SupervisionError, this_host
from podium.service import RestartingError, RestartPolicy


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.n = start

    @endpoint
    def inc(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    def __checkpoint__(self) -> int:
        return self.n

    def __restore__(self, state: int) -> None:
        self.n = state


class Plain(Actor):
    """No checkpoint: a restart starts it afresh from its constructor arguments."""

    def __init__(self, start: int) -> None:
        self.n = start

    @endpoint
    def inc(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture
def kept(new_procs):
    """kept(Class, *args, policy, **kwargs): a restarting mesh on one proc, stopped after."""
    meshes = []

    def spawn(Class, *args, policy, **kwargs):
        procs = new_procs(procs=1)
        m = procs.spawn(f"kept{len(meshes)}", Class, *args, restart=policy, **kwargs)
        meshes.append(m)
        return m

    yield spawn
    for m in meshes:
        m.stop().get(WAIT_S * 2)


def kill(mesh) -> int:
    pid = mesh.pid.call_one().get(WAIT_S)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_restart_after_sigkill_restores_state(kept, faults):  # RS-1, RS-2, RS-4
    m = kept(Counter, 10, policy=RestartPolicy(max_restarts=2))
    assert [m.inc.call_one().get(WAIT_S) for _ in range(3)] == [11, 12, 13]
    old = kill(m)
    eventually(lambda: m.restarts == 1, WAIT_S, "a restart")
    assert m.inc.call_one().get(WAIT_S) == 14  # restored from the checkpoint after 13
    assert m.pid.call_one().get(WAIT_S) != old
    assert m.state == "running"
    assert faults() == []  # the root's unhandled_fault_hook did not run (SV-8)


def test_without_checkpoint_it_starts_from_its_arguments(kept):  # RS-2
    m = kept(Plain, 5, policy=RestartPolicy())
    assert m.inc.call_one().get(WAIT_S) == 6
    kill(m)
    eventually(lambda: m.restarts == 1, WAIT_S, "a restart")
    assert m.inc.call_one().get(WAIT_S) == 6
    assert [v for v in m.inc.call().get(WAIT_S).values()] == [7]


def test_checkpoint_on_request(kept):  # RS-4
    m = kept(Counter, policy=RestartPolicy(checkpoint="on_request"))
    for _ in range(3):
        m.inc.call_one().get(WAIT_S)
    m.checkpoint().get(WAIT_S)
    m.inc.call_one().get(WAIT_S)
    m.inc.call_one().get(WAIT_S)
    kill(m)
    eventually(lambda: m.restarts == 1, WAIT_S, "a restart")
    assert m.inc.call_one().get(WAIT_S) == 4  # from the checkpoint at 3


class Owner(Actor):
    """Spawns a restarting Counter and records what its __supervise__ hears."""

    def __init__(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"procs": 1})
        self.child = self.procs.spawn("child", Counter, restart=RestartPolicy())
        self.seen: list = []

    def __supervise__(self, failure) -> bool:
        self.seen.append(failure.report())
        return False  # not handled: with a policy, the owner does not fail for it (SV-8)

    @endpoint
    def child_pid(self) -> int:
        return self.child.pid.call_one().get(WAIT_S)

    @endpoint
    def child_inc(self) -> int:
        return self.child.inc.call_one().get(WAIT_S)

    @endpoint
    def supervised(self) -> list:
        return list(self.seen)

    @endpoint
    def stop_child(self) -> None:
        self.child.stop().get(WAIT_S * 2)
        self.procs.stop().get(WAIT_S)


def test_supervise_is_still_called_and_the_owner_lives(new_procs, faults):  # RS-1, SV-8
    owner = new_procs(procs=1).spawn("owner", Owner)
    assert owner.child_inc.call_one().get(WAIT_S) == 1
    pid = owner.child_pid.call_one().get(WAIT_S)
    os.kill(pid, signal.SIGKILL)
    seen = eventually(lambda: owner.supervised.call_one().get(WAIT_S), WAIT_S,
                      "__supervise__ ran")
    assert len(seen) == 1 and f"pid {pid}" in seen[0] and "SIGKILL" in seen[0]
    assert owner.child_inc.call_one().get(WAIT_S) == 2  # restarted, state restored
    assert owner.child_pid.call_one().get(WAIT_S) != pid
    owner.stop_child.call_one().get(WAIT_S * 3)
    assert faults() == []


def test_calls_while_restarting_fail_fast(kept):  # RS-3
    # A long backoff keeps it restarting; stop() ends the backoff at once (RS-5).
    m = kept(Counter, policy=RestartPolicy(on_restart="fail", backoff=60.0, max_backoff=60.0))
    m.inc.call_one().get(WAIT_S)
    kill(m)
    eventually(lambda: m.state == "restarting", WAIT_S, "restarting")
    with pytest.raises(RestartingError) as e:
        m.inc.call_one().get(WAIT_S)
    assert "kept0" in str(e.value) and "restarting" in str(e.value)
    assert "SIGKILL" in str(e.value) and e.value.restart == 1
    assert isinstance(e.value, SupervisionError) and e.value.host and e.value.pid
    with pytest.raises(RestartingError):
        m.inc.broadcast()


def test_calls_while_restarting_wait(kept):  # RS-3
    m = kept(Counter, policy=RestartPolicy(on_restart="wait", backoff=1.0))
    m.inc.call_one().get(WAIT_S)
    kill(m)
    eventually(lambda: m.state == "restarting", WAIT_S, "restarting")
    assert m.inc.call_one().get(WAIT_S) == 2  # waited for the new actor, restored


def test_a_wait_is_bounded(kept):  # RS-3
    m = kept(Counter, policy=RestartPolicy(on_restart="wait", backoff=60.0, max_backoff=60.0,
                                           wait_timeout=0.1))
    kill(m)
    eventually(lambda: m.state == "restarting", WAIT_S, "restarting")
    with pytest.raises(RestartingError, match="did not come back within 0.1 s"):
        m.inc.call_one().get(WAIT_S)


def test_max_restarts_exhausted_fails_as_without_a_policy(kept, faults):  # RS-1
    m = kept(Counter, policy=RestartPolicy(max_restarts=1))
    first = kill(m)
    eventually(lambda: m.restarts == 1 and m.state == "running", WAIT_S, "restart 1")
    second = kill(m)
    got = faults.wait(1, WAIT_S)  # the root's unhandled_fault_hook (conftest records it)
    assert len(got) == 1 and f"pid {second}" in got[0].report()
    assert m.state == "failed" and first != second
    with pytest.raises(SupervisionError, match="max_restarts=1"):
        m.inc.call_one().get(WAIT_S)


def test_no_orphan_procs(kept):  # RS-5
    m = kept(Counter, policy=RestartPolicy(max_restarts=3, backoff=0.0))
    pids = [kill(m)]
    eventually(lambda: m.restarts == 1 and m.state == "running", WAIT_S, "restart 1")
    pids.append(kill(m))
    eventually(lambda: m.restarts == 2 and m.state == "running", WAIT_S, "restart 2")
    pids.append(m.pid.call_one().get(WAIT_S))
    m.stop().get(WAIT_S * 2)
    assert gone_within(pids) == []
    assert m.state == "stopped"
    with pytest.raises(SupervisionError, match="stopped"):
        m.inc.call_one().get(WAIT_S)


def test_policy_checks():
    with pytest.raises(ValueError, match="on_restart"):
        RestartPolicy(on_restart="later")
    with pytest.raises(ValueError, match="max_restarts"):
        RestartPolicy(max_restarts=-1)
    p = RestartPolicy(backoff=1.0, backoff_factor=2.0, max_backoff=3.0)
    assert [p.delay(k) for k in (1, 2, 3, 4)] == [1.0, 2.0, 3.0, 3.0]  # RS-2: bounded
