"""Recovery: a training-style loop that loses a worker, replaces it, and continues.

Each worker runs in a proc of its own, so losing one costs one proc. At step 3 the loop kills
a worker's proc (SIGKILL, as an OOM kill would); the step's call to it raises
SupervisionError within milliseconds, naming the actor, rank, host, pid and signal. The loop
stops what is left of that proc mesh, spawns a fresh proc and actor in its place, and runs
the step again.

The failure also reaches this controller's podium.actor.unhandled_fault_hook, whose default
would end the program with status 1; this program recovers on its own, so it replaces the
hook with one that only records the failure.

    python examples/recovery.py
"""

from __future__ import annotations

import os
import signal
from typing import List, Tuple

import podium.actor
from podium.actor import Actor, MeshFailure, ProcMesh, SupervisionError, endpoint, this_host

STEPS = 8
WORKERS = 2
LOSE_AT_STEP = 3
WAIT_S = 30  # bound on every wait

lost: List[MeshFailure] = []


def record_failure(failure: MeshFailure) -> None:
    """The loop below replaces lost workers: the failure is handled, not fatal."""
    lost.append(failure)


podium.actor.unhandled_fault_hook = record_failure


class Worker(Actor):
    @endpoint
    def step(self, i: int) -> Tuple[int, int]:
        return os.getpid(), i * i


def start_worker(n: int) -> Tuple[ProcMesh, "podium.actor.ActorMesh[Worker]"]:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    return procs, procs.spawn(f"worker{n}", Worker)


def main() -> None:
    workers = [start_worker(n) for n in range(WORKERS)]
    spawned, replaced, step = WORKERS, 0, 0
    while step < STEPS:
        if step == LOSE_AT_STEP and replaced == 0:  # the fault
            pid, _ = workers[1][1].step.call_one(0).get(timeout=WAIT_S)
            os.kill(pid, signal.SIGKILL)
        futures = [mesh.step.call_one(step) for _, mesh in workers]
        failed = []
        results = []
        for n, f in enumerate(futures):
            try:
                results.append(f.get(timeout=WAIT_S))
            except SupervisionError as e:
                print(f"step {step}: lost worker {n}: {e}")
                failed.append(n)
        for n in failed:
            old_procs, _ = workers[n]
            old_procs.stop().get(timeout=WAIT_S)  # reaps whatever is left of it
            workers[n] = start_worker(spawned)
            spawned += 1
            replaced += 1
            pid, _ = workers[n][1].step.call_one(0).get(timeout=WAIT_S)
            print(f"step {step}: replaced it with worker{spawned - 1} (pid {pid})")
        if failed:
            continue  # run the step again on the full set
        print(f"step {step}: {[v for _, v in results]}")
        step += 1
    for procs, _ in workers:
        procs.stop().get(timeout=WAIT_S)
    for f in lost:
        print(f"supervision saw: {f.report()}")
    print(f"done: {STEPS} steps, {replaced} worker replaced")


if __name__ == "__main__":
    main()
