"""Errors: ActorError from endpoints, failed actors, stopped meshes, dead procs (API.md
"Errors and supervision", the single-host parts this slice covers)."""

from __future__ import annotations

import os
import time

import pytest

from podium.actor import Actor, ActorError, SupervisionError, endpoint

T = 10


class Boom(Exception):
    def __init__(self, what, code):
        super().__init__(what, code)
        self.what = what
        self.code = code


class Flaky(Actor):
    def __init__(self, fail_init: bool = False, cleanup_dir: str = ""):
        if fail_init:
            raise RuntimeError("constructor says no")
        self.calls = 0
        self.cleanup_dir = cleanup_dir

    @endpoint
    def boom(self, what):
        self.calls += 1
        raise Boom(what, 7)

    @endpoint
    def ok(self):
        self.calls += 1
        return self.calls

    @endpoint
    def unpicklable_error(self):
        import threading

        e = ValueError("carries a lock")
        e.lock = threading.Lock()
        raise e

    @endpoint
    def base_exception(self):
        raise SystemExit(3)

    @endpoint
    def exit_process(self, code):
        os._exit(code)

    @endpoint
    def bad_result(self):
        import threading

        return threading.Lock()

    def __cleanup__(self):
        if self.cleanup_dir:
            with open(os.path.join(self.cleanup_dir, f"{os.getpid()}-{self.calls}"), "w"):
                pass


def test_actor_error_carries_the_exception_and_remote_traceback(spawn):
    one = spawn(Flaky).slice(gpus=1)
    with pytest.raises(ActorError) as info:
        one.boom.call_one("bad input").get(timeout=T)
    err = info.value
    assert isinstance(err.exception, Boom)
    assert err.exception.what == "bad input" and err.exception.code == 7
    text = str(err)
    assert "Traceback of where the remote call failed" in text
    assert "raise Boom(what, 7)" in text  # the remote source line
    assert "boom" in text and "rank" in text
    # The actor lives on, with its state.
    assert one.ok.call_one().get(timeout=T) == 2


def test_call_raises_actor_error_if_any_rank_raised(spawn):
    mesh = spawn(Flaky)
    f = mesh.boom.call("x")
    assert isinstance(f.exception(timeout=T), ActorError)
    with pytest.raises(ActorError):
        f.get(timeout=T)
    assert mesh.ok.call().get(timeout=T).values() == [2, 2]


def test_an_exception_that_cannot_be_pickled_still_reaches_the_caller(spawn):
    one = spawn(Flaky).slice(gpus=0)
    with pytest.raises(ActorError, match="carries a lock"):
        one.unpicklable_error.call_one().get(timeout=T)
    with pytest.raises(ActorError, match="cannot be pickled"):
        one.bad_result.call_one().get(timeout=T)
    assert one.ok.call_one().get(timeout=T) == 1


def test_an_exception_in_a_broadcast_fails_the_actor(spawn):
    mesh = spawn(Flaky)
    mesh.slice(gpus=0).boom.broadcast("nobody listens")
    with pytest.raises(SupervisionError, match="boom"):
        mesh.slice(gpus=0).ok.call_one().get(timeout=T)
    with pytest.raises(SupervisionError):  # and it stays failed
        mesh.slice(gpus=0).ok.call_one().get(timeout=T)
    assert mesh.slice(gpus=1).ok.call_one().get(timeout=T) == 1  # the other rank is fine


def test_a_base_exception_fails_the_actor(spawn):
    one = spawn(Flaky).slice(gpus=0)
    with pytest.raises(SupervisionError, match="SystemExit"):
        one.base_exception.call_one().get(timeout=T)
    with pytest.raises(SupervisionError):
        one.ok.call_one().get(timeout=T)


def test_an_exception_in_init_fails_initialized_and_calls(spawn):
    mesh = spawn(Flaky, fail_init=True)
    with pytest.raises(SupervisionError, match="constructor says no"):
        mesh.initialized.get(timeout=T)
    with pytest.raises(SupervisionError):
        mesh.ok.call().get(timeout=T)


def test_stop_runs_cleanup_after_queued_calls_and_later_calls_fail(spawn, tmp_path):
    mesh = spawn(Flaky, cleanup_dir=str(tmp_path))
    assert mesh.ok.call().get(timeout=T).values() == [1, 1]
    mesh.ok.broadcast()  # queued before the stop: runs before __cleanup__
    assert mesh.stop().get(timeout=T) is None
    with pytest.raises(SupervisionError, match="stopped"):
        mesh.ok.call().get(timeout=T)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and all(n.endswith("-2") for n in names)


def test_a_proc_that_exits_fails_its_calls_at_once(new_procs):
    pm = new_procs(gpus=2)
    mesh = pm.spawn("flaky", Flaky)
    mesh.initialized.get(timeout=T)
    t0 = time.monotonic()
    with pytest.raises(SupervisionError, match="exited with status 3"):
        mesh.slice(gpus=1).exit_process.call_one(3).get(timeout=T)
    assert time.monotonic() - t0 < 2.0
    assert mesh.slice(gpus=0).ok.call_one().get(timeout=T) == 1  # the other proc lives
