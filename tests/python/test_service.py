"""podium.service: replicated actors with route(), fanout(), call_one() and sticky sessions;
a replica that fails leaves routing at once, an in-flight route() is retried once, the
replica is replaced (SR-1..SR-6, supervision SV-8). Small: 1 proc per replica, 2 replicas."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from conftest import eventually, gone_within, WAIT_S
from podium.actor import Actor, endpoint, this_host
from podium.service import no_retry, RestartPolicy, ServiceError


class Worker(Actor):
    def __init__(self, tag: str = "w") -> None:
        self.tag = tag

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def hold(self, path: str) -> int:
        """Returns once ``path`` exists (bounded), with this proc's pid."""
        deadline = time.monotonic() + WAIT_S
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return os.getpid()

    @endpoint
    @no_retry
    def hold_once(self, path: str) -> int:
        deadline = time.monotonic() + WAIT_S
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return os.getpid()

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom")


@pytest.fixture
def service():
    """service(**options): a Worker service stopped after the test."""
    started = []

    def start(*args, **opts):
        opts.setdefault("procs", 1)
        opts.setdefault("num_replicas", 2)
        svc = Worker.options(**opts).as_service(*args).get(WAIT_S)
        started.append(svc)
        return svc

    yield start
    for svc in started:
        svc.shutdown().get(WAIT_S * 2)


def pids_of(svc) -> list:
    return [r["procs"][0]["pid"] for r in svc.status()]


def busy_replica(svc) -> int:
    return eventually(lambda: next((r["index"] + 1 for r in svc.status() if r["in_flight"]),
                                   None), WAIT_S, "a replica with a call in flight") - 1


def test_route_goes_to_the_least_loaded_replica_ties_round_robin(service, tmp_path):  # SR-1
    svc = service()
    pids = pids_of(svc)
    assert len(set(pids)) == 2
    # Idle: ties, taken in turn.
    got = [svc.pid.route().get(WAIT_S) for _ in range(4)]
    assert got == [pids[0], pids[1], pids[0], pids[1]]
    # One replica busy with a call in flight: every other call goes to the other one.
    gate = tmp_path / "go"
    held = svc.hold.route(str(gate))
    busy = busy_replica(svc)
    assert [svc.pid.route().get(WAIT_S) for _ in range(3)] == [pids[1 - busy]] * 3
    gate.touch()
    assert held.get(WAIT_S) == pids[busy]
    assert all(r["in_flight"] == 0 for r in svc.status())


def test_fanout_returns_every_replica_result_in_replica_order(service):  # SR-2
    svc = service(num_replicas=3)
    assert svc.pid.fanout().get(WAIT_S) == pids_of(svc)


def test_sessions_are_sticky(service):  # SR-1
    svc = service()
    with svc.session():
        first = svc.pid.route().get(WAIT_S)
        svc.pid.route().get(WAIT_S)  # the session's calls do not move it
        assert {svc.pid.route().get(WAIT_S) for _ in range(4)} == {first}
    a, b = svc.start_session(), svc.start_session()
    pa = svc.pid.route(sess_id=a).get(WAIT_S)
    pb = svc.pid.route(sess_id=b).get(WAIT_S)
    for _ in range(3):
        svc.pid.route().get(WAIT_S)  # other calls move the round-robin turn
        assert svc.pid.route(sess_id=a).get(WAIT_S) == pa
        assert svc.pid.route(sess_id=b).get(WAIT_S) == pb

    async def in_async_session():
        async with svc.session():
            got = [await svc.pid.route() for _ in range(4)]
        return got

    got = asyncio.run(in_async_session())
    assert len(set(got)) == 1


def test_call_one_on_a_chosen_replica(service):
    svc = service()
    pids = pids_of(svc)
    assert svc.replica(1).pid.call_one().get(WAIT_S) == pids[1]
    assert svc.pid.call_one(replica=0).get(WAIT_S) == pids[0]
    with pytest.raises(TypeError, match="replica=i"):
        svc.pid.call_one()
    with pytest.raises(IndexError):
        svc.replica(2)
    # An endpoint's own exception is the caller's, as for an actor call.
    with pytest.raises(Exception, match="boom"):
        svc.boom.route().get(WAIT_S)


def test_replicas_of_several_procs(service):
    svc = service(procs=2, num_replicas=1)
    st = svc.status()[0]
    assert [p["rank"] for p in st["procs"]] == [0, 1]
    routed = svc.pid.route().get(WAIT_S)  # every proc of the replica runs it
    assert list(routed.values()) == [p["pid"] for p in st["procs"]]
    (fanned,) = svc.pid.fanout().get(WAIT_S)
    assert list(fanned.values()) == list(routed.values())


