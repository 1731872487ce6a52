"""Procs that an actor spawns through an attached HostMesh it received pickled are that actor's
(HM-2 in python/podium/_src/proc_mesh.py, ME-15 in cpp/podium/mesh/runtime.h), as Monarch's
spawning actor owns what it spawned: their failures reach its ``__supervise__`` (and fail it
when unhandled), its ProcMesh stops them, stopping its own mesh stops them and their procs,
its proc's death kills them (and whoever holds their mesh learns of it at once), and the
controller's exit leaves none behind. Controllers are scripts of their own (the transport is
per process); workers are real `python -m podium worker` processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import CHILD_TIMEOUT_S, Worker, gone_within, pid_alive

pytestmark = pytest.mark.timeout(150)

PRELUDE = textwrap.dedent("""
    import os, signal, sys, time
    import podium.actor
    from podium.actor import (Actor, MeshFailure, SupervisionError, attach_to_workers,
                              enable_transport, endpoint, this_host)

    FAULTS = []
    podium.actor.unhandled_fault_hook = FAULTS.append
    T = 60

    def poll(fn, what):
        deadline = time.monotonic() + T
        while time.monotonic() < deadline:
            got = fn()
            if got:
                return got
            time.sleep(0.02)
        raise AssertionError(f"no {what} within {T} s")

    class Leaf(Actor):
        @endpoint
        def pid(self):
            return os.getpid()

        @endpoint
        def die(self, code):
            os._exit(code)

    class Spawns(Actor):
        '''Spawns `n` procs on this (worker's) host, with a Leaf each.'''
        def __init__(self, n):
            self.procs = this_host().spawn_procs(per_host={"k": n})
            self.leaves = self.procs.spawn("below", Leaf)

        @endpoint
        def pids(self):
            return [os.getpid()] + sorted(self.leaves.pid.call().get(timeout=T).values())

        @endpoint
        def below(self):
            self.leaves.initialized.get(timeout=T)
            return self.leaves

    class Owner(Actor):
        '''Spawns procs through the attached HostMesh it was given, and actors on them.'''
        def __init__(self, hosts, handle, cls=Leaf, *args):
            self.handle = handle
            self.seen = []
            self.procs = hosts.spawn_procs(per_host={"n": 2})
            self.leaves = self.procs.spawn("leaf", cls, *args)

        def __supervise__(self, failure):
            self.seen.append(failure.report())
            return self.handle

        @endpoint
        def handles(self):
            self.leaves.initialized.get(timeout=T)
            return os.getpid(), self.leaves

        @endpoint
        def leaf_pids(self):
            return sorted(self.leaves.pid.call().get(timeout=T).values())

        @endpoint
        def kill_leaf(self, rank):
            self.leaves.slice(n=rank).die.broadcast(7)

        @endpoint
        def seen_failures(self):
            return list(self.seen)

        @endpoint
        def stop_procs(self):
            '''Stops the procs it spawned (they are its own), then calls them.'''
            pids = [self.procs._core.pid(r) for r in range(2)]
            self.procs.stop().get(timeout=T)
            try:
                self.leaves.pid.call().get(timeout=T)
                after = "no error"
            except SupervisionError as e:
                after = str(e)
            return pids, after

    class DeepOwner(Owner):
        @endpoint
        def tree(self):
            '''Its pid, then those of the procs below it, on every level.'''
            below = self.leaves.pids.call().get(timeout=T).values()
            return [os.getpid()] + [p for sub in below for p in sub]

    enable_transport("tcp://127.0.0.1:0")
    hosts = attach_to_workers(workers=sys.argv[1:])
    hosts.initialized.get(timeout=T)
    """)


def controller(tmp_path: Path, body: str, worker: Worker) -> subprocess.CompletedProcess:
    script = tmp_path / "controller.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script), worker.address], capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S * 2, stdin=subprocess.DEVNULL)


def numbers(out: str, tag: str) -> list[int]:
    m = re.search(rf"^{tag} (.*)$", out, re.M)
    assert m, out
    return [int(x) for x in re.findall(r"\d+", m.group(1))]


def no_process_left(pids: list[int]) -> list[int]:
    """Waits until none of `pids` runs; kills (and returns) those still there at the bound."""
    left = gone_within(pids)
    for p in left:
        if pid_alive(p):
            os.kill(p, signal.SIGKILL)
    return left


@pytest.mark.parametrize("handle", [True, False])
def test_a_failure_of_procs_spawned_through_an_attached_host_reaches_the_actor(tmp_path,
                                                                               handle):
    w = Worker()
    pids = []
    try:
        r = controller(tmp_path, f"""
            pm = this_host().spawn_procs(per_host={{"p": 1}})
            owner = pm.spawn("owner", Owner, hosts, {handle})
            print("PIDS", *owner.leaf_pids.call_one().get(timeout=T), flush=True)
            owner.kill_leaf.call_one(1).get(timeout=T)
            if {handle}:  # handled: the owner saw it and lives on; nothing reached here
                seen = poll(lambda: owner.seen_failures.call_one().get(timeout=T), "__supervise__ call")
                print("SEEN", seen, flush=True)
                print("FAULTS", len(FAULTS), flush=True)
            else:  # unhandled: the owner fails, up to this controller
                f = poll(lambda: FAULTS, "unhandled fault")[0]
                print("FAULT", f.report().replace(chr(10), " "), flush=True)
                try:
                    owner.seen_failures.call_one().get(timeout=T)
                    print("OWNER no error")
                except SupervisionError as e:
                    print("OWNER failed", flush=True)
            pm.stop().get(timeout=T)
            print("STOPPED", flush=True)
            """, w)
        out = r.stdout + r.stderr
        pids = numbers(r.stdout, "PIDS")
        assert r.returncode == 0, out
        assert len(pids) == 2, out
        if handle:
            seen = re.search(r"^SEEN (.*)$", r.stdout, re.M).group(1)
            assert "actor leaf[1] of mesh 'leaf'" in seen and "exited with status 7" in seen, out
            assert "FAULTS 0" in r.stdout, out
        else:
            fault = re.search(r"^FAULT (.*)$", r.stdout, re.M).group(1)
            assert fault.startswith("actor owner[0] of mesh 'owner'"), out
            assert "did not handle the failure of mesh 'leaf' it owns" in fault, out
            assert "exited with status 7" in fault, out
            assert "OWNER failed" in r.stdout, out
        assert "STOPPED" in r.stdout, out
        assert no_process_left(pids) == [], "procs outlived their owner's stop"
    finally:
        w.kill()


def test_the_actor_stops_them_and_stopping_its_mesh_stops_them_recursively(tmp_path):
    w = Worker()
    pids = []
    try:
        r = controller(tmp_path, """
            pm = this_host().spawn_procs(per_host={"p": 1})
            owner = pm.spawn("owner", Owner, hosts, True)
            # Its own ProcMesh stops them (their actors first); calls to them fail after.
            old, after = owner.stop_procs.call_one().get(timeout=T)
            print("OLD", *old, flush=True)
            print("AFTER", after.replace(chr(10), " "), flush=True)
            # Stopping the owner's mesh stops the procs it spawned on the worker, and the
            # procs those spawned on the worker's host (ME-14), recursively.
            deep = pm.spawn("deep", DeepOwner, hosts, True, Spawns, 2)
            print("TREE", *deep.tree.call_one().get(timeout=T), flush=True)
            pm.stop().get(timeout=T)
            print("STOPPED", flush=True)
            print("FAULTS", len(FAULTS), flush=True)
            """, w)
        out = r.stdout + r.stderr
        old, tree = numbers(r.stdout, "OLD"), numbers(r.stdout, "TREE")
        pids = old + tree
        assert r.returncode == 0, out
        assert len(old) == 2 and len(tree) == 1 + 2 + 2 * 2, out
        after = re.search(r"^AFTER (.*)$", r.stdout, re.M).group(1)
        assert after != "no error" and "leaf" in after, out
        assert "STOPPED" in r.stdout and "FAULTS 0" in r.stdout, out
        assert no_process_left(pids) == [], "the stop left procs of the attached host behind"
    finally:
        w.kill()


def test_the_actors_proc_killed_kills_them_and_their_holders_know_at_once(tmp_path):
    # ME-15: the controller holds the mesh of the procs the owner spawned on the worker (the
    # owner handed it back); the owner's proc is SIGKILLed: the controller kills them, and
    # calls to them fail at once naming the proc that spawned them.
    w = Worker()
    pids = []
    try:
        r = controller(tmp_path, """
            pm = this_host().spawn_procs(per_host={"p": 1})
            owner = pm.spawn("owner", Owner, hosts, True)
            owner_pid, leaves = owner.handles.call_one().get(timeout=T)
            print("PIDS", *sorted(leaves.pid.call().get(timeout=T).values()), flush=True)
            print("OWNER", owner_pid, flush=True)
            os.kill(owner_pid, signal.SIGKILL)

            def failed():  # each call bounded well below the 30 s delivery timeout
                try:
                    leaves.pid.call().get(timeout=10)
                except SupervisionError as e:
                    return str(e).replace(chr(10), " ")

            print("CALL", poll(failed, "failed call"), flush=True)
            f = poll(lambda: FAULTS, "fault of the owner")[0]
            print("FAULT", f.mesh_name, flush=True)
            """, w)
        out = r.stdout + r.stderr
        pids = numbers(r.stdout, "PIDS")
        assert r.returncode == 0, out
        owner_pid = numbers(r.stdout, "OWNER")[0]
        call = re.search(r"^CALL (.*)$", r.stdout, re.M).group(1)
        assert "actor leaf[" in call and "of mesh 'leaf'" in call, out
        assert f"ended with the proc that spawned it (pid {owner_pid}, " in call, out
        assert "which was killed by signal SIGKILL (9)" in call, out
        assert "FAULT owner" in r.stdout, out
        assert no_process_left(pids) == [], "procs outlived the proc they were spawned for"
    finally:
        w.kill()


def test_a_killed_proc_on_an_attached_host_ends_its_own_procs_for_their_holders(tmp_path):
    # ME-15 on a worker's host: a proc there spawned procs of its own (ME-14) and is killed;
    # the worker reports its end, and the controller, which holds its procs' mesh, counts
    # them as ended at once.
    w = Worker()
    pids = []
    try:
        r = controller(tmp_path, """
            procs = hosts.spawn_procs(per_host={"m": 1})
            mid = procs.spawn("mid", Spawns, 2)
            tree = mid.pids.call_one().get(timeout=T)
            below = mid.below.call_one().get(timeout=T)
            print("TREE", *tree, flush=True)
            os.kill(tree[0], signal.SIGKILL)

            def failed():  # each call bounded well below the 30 s delivery timeout
                try:
                    below.pid.call().get(timeout=10)
                except SupervisionError as e:
                    return str(e).replace(chr(10), " ")

            print("CALL", poll(failed, "failed call"), flush=True)
            """, w)
        out = r.stdout + r.stderr
        pids = numbers(r.stdout, "TREE")
        assert r.returncode == 0, out
        call = re.search(r"^CALL (.*)$", r.stdout, re.M).group(1)
        assert "of mesh 'below'" in call, out
        assert f"ended with the proc that spawned it (pid {pids[0]}, tcp:" in call, out
        assert "which was killed by signal SIGKILL (9)" in call, out
        assert no_process_left(pids) == [], "procs outlived the proc that spawned them"
    finally:
        w.kill()


@pytest.mark.parametrize("end", ["exit", "sigkill"])
def test_the_controllers_end_leaves_none_of_them_behind(tmp_path, end):
    w = Worker()
    pids = []
    script = tmp_path / "controller.py"
    script.write_text(PRELUDE + textwrap.dedent("""
        pm = this_host().spawn_procs(per_host={"p": 1})
        deep = pm.spawn("deep", DeepOwner, hosts, True, Spawns, 2)
        print("TREE", *deep.tree.call_one().get(timeout=T), flush=True)
        if os.environ["END"] == "sigkill":
            time.sleep(120)
        """))
    p = subprocess.Popen([sys.executable, str(script), w.address], cwd=tmp_path,
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                         env={**os.environ, "END": end})
    try:
        line = p.stdout.readline()
        assert line.startswith("TREE"), line
        pids = [int(x) for x in line.split()[1:]]
        assert len(pids) == 1 + 2 + 2 * 2 and all(pid_alive(x) for x in pids)
        if end == "sigkill":
            p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=CHILD_TIMEOUT_S) in (0, -signal.SIGKILL)
        assert no_process_left(pids) == [], "procs outlived their controller"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=CHILD_TIMEOUT_S)
        no_process_left(pids)
        w.kill()
