"""mesh ME-11: a dead proc's records are dropped after a grace period only once nothing
addresses it, so a handle kept past the grace still fails at once with the proc's exact end.
Each controller is a script of its own, with a short PODIUM_DEAD_RECORD_GRACE_MS."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from conftest import CHILD_TIMEOUT_S

CONTROLLER = """
import os, signal, time
import podium.actor
from podium.actor import Actor, endpoint, this_host

podium.actor.unhandled_fault_hook = lambda failure: None  # the kill below is expected

class P(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

def fails_at_once(mesh, what):
    t = time.monotonic()
    try:
        mesh.pid.call().get(timeout=20)
    except Exception as e:
        took = time.monotonic() - t
        assert took < 2.0, (what, took)
        assert "SIGKILL" in str(e), (what, str(e))
        return
    raise AssertionError(what + ": the call to a dead proc succeeded")
"""


def run(body: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CONTROLLER + textwrap.dedent(body)], capture_output=True,
        text=True, timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL,
        env={**os.environ, "PODIUM_DEAD_RECORD_GRACE_MS": "100"})


def test_a_handle_kept_past_the_grace_still_fails_with_the_procs_end():  # ME-11
    r = run("""
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        mesh = procs.spawn("p", P)
        pids = sorted(mesh.pid.call().get(timeout=30).values())
        os.kill(pids[0], signal.SIGKILL)
        fails_at_once(mesh, "at once")
        time.sleep(1.0)  # ten grace periods: the handle keeps the record
        fails_at_once(mesh, "after the grace")
        # Another mesh spawned and stopped meanwhile leaves (its records go), this one stays.
        other = this_host().spawn_procs(per_host={"gpus": 1})
        other.spawn("q", P).pid.call().get(timeout=30)
        other.stop().get(timeout=30)
        del other
        time.sleep(1.0)
        fails_at_once(mesh, "after other meshes' records went")
        procs.stop().get(timeout=30)
        print("OK")
        """)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_a_mesh_handed_to_an_actor_keeps_the_record_in_its_proc():  # ME-11 (views)
    r = run("""
        class Holder(Actor):
            @endpoint
            def keep(self, mesh):
                self.mesh = mesh

            @endpoint
            def call_kept(self):
                t = time.monotonic()
                try:
                    self.mesh.pid.call().get(timeout=20)
                except Exception as e:
                    return time.monotonic() - t, str(e)
                return None, "the call succeeded"

        procs = this_host().spawn_procs(per_host={"gpus": 2})
        mesh = procs.spawn("p", P)
        pids = sorted(mesh.pid.call().get(timeout=30).values())
        holder_procs = this_host().spawn_procs(per_host={"gpus": 1})
        holder = holder_procs.spawn("h", Holder)
        holder.keep.call_one(mesh).get(timeout=30)
        os.kill(pids[0], signal.SIGKILL)
        fails_at_once(mesh, "here")
        time.sleep(1.0)  # ten grace periods in the holder's proc too
        took, why = holder.call_kept.call_one().get(timeout=30)
        assert took is not None and took < 2.0 and "SIGKILL" in why, (took, why)
        holder_procs.stop().get(timeout=30)
        procs.stop().get(timeout=30)
        print("OK")
        """)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