def test_status_reports_each_replica(service):
    svc = service()
    st = svc.status()
    assert [r["index"] for r in st] == [0, 1]
    for r in st:
        assert r["healthy"] is True and r["state"] == "running"
        assert r["in_flight"] == 0 and r["restarts"] == 0 and r["last_failure"] is None
        assert len(r["procs"]) == 1
        assert r["procs"][0]["host"] and r["procs"][0]["pid"] > 0
        assert r["mesh"].startswith(svc.name)


def test_a_killed_replica_leaves_routing_at_once(service):  # SR-3, SV-8
    svc = service(restart=RestartPolicy(max_restarts=0))
    pids = pids_of(svc)
    os.kill(pids[0], signal.SIGKILL)
    # By its supervision event, before any call: nothing polls the replicas.
    eventually(lambda: not svc.status()[0]["healthy"], WAIT_S, "replica 0 out of routing")
    st = svc.status()[0]
    assert st["state"] == "failed" and str(pids[0]) in st["last_failure"]
    assert [svc.pid.route().get(WAIT_S) for _ in range(4)] == [pids[1]] * 4
    assert svc.pid.fanout().get(WAIT_S) == [pids[1]]


def test_an_in_flight_route_is_retried_once_on_a_healthy_replica(service, tmp_path):  # SR-4
    svc = service()
    pids = pids_of(svc)
    gate = tmp_path / "go"
    call = svc.hold.route(str(gate))
    busy = busy_replica(svc)
    os.kill(pids[busy], signal.SIGKILL)
    # Sent again to the other replica, where it waits for the gate like the first time.
    eventually(lambda: svc.status()[1 - busy]["in_flight"] == 1, WAIT_S, "the retry")
    gate.touch()
    assert call.get(WAIT_S) == pids[1 - busy]


def test_a_route_is_retried_only_once(service, tmp_path):  # SR-4
    svc = service(restart=RestartPolicy(max_restarts=0))
    pids = pids_of(svc)
    call = svc.hold.route(str(tmp_path / "never"))
    first = busy_replica(svc)
    os.kill(pids[first], signal.SIGKILL)
    eventually(lambda: svc.status()[1 - first]["in_flight"] == 1, WAIT_S, "the retry")
    os.kill(pids[1 - first], signal.SIGKILL)
    with pytest.raises(ServiceError) as e:
        call.get(WAIT_S)
    assert e.value.replica == 1 - first and e.value.service == svc.name
    assert svc.name in str(e.value) and f"pid {pids[1 - first]}" in str(e.value)


@pytest.mark.parametrize("how", ["route", "endpoint", "service"])
def test_no_retry_when_retries_are_off(service, tmp_path, how):  # SR-4
    svc = service(**({"retry": False} if how == "service" else {}))
    pids = pids_of(svc)
    gate = str(tmp_path / "go")
    call = (svc.hold.route(gate, retry=False) if how == "route" else
            svc.hold_once.route(gate) if how == "endpoint" else svc.hold.route(gate))
    busy = busy_replica(svc)
    os.kill(pids[busy], signal.SIGKILL)
    with pytest.raises(ServiceError) as e:
        call.get(WAIT_S)
    # It names the service, the replica, the rank, the host, the pid and the cause.
    assert e.value.replica == busy and e.value.service == svc.name
    text = str(e.value)
    assert f"service '{svc.name}' replica {busy}" in text
    assert f"pid {pids[busy]}" in text and "host" in text and "SIGKILL" in text
    assert e.value.rank == 0 and e.value.host
    assert svc.status()[1 - busy]["in_flight"] == 0  # not sent anywhere else


def test_a_failed_replica_is_replaced(service):  # SR-3
    svc = service()
    pids = pids_of(svc)
    os.kill(pids[1], signal.SIGKILL)
    eventually(lambda: svc.status()[1]["restarts"] == 1 and svc.status()[1]["healthy"],
               WAIT_S, "replica 1 replaced")
    st = svc.status()
    assert all(r["healthy"] for r in st)
    new = st[1]["procs"][0]["pid"]
    assert new != pids[1] and str(pids[1]) in st[1]["last_failure"]
    assert gone_within([pids[1]]) == []
    assert svc.pid.fanout().get(WAIT_S) == [pids[0], new]


