"""Persistent workers (docs/host_agent.md HA-7): procs and their actors outlive the controller
that spawned them, and a later controller takes them over by name. Each controller is a script
of its own (a process chooses its transport before podium starts in it); the workers are real
`python -m podium worker --persistent` processes on loopback, killed with their procs when the
test ends.
"""

from __future__ import annotations

import os
import re
import textwrap
import time
from pathlib import Path

import pytest

from conftest import eventually
from test_multihost import Worker, run_controller, workers  # noqa: F401 (fixture)

COUNTER = """
    class Counter(Actor):
        def __init__(self):
            self.n = 0

        @endpoint
        def incr(self):
            self.n += 1
            return self.n

        @endpoint
        def pid(self):
            return os.getpid()

        @endpoint
        def die(self):
            os._exit(7)

    def attach(workers, bound=20.0):
        # A worker that has not yet noticed a silent predecessor refuses us; it frees itself
        # within PODIUM_HOST_LOST_MS, so try again until then.
        deadline = time.monotonic() + bound
        while True:
            hosts = attach_to_workers(workers=workers)
            try:
                hosts.initialized.get(timeout=30)
                return hosts
            except Exception as e:
                if "serves another controller" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    """


@pytest.fixture
def persistent_workers():
    started: list[Worker] = []

    def start(n: int) -> list[Worker]:
        ws = [Worker(persistent=True) for _ in range(n)]
        started.extend(ws)
        return ws

    yield start
    for w in started:
        w.kill()


def alive(pids) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists()]


def kept(ws, bound: float = 30.0) -> None:
    """Waits until every worker said it keeps its controller's procs for the next one (HA-7):
    the worker's decision, which a test then checks the procs against."""
    for w in ws:
        eventually(lambda: "keeping its" in w.text(), bound,
                   f"worker {w.address} keeps the procs of the controller that left")


def wait_gone(pids, bound: float = 10.0) -> list[int]:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline and alive(pids):
        time.sleep(0.05)
    return alive(pids)


def controller(tmp_path, body, workers, env=None):
    return run_controller(tmp_path, textwrap.dedent(COUNTER) + textwrap.dedent(body),
                          [w.address for w in workers],
                          env={"PODIUM_HOST_LOST_MS": "1000", **(env or {})})


# SV-5: actor_mesh() adopts the running actors (they answer with their state) and an adopt of
# an actor that does not exist is answered with an error (NOACTOR).
def test_a_new_controller_takes_over_procs_and_actors_by_name(tmp_path, persistent_workers):
    ws = persistent_workers(2)
    first = controller(tmp_path, """
        enable_transport("tcp://127.0.0.1:0")
        hosts = attach(WORKERS)
        procs = hosts.spawn_procs(per_host={"gpus": 2}, name="trainers")
        counters = procs.spawn("counter", Counter)
        for _ in range(3):
            counters.incr.call().get(timeout=30)
        print("PIDS", sorted(counters.pid.call().get(timeout=30).values()))
        """, ws)
    assert first.returncode == 0, first.stdout + first.stderr
    pids = [int(p) for p in re.findall(r"\d+", first.stdout.split("PIDS", 1)[1])]
    assert len(pids) == 4
    # The controller detached; the persistent workers kept its procs.
    kept(ws)
    assert alive(pids) == pids

    # The workers are given in the other order: each part says which ranks it holds.
    second = controller(tmp_path, """
        enable_transport("tcp://127.0.0.1:0")
        hosts = attach(list(reversed(WORKERS)))
        procs = hosts.proc_mesh("trainers")
        assert procs.extent == {"hosts": 2, "gpus": 2}, procs.extent
        procs.initialized.get(timeout=30)
        counters = procs.actor_mesh("counter", Counter)
        counters.initialized.get(timeout=30)
        got = counters.incr.call().get(timeout=30)
        print("COUNTS", sorted(got.values()))
        print("PIDS", sorted(counters.pid.call().get(timeout=30).values()))
        one = counters.slice(hosts=1, gpus=0).incr.call_one().get(timeout=30)
        print("ONE", one)

        try:
            hosts.proc_mesh("nothing")
            print("found nothing?!")
        except ValueError as e:
            print("NOMESH", e)
        ghosts = procs.actor_mesh("ghost", Counter)
        try:
            ghosts.initialized.get(timeout=30)
            print("ghost initialized?!")
        except SupervisionError as e:
            print("NOACTOR", e)
        try:
            hosts.spawn_procs(per_host={"gpus": 1}, name="trainers")
            print("spawned a second 'trainers'?!")
        except Exception as e:
            print("TAKEN", e)
        procs.stop().get(timeout=30)
        print("STOPPED")
        """, ws)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out
    assert "COUNTS [4, 4, 4, 4]" in second.stdout, out  # the actors kept their state
    assert sorted(int(p) for p in re.findall(r"\d+", second.stdout.split("PIDS", 1)[1]
                                             .split("\n", 1)[0])) == pids, out
    assert "ONE 5" in second.stdout, out
    assert re.search(r"NOMESH .*keeps no proc mesh named 'nothing' \(it keeps 'trainers'\)",
                     second.stdout), out
    assert re.search(r"NOACTOR .*ghost.*does not exist on this proc", second.stdout), out
    assert re.search(r"TAKEN .*a proc mesh named 'trainers' runs here already", second.stdout), out
    assert "STOPPED" in second.stdout, out
    assert wait_gone(pids) == []


