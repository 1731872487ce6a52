"""podium quickstart: processes, an actor mesh, and every way to call it.

Run it with `make demo` (or `python3 examples/quickstart.py`). The same program runs on
PyTorch Monarch by changing the import below to `from monarch.actor import ...`.
"""

import os
import time

import operator

from podium.actor import Accumulator, Actor, ActorError, current_rank, endpoint, this_host


class Counter(Actor):
    """One counter per process; every endpoint runs in the actor's own process."""

    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.value += by
        return self.value

    @endpoint
    def whoami(self) -> str:
        return f"{current_rank()} in pid {os.getpid()}"

    @endpoint
    def slow(self, seconds: float) -> str:
        time.sleep(seconds)
        return f"rank {current_rank().rank} slept {seconds}s"

    @endpoint
    def nap(self, seconds_per_rank: list) -> str:
        rank = current_rank().rank
        time.sleep(seconds_per_rank[rank])
        return f"rank {rank} napped {seconds_per_rank[rank]}s"

    @endpoint
    def divide(self, x: int) -> float:
        return 1 / x

    @endpoint
    def say(self, text: str) -> None:
        print(f"{text} from pid {os.getpid()}", flush=True)


def main() -> None:
    t0 = time.monotonic()
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    counters = procs.spawn("counter", Counter, 0)
    counters.initialized.get(timeout=30)
    print(f"spawned {len(procs)} processes and a mesh of {len(counters)} actors "
          f"{counters.extent} in {time.monotonic() - t0:.2f}s (controller pid {os.getpid()})")

    print("\ncall: every actor runs incr(1); the result is a ValueMesh in rank order")
    for point, value in counters.incr.call(1).get(timeout=10).items():
        print(f"  {point} -> {value}")

    print("\nslice: gpus=slice(1, 3) keeps actors 1 and 2")
    middle = counters.slice(gpus=slice(1, 3))
    print(f"  {middle.extent}: {list(middle.whoami.call().get(timeout=10).values())}")

    print("\ncall_one on the single actor gpus=3")
    print(f"  incr(10) -> {counters.slice(gpus=3).incr.call_one(10).get(timeout=10)}")

    print("\nchoose: while rank 0 is busy, the least-loaded actor answers")
    busy = counters.slice(gpus=0).slow.call_one(0.5)
    print(f"  {counters.whoami.choose().get(timeout=10)}")
    busy.get(timeout=10)

    print("\nstream: one future per actor, in the order the replies arrive")
    for fut in counters.nap.stream([0.3, 0.2, 0.1, 0.0]):
        print(f"  {fut.get(timeout=10)}")

    print("\nbroadcast: fire and forget (what actors print reaches this terminal, prefixed "
          "with the actor's name and rank)")
    counters.say.broadcast("hello")
    print(f"  values after the broadcast: {list(counters.incr.call(0).get(timeout=10).values())}")

    print("\nAccumulator: fold every actor's reply")
    total = Accumulator(counters.incr, 0, operator.add).accumulate(0).get(timeout=10)
    print(f"  sum of the counters: {total}")

    print("\na remote exception is caught here, and the actor lives on")
    try:
        counters.slice(gpus=2).divide.call_one(0).get(timeout=10)
    except ActorError as e:
        print(f"  caught ActorError wrapping {type(e.exception).__name__}: {e.exception}")
    print(f"  the actor still answers: divide(4) -> "
          f"{counters.slice(gpus=2).divide.call_one(4).get(timeout=10)}")

    procs.stop().get(timeout=30)
    print(f"\ndone in {time.monotonic() - t0:.2f}s")


if __name__ == "__main__":
    main()