class Tally(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def add(self, k: int) -> int:
        self.n += k
        return self.n

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    def __checkpoint__(self) -> int:
        return self.n

    def __restore__(self, state: int) -> None:
        self.n = state


def test_a_replacement_is_restored_from_its_checkpoint():  # SR-3, RS-2, RS-4
    svc = Tally.options(num_replicas=1).as_service().get(WAIT_S)
    try:
        assert [svc.add.route(k).get(WAIT_S) for k in (1, 2, 3)] == [1, 3, 6]
        pid = svc.pid.route().get(WAIT_S)
        os.kill(pid, signal.SIGKILL)
        eventually(lambda: svc.status()[0]["restarts"] == 1 and svc.status()[0]["healthy"],
                   WAIT_S, "the replica replaced")
        assert svc.add.route(4).get(WAIT_S) == 10
        assert svc.pid.route().get(WAIT_S) != pid
    finally:
        svc.shutdown().get(WAIT_S * 2)


def test_shutdown_leaves_no_process(service):  # SR-6
    svc = Worker.options(procs=1, num_replicas=2).as_service().get(WAIT_S)
    pids = pids_of(svc)
    try:
        os.kill(pids[0], signal.SIGKILL)  # a restart in progress is stopped too
        eventually(lambda: not svc.status()[0]["healthy"], WAIT_S, "replica 0 down")
    finally:
        svc.shutdown().get(WAIT_S * 2)
    new = [p["pid"] for r in svc.status() for p in r["procs"]]
    assert gone_within(pids + new) == []
    assert all(r["state"] == "stopped" for r in svc.status())
    with pytest.raises(ServiceError, match="shut down"):
        svc.pid.route().get(WAIT_S)


class Starter(Actor):
    """Starts a service from inside an actor, uses it, and stops it."""

    @endpoint
    def run(self) -> dict:
        svc = Worker.options(procs=1, num_replicas=2).as_service("inner").get(WAIT_S)
        try:
            pids = [r["procs"][0]["pid"] for r in svc.status()]
            routed = [svc.pid.route().get(WAIT_S) for _ in range(4)]
            fanned = svc.pid.fanout().get(WAIT_S)
        finally:
            svc.shutdown().get(WAIT_S * 2)
        return {"pids": pids, "routed": routed, "fanned": fanned}


class Healer(Actor):
    """Owns a service and, within one endpoint call (so its own __supervise__ path is busy),
    kills a replica and routes until the replica is replaced."""

    @endpoint
    def run(self) -> dict:
        svc = Worker.options(procs=1, num_replicas=2).as_service().get(WAIT_S)
        try:
            pids = [r["procs"][0]["pid"] for r in svc.status()]
            os.kill(pids[0], signal.SIGKILL)
            routed = []
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                routed.append(svc.pid.route().get(WAIT_S))
                st = svc.status()[0]
                if st["restarts"] == 1 and st["healthy"]:
                    break
                time.sleep(0.01)
            return {"pids": pids, "routed": routed, "status": svc.status()}
        finally:
            svc.shutdown().get(WAIT_S * 2)


class AsyncStarter(Actor):
    @endpoint
    async def run(self) -> list:
        svc = await Worker.options(procs=1, num_replicas=2).as_service()
        try:
            return [await svc.pid.route() for _ in range(2)]
        finally:
            await svc.shutdown()


def test_a_service_started_inside_an_actor(new_procs, faults):
    procs = new_procs(procs=1)
    out = procs.spawn("starter", Starter).run.call_one().get(WAIT_S * 3)
    assert out["routed"] == [out["pids"][0], out["pids"][1]] * 2
    assert out["fanned"] == out["pids"]
    got = procs.spawn("astarter", AsyncStarter).run.call_one().get(WAIT_S * 3)
    assert len(set(got)) == 2
    assert gone_within(out["pids"] + got) == []
    assert faults() == []


class Broken(Actor):
    def __init__(self, pid_file: str) -> None:
        with open(pid_file, "a") as f:
            f.write(f"{os.getpid()}\n")
        raise RuntimeError("no model here")

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_a_service_that_cannot_start_raises_and_leaves_no_process(tmp_path, faults):
    pid_file = tmp_path / "pids"
    with pytest.raises(Exception, match="no model here"):
        Broken.options(num_replicas=2).as_service(str(pid_file)).get(WAIT_S * 2)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert pids and gone_within(pids) == []
    assert faults() == []


def test_a_service_in_a_busy_sync_actor_replaces_its_replica(new_procs, faults):  # SR-3
    out = new_procs(procs=1).spawn("healer", Healer).run.call_one().get(WAIT_S * 3)
    st = out["status"][0]
    assert st["restarts"] == 1 and st["healthy"], out
    assert out["pids"][0] not in out["routed"][1:]  # at most the first call saw it die
    assert faults() == []


def test_awaitable_as_service_and_options_checks():
    async def main():
        svc = await Worker.options(num_replicas=1, hosts=this_host()).as_service()
        try:
            return await svc.pid.fanout(), svc.num_replicas
        finally:
            await svc.shutdown()

    got, n = asyncio.run(main())
    assert len(got) == 1 and n == 1
    with pytest.raises(TypeError, match="unknown option"):
        Worker.options(replicas=2)
    with pytest.raises(ValueError, match="num_replicas"):
        Worker.options(num_replicas=0)
    with pytest.raises(TypeError):
        Worker.options().as_service(1, 2, 3)