def test_procs_survive_a_controller_that_dies_and_report_to_the_next(tmp_path,
                                                                     persistent_workers):
    ws = persistent_workers(1)
    first = controller(tmp_path, """
        enable_transport("tcp://127.0.0.1:0")
        hosts = attach(WORKERS)
        procs = hosts.spawn_procs(per_host={"gpus": 3}, name="p")
        counters = procs.spawn("counter", Counter)
        counters.incr.call().get(timeout=30)
        print("PIDS", sorted(counters.pid.call().get(timeout=30).values()), flush=True)
        os._exit(0)  # no detach: the worker finds the controller silent
        """, ws)
    assert first.returncode == 0, first.stdout + first.stderr
    pids = [int(p) for p in re.findall(r"\d+", first.stdout.split("PIDS", 1)[1])]
    # The worker found the controller silent (lost-after 1 s) and decided; a plain worker
    # would have killed them.
    kept(ws)
    assert alive(pids) == pids

    # The next controller takes them over; a proc that dies is its SupervisionError now, with
    # the owner told (the fault hook), while the other ranks keep answering.
    second = controller(tmp_path, """
        faults = []
        podium.actor.unhandled_fault_hook = faults.append
        enable_transport("tcp://127.0.0.1:0")
        hosts = attach(WORKERS)
        procs = hosts.proc_mesh("p")
        again = hosts.proc_mesh("p")  # found twice: one mesh, whose exits both handles see
        counters = procs.actor_mesh("counter", Counter)
        counters.initialized.get(timeout=30)
        print("COUNTS", sorted(counters.incr.call().get(timeout=30).values()))
        try:
            counters.slice(gpus=1).die.call_one().get(timeout=30)
        except SupervisionError as e:
            print("DIED", e)
        deadline = time.monotonic() + 10
        while not faults and time.monotonic() < deadline:
            time.sleep(0.05)
        print("FAULTS", len(faults), faults[0] if faults else None)
        print("EXIT", procs._core.exit_status(1), again._core.exit_status(1))
        print("OTHERS", sorted(counters.slice(gpus=slice(0, 3, 2)).incr.call().get(timeout=30)
                                .values()))
        procs.stop().get(timeout=30)
        """, ws)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out
    assert "COUNTS [2, 2, 2]" in second.stdout, out
    assert re.search(r"DIED .*counter.*exited with status 7", second.stdout), out
    assert re.search(r"FAULTS 1 .*exited with status 7", second.stdout), out
    assert "OTHERS [3, 3]" in second.stdout, out
    assert "EXIT exited with status 7 exited with status 7" in second.stdout, out
    assert wait_gone(pids) == []


# ME-4: the found mesh's initialized fails naming the first dead rank and how it ended.
def test_a_proc_that_ended_without_a_controller_is_named_by_the_next(tmp_path,
                                                                   persistent_workers):
    ws = persistent_workers(1)
    first = controller(tmp_path, """
        enable_transport("tcp://127.0.0.1:0")
        hosts = attach(WORKERS)
        procs = hosts.spawn_procs(per_host={"gpus": 2}, name="p")
        counters = procs.spawn("counter", Counter)
        print("PIDS", [counters.slice(gpus=g).pid.call_one().get(timeout=30) for g in (0, 1)])
        """, ws)
    assert first.returncode == 0, first.stdout + first.stderr
    pids = [int(p) for p in re.findall(r"\d+", first.stdout.split("PIDS", 1)[1])]
    os.kill(pids[1], 9)  # while no controller is attached
    assert wait_gone(pids[1:]) == []

    second = controller(tmp_path, """
        podium.actor.unhandled_fault_hook = lambda f: None
        enable_transport("tcp://127.0.0.1:0")
        hosts = attach(WORKERS)
        procs = hosts.proc_mesh("p")
        try:
            procs.initialized.get(timeout=30)
            print("initialized?!")
        except Exception as e:
            print("ENDED", e)
        counters = procs.actor_mesh("counter", Counter)
        print("ZERO", counters.slice(gpus=0).incr.call_one().get(timeout=30))
        try:
            counters.slice(gpus=1).incr.call_one().get(timeout=30)
        except SupervisionError as e:
            print("GONE", e)
        procs.stop().get(timeout=30)
        """, ws)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out
    assert re.search(r"ENDED .*proc rank 1 .*killed by signal SIGKILL.*before this controller "
                     r"attached", second.stdout), out
    assert "ZERO 1" in second.stdout, out
    assert re.search(r"GONE .*SIGKILL", second.stdout), out
    assert wait_gone(pids) == []


def test_a_plain_worker_keeps_nothing_for_the_next_controller(tmp_path, workers):
    ws = workers(1)
    first = run_controller(tmp_path, """
        enable_transport("tcp://127.0.0.1:0")
        hosts = attach_to_workers(workers=WORKERS)
        procs = hosts.spawn_procs(per_host={"gpus": 1}, name="p")
        print("PID", procs.spawn("who", Who).pid.call_one().get(timeout=30))
        """, [w.address for w in ws])
    assert first.returncode == 0, first.stdout + first.stderr
    pid = int(first.stdout.split("PID", 1)[1])
    assert wait_gone([pid]) == []
    second = run_controller(tmp_path, """
        enable_transport("tcp://127.0.0.1:0")
        hosts = attach_to_workers(workers=WORKERS)
        hosts.initialized.get(timeout=30)
        try:
            hosts.proc_mesh("p")
            print("found?!")
        except ValueError as e:
            print("ENDED", e)
        """, [w.address for w in ws])
    assert second.returncode == 0, second.stdout + second.stderr
    # The worker remembers how the mesh ended; it has no live procs to take over.
    assert re.search(r"ENDED .*keeps proc mesh 'p' no more: its 1 procs have all ended "
                     r"\(rank 0 killed by signal SIGKILL", second.stdout), \
        second.stdout + second.stderr
