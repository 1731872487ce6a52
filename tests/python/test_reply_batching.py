"""An actor answering calls that are already queued may let a reply share a write with the
next ones (channel CH-7), but never holds it behind a slow call: a fast reply arrives while
the slow call queued after it still runs."""

from __future__ import annotations

import time

from podium.actor import Actor, endpoint

T = 20


class Worker(Actor):
    @endpoint
    def fast(self, i: int) -> int:
        return i

    @endpoint
    def slow(self, seconds: float) -> str:
        time.sleep(seconds)
        return "slow done"


def test_a_reply_is_not_held_behind_a_slow_call_queued_after_it(spawn):
    mesh = spawn(Worker).slice(gpus=0)
    assert mesh.fast.call_one(0).get(timeout=T) == 0
    for _ in range(2):
        quick = [mesh.fast.call_one(i) for i in range(8)]  # queued together ...
        slow = mesh.slow.call_one(2.0)  # ... with a slow call behind them
        t0 = time.monotonic()
        assert [f.get(timeout=T) for f in quick] == list(range(8))
        assert time.monotonic() - t0 < 1.0  # not 2 s: the last fast reply was not held
        assert slow.get(timeout=T) == "slow done"


def test_a_pipelined_burst_answers_every_call_in_order(spawn):
    mesh = spawn(Worker).slice(gpus=0)
    futures = [mesh.fast.call_one(i) for i in range(5000)]
    assert [f.get(timeout=T) for f in futures] == list(range(5000))
