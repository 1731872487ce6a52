"""Spawning from inside an actor (issue 18, part 1; ME-14 and BT-3 in cpp/podium/mesh/):
``this_host().spawn_procs(...)`` and ``ProcMesh.spawn`` in an actor's ``__init__`` and
endpoints, as Monarch allows. The spawning actor owns what it spawned: failures reach its
``__supervise__``, and stopping its mesh (or killing the controller) ends every level."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import CHILD_TIMEOUT_S, Worker, gone_within, pid_alive
from podium.actor import Actor, MeshFailure, SupervisionError, endpoint, this_host

T = 30  # bound on each wait
# Bound on learning that procs ended with the proc above them (ME-15): well below the 30 s
# after which an undelivered message fails on its own, so passing it shows the end was told.
ORPHAN_T = 10

pytestmark = pytest.mark.timeout(120)


def _alive(pid: int) -> bool:
    return pid_alive(pid)


def _wait_gone(pids, timeout: float = 10.0) -> list:
    """Polls until none of `pids` runs, for up to `timeout`; returns those still running."""
    return gone_within(list(pids), timeout)


def _socket_dirs_of(pid: int) -> list:
    """The socket directories (ME-14) that the process `pid` made."""
    bases = {"/tmp"}
    if os.environ.get("XDG_RUNTIME_DIR"):
        bases.add(os.environ["XDG_RUNTIME_DIR"])
    return [d for b in bases for d in glob.glob(f"{b}/podium-{os.getuid()}/{pid}-*")]


class Leaf(Actor):
    def __init__(self, tag: str = "") -> None:
        self.tag = tag

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def echo(self, x):
        return (self.tag, x)

    @endpoint
    def die(self, code: int) -> None:
        os._exit(code)

    @endpoint
    def boom(self) -> None:
        raise RuntimeError("leaf boom")

    @endpoint
    def nap(self, seconds: float) -> None:
        time.sleep(seconds)


class SpawnsInInit(Actor):
    """Spawns its own procs and actors in __init__ (ME-14)."""

    def __init__(self, n: int) -> None:
        self.procs = this_host().spawn_procs(per_host={"leaves": n})
        self.leaves = self.procs.spawn("leaf", Leaf, "init")

    @endpoint
    def pids(self) -> tuple:
        return os.getpid(), sorted(self.leaves.pid.call().get(timeout=T).values())

    @endpoint
    def echo_all(self, x) -> list:
        return list(self.leaves.echo.call(x).get(timeout=T).values())

    @endpoint
    def socket_dirs(self) -> list:
        return _socket_dirs_of(os.getpid())

    @endpoint
    def replace_leaves(self) -> tuple:
        """Stops the procs it spawned (it owns them) and spawns new ones."""
        old = sorted(self.leaves.pid.call().get(timeout=T).values())
        self.procs.stop().get(timeout=T)
        try:
            self.leaves.pid.call().get(timeout=T)
            stopped = "no error"
        except SupervisionError as e:
            stopped = str(e)
        self.procs = this_host().spawn_procs(per_host={"leaves": 1})
        self.leaves = self.procs.spawn("leaf2", Leaf, "again")
        return old, sorted(self.leaves.pid.call().get(timeout=T).values()), stopped


class Environment(Actor):
    @endpoint
    def podium_vars(self) -> tuple:
        child = subprocess.run(
            [sys.executable, "-c",
             "import os; print(sorted(k for k in os.environ if k.startswith('PODIUM_')))"],
            env={**os.environ}, capture_output=True, text=True, timeout=T)
        return sorted(k for k in os.environ if k.startswith("PODIUM_")), child.stdout.strip()


def test_the_boot_and_spawn_variables_stay_out_of_actors_and_their_programs():  # BT-1, BT-3
    pm = this_host().spawn_procs(per_host={"p": 1})  # BT-5
    try:
        mine, childs = pm.spawn("env", Environment).podium_vars.call_one().get(timeout=T)
    finally:
        pm.stop().get(timeout=T)
    for seen in (mine, childs):
        for var in ("PODIUM_BOOT", "PODIUM_SPAWN", "PODIUM_LINEAGE"):
            assert var not in seen, seen


class SpawnsInSyncEndpoint(Actor):
    @endpoint
    def spawn_leaves(self, n: int) -> list:
        procs = this_host().spawn_procs(per_host={"leaves": n})
        self.leaves = procs.spawn("sync_leaf", Leaf, "sync")
        return list(self.leaves.echo.call(1).get(timeout=T).values())

    @endpoint
    def get_leaves(self):
        return self.leaves


class SpawnsInAsyncEndpoint(Actor):
    @endpoint
    async def spawn_leaves(self, n: int) -> list:
        procs = this_host().spawn_procs(per_host={"leaves": n})
        self.leaves = procs.spawn("async_leaf", Leaf, "async")
        await self.leaves.initialized
        return list((await self.leaves.echo.call(1)).values())

    @endpoint
    async def get_leaves(self):
        return self.leaves


def test_spawn_procs_and_spawn_inside_init_then_call_the_grandchildren():  # ME-14, BT-3
    pm = this_host().spawn_procs(per_host={"mid": 1})
    try:
        mid = pm.spawn("mid", SpawnsInInit, 2)
        mid.initialized.get(timeout=T)
        mid_pid, leaf_pids = mid.pids.call_one().get(timeout=T)
        assert len(set(leaf_pids)) == 2 and mid_pid not in leaf_pids
        assert os.getpid() not in leaf_pids
        assert all(_alive(p) for p in leaf_pids)
        assert mid.echo_all.call_one(7).get(timeout=T) == [("init", 7), ("init", 7)]
        # The mid proc made its own socket directory for its procs (this job is on Unix
        # sockets), and removes it when it stops.
        dirs = mid.socket_dirs.call_one().get(timeout=T)
        assert len(dirs) == 1
    finally:
        pm.stop().get(timeout=T)
    assert _wait_gone(leaf_pids) == []
    assert _socket_dirs_of(mid_pid) == []


def test_an_actor_stops_the_procs_it_spawned_and_spawns_again():  # ME-14
    pm = this_host().spawn_procs(per_host={"mid": 1})
    try:
        mid = pm.spawn("mid", SpawnsInInit, 2)
        old, new, stopped = mid.replace_leaves.call_one().get(timeout=T)
        assert len(old) == 2 and len(new) == 1 and not set(old) & set(new)
        assert stopped != "no error"
        assert _wait_gone(old) == []
        assert all(_alive(p) for p in new)
        assert mid.echo_all.call_one(1).get(timeout=T) == [("again", 1)]
    finally:
        pm.stop().get(timeout=T)
    assert _wait_gone(new) == []


@pytest.mark.parametrize("Class,tag", [(SpawnsInSyncEndpoint, "sync"),
                                       (SpawnsInAsyncEndpoint, "async")])
def test_spawn_inside_sync_and_async_endpoints(Class, tag):  # ME-14
    pm = this_host().spawn_procs(per_host={"mid": 1})
    try:
        mid = pm.spawn("mid", Class)
        assert mid.spawn_leaves.call_one(2).get(timeout=T) == [(tag, 1), (tag, 1)]
        # A grandchild mesh handed back to the controller can be called from here too.
        leaves = mid.get_leaves.call_one().get(timeout=T)
        assert list(leaves.echo.call(3).get(timeout=T).values()) == [(tag, 3), (tag, 3)]
    finally:
        pm.stop().get(timeout=T)


class NestedOwner(Actor):
    """Owns the leaves it spawns on procs it spawned; `handle` is what __supervise__ returns."""

    def __init__(self, handle: bool) -> None:
        self.handle = handle
        self.seen = []
        self.procs = this_host().spawn_procs(per_host={"leaves": 2})
        self.leaves = self.procs.spawn("leaf", Leaf)

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append((failure.mesh_name, failure.rank, failure.kind, failure.exit_code,
                          str(failure.cause)))
        return self.handle

    @endpoint
    def fail_leaf(self, how: str) -> None:
        self.leaves.initialized.get(timeout=T)
        if how == "die":
            self.leaves.slice(leaves=1).die.broadcast(9)
        else:
            self.leaves.slice(leaves=1).boom.broadcast()

    @endpoint
    def seen_failures(self) -> list:
        return list(self.seen)

    @endpoint
    def call_leaf(self, rank: int):
        try:
            return self.leaves.slice(leaves=rank).echo.call_one(rank).get(timeout=T)
        except SupervisionError as e:
            return f"SupervisionError: {e}"


@pytest.mark.parametrize("how", ["die", "boom"])
def test_a_grandchild_failure_reaches_the_spawning_actors_supervise(how, faults):  # ME-14
    pm = this_host().spawn_procs(per_host={"owner": 1})
    try:
        owner = pm.spawn("owner", NestedOwner, True)
        owner.fail_leaf.call_one(how).get(timeout=T)
        deadline = time.monotonic() + T
        seen = []
        while not seen and time.monotonic() < deadline:
            seen = owner.seen_failures.call_one().get(timeout=T)
            time.sleep(0.02)
        assert len(seen) == 1, seen
        mesh_name, rank, kind, exit_code, cause = seen[0]
        assert (mesh_name, rank) == ("leaf", 1)
        if how == "die":
            assert (kind, exit_code) == ("proc", 9)
        else:
            assert kind == "actor" and "leaf boom" in cause
        # Handled: the owner lives on, its other leaf too, and nothing reached this controller.
        assert owner.call_leaf.call_one(0).get(timeout=T) == ("", 0)
        assert faults() == []
    finally:
        pm.stop().get(timeout=T)


def test_an_unhandled_grandchild_failure_fails_the_owner_up_to_the_controller(faults):
    pm = this_host().spawn_procs(per_host={"owner": 1})
    try:
        owner = pm.spawn("owner", NestedOwner, False)
        owner.fail_leaf.call_one("die").get(timeout=T)
        got = faults.wait(1, timeout=T)
        assert len(got) == 1, got
        report = got[0].report()
        assert report.startswith("actor owner[0] of mesh 'owner'")
        assert "did not handle the failure of mesh 'leaf' it owns" in report
        assert "actor leaf[1] of mesh 'leaf'" in report and "exited with status 9" in report
        with pytest.raises(SupervisionError):
            owner.seen_failures.call_one().get(timeout=T)
    finally:
        pm.stop().get(timeout=T)


class HandsOutLeaves(NestedOwner):
    @endpoint
    def get_leaves(self):
        self.leaves.initialized.get(timeout=T)
        return self.leaves


def test_a_grandchild_end_reaches_a_controller_that_holds_its_mesh(faults):  # ME-14, ME-7
    pm = this_host().spawn_procs(per_host={"owner": 1})
    try:
        owner = pm.spawn("owner", HandsOutLeaves, True)
        leaves = owner.get_leaves.call_one().get(timeout=T)
        victim = leaves.slice(leaves=1).pid.call_one().get(timeout=T)
        assert leaves.slice(leaves=1).echo.call_one("here").get(timeout=T) == ("", "here")
        os.kill(victim, signal.SIGKILL)
        # The owner's proc saw its proc end and told its own spawner (this controller): calls
        # from here fail naming the end, not wait on a dead socket.
        deadline = time.monotonic() + T
        err = None
        while err is None and time.monotonic() < deadline:
            try:
                leaves.slice(leaves=1).echo.call_one(0).get(timeout=T)
                time.sleep(0.02)
            except SupervisionError as e:
                err = e
        assert err is not None and "killed by signal SIGKILL" in str(err), err
        assert leaves.slice(leaves=0).echo.call_one(0).get(timeout=T) == ("", 0)
        assert faults() == []  # the owner handled it; this controller owns nothing there
    finally:
        pm.stop().get(timeout=T)


class HandsOutAll(HandsOutLeaves):
    @endpoint
    def handles(self) -> tuple:
        self.leaves.initialized.get(timeout=T)
        return os.getpid(), self.procs, self.leaves


def _faults_of(faults, names: set) -> dict:
    """Polls until this controller's fault hook got a failure for each mesh of `names`."""
    deadline = time.monotonic() + T
    while True:
        got = {f.mesh_name: f for f in faults()}
        if names <= set(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def test_a_killed_middle_procs_children_end_with_it_and_every_holder_knows_at_once(faults):
    # ME-15: the controller holds the grandchildren's meshes (handed back pickled) and has
    # actors of its own on them; the middle proc is SIGKILLed, so nobody is left to report
    # the grandchildren. They die with it, and this controller learns of it from the middle
    # proc's end: the call in flight, later calls and its own actors' owner all hear at once.
    pm = this_host().spawn_procs(per_host={"owner": 1})
    leaf_pids = []
    try:
        owner = pm.spawn("owner", HandsOutAll, True)
        mid_pid, procs, leaves = owner.handles.call_one().get(timeout=T)
        leaf_pids = sorted(leaves.pid.call().get(timeout=T).values())
        mine = procs.spawn("mine", Leaf, "mine")
        assert list(mine.echo.call(1).get(timeout=T).values()) == [("mine", 1)] * 2
        napping = leaves.slice(leaves=0).nap.call_one(120)  # in flight when the end comes
        os.kill(mid_pid, signal.SIGKILL)
        assert _wait_gone(leaf_pids) == [], "the grandchildren outlived their spawner"
        with pytest.raises(SupervisionError) as info:
            napping.get(timeout=ORPHAN_T)
        msg = str(info.value)
        assert "actor leaf[0] of mesh 'leaf'" in msg and f"pid {leaf_pids[0]}" in msg, msg
        assert "host " in msg, msg
        assert f"ended with the proc that spawned it (pid {mid_pid}, " in msg, msg
        assert "which was killed by signal SIGKILL (9)" in msg, msg
        with pytest.raises(SupervisionError, match="ended with the proc that spawned it"):
            leaves.slice(leaves=1).echo.call_one(0).get(timeout=ORPHAN_T)
        with pytest.raises(SupervisionError, match="ended with the proc that spawned it"):
            mine.echo.call(2).get(timeout=ORPHAN_T)
        got = _faults_of(faults, {"owner", "mine"})
        assert {"owner", "mine"} <= set(got), got
        assert "ended with the proc that spawned it" in got["mine"].report()
    finally:
        pm.stop().get(timeout=T)
        for p in leaf_pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


class Level(Actor):
    """One level of a tree of procs: spawns `depth` more levels below itself."""

    def __init__(self, depth: int) -> None:
        self.below = None
        if depth > 0:
            self.procs = this_host().spawn_procs(per_host={"n": 2})
            self.below = self.procs.spawn(f"level{depth - 1}", Level, depth - 1)

    @endpoint
    def pids(self) -> list:
        mine = [os.getpid()]
        if self.below is not None:
            for sub in self.below.pids.call().get(timeout=T).values():
                mine.extend(sub)
        return mine

    @endpoint
    def bottom(self):
        """The actors of the lowest level under this one's first branch (None at the lowest)."""
        if self.below is None:
            return None
        below = self.below.slice(n=0).bottom.call_one().get(timeout=T)
        return self.below if below is None else below


def test_a_holder_of_deeper_procs_knows_at_once_when_a_proc_above_them_is_killed(faults):
    # ME-15, BT-5: this controller holds only the lowest level (great-grandchildren); the top
    # proc is SIGKILLed, and every level under it dies. Nobody reports the levels between,
    # but the lowest level's state names every proc it descends from.
    pm = this_host().spawn_procs(per_host={"top": 1})
    pids = []
    try:
        top = pm.spawn("top", Level, 2)
        pids = top.pids.call_one().get(timeout=T)
        bottom = top.bottom.call_one().get(timeout=T)
        assert len(bottom.pids.call().get(timeout=T)) == 2
        os.kill(pids[0], signal.SIGKILL)
        assert _wait_gone(pids) == [], "procs outlived the proc above them"
        with pytest.raises(SupervisionError) as info:
            bottom.pids.call().get(timeout=ORPHAN_T)
        msg = str(info.value)
        assert f"ended with a proc it descends from (pid {pids[0]}, " in msg, msg
        assert "which was killed by signal SIGKILL (9)" in msg, msg
        assert "top" in _faults_of(faults, {"top"})
    finally:
        pm.stop().get(timeout=T)
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_stopping_the_owners_mesh_stops_its_procs_and_theirs_recursively():  # ME-14, ME-3
    pm = this_host().spawn_procs(per_host={"top": 1})
    pids = []
    try:
        top = pm.spawn("top", Level, 2)
        pids = top.pids.call_one().get(timeout=T)
        assert len(pids) == 1 + 2 + 4 and len(set(pids)) == 7
        assert all(_alive(p) for p in pids)
    finally:
        pm.stop().get(timeout=T)
    assert _wait_gone(pids) == [], "procs outlived the stop of the mesh above them"


@pytest.mark.parametrize("end", ["sigkill", "exit"])
def test_controller_end_leaves_no_nested_process_behind(tmp_path, end):  # ME-14, ME-3
    script = tmp_path / "nested_victim.py"
    script.write_text(textwrap.dedent(
        """
        import os, time
        from podium.actor import Actor, endpoint, this_host

        class Level(Actor):
            def __init__(self, depth):
                self.below = None
                if depth > 0:
                    self.procs = this_host().spawn_procs(per_host={"n": 2})
                    self.below = self.procs.spawn(f"level{depth - 1}", Level, depth - 1)

            @endpoint
            def pids(self):
                mine = [os.getpid()]
                if self.below is not None:
                    for sub in self.below.pids.call().get(timeout=30).values():
                        mine.extend(sub)
                return mine

        top = this_host().spawn_procs(per_host={"top": 1}).spawn("top", Level, 2)
        print("PIDS", *top.pids.call_one().get(timeout=30), flush=True)
        if os.environ["END"] == "sigkill":
            time.sleep(60)
        """
    ))
    p = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True, env={**os.environ, "END": end})
    pids = []
    try:
        line = p.stdout.readline()
        assert line.startswith("PIDS"), line
        pids = [int(x) for x in line.split()[1:]]
        assert len(pids) == 7
        if end == "sigkill":
            assert all(_alive(x) for x in pids)
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=CHILD_TIMEOUT_S)
        else:  # the program ends without stopping its meshes: podium's exit ends them
            assert p.wait(timeout=CHILD_TIMEOUT_S) == 0
        assert _wait_gone(pids) == [], "nested procs outlived their controller"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=CHILD_TIMEOUT_S)
        for x in pids:  # never leave a process behind, even when the test failed
            if _alive(x):
                os.kill(x, signal.SIGKILL)


def test_an_actor_on_an_attached_host_spawns_procs_on_that_host(tmp_path):  # ME-14, BT-3
    # The proc on the worker spawns with the worker's commands (PODIUM_SPAWN), on TCP (the
    # job's transport), and its procs are children of its own spawner, on the same host.
    worker = Worker()
    try:
        script = tmp_path / "attached.py"
        script.write_text(textwrap.dedent(
            """
            import os, sys
            from podium.actor import (Actor, endpoint, attach_to_workers, enable_transport,
                                      this_host)

            class Leaf(Actor):
                @endpoint
                def where(self):
                    from podium._core import mesh
                    return os.getpid(), mesh.this_proc_id()

            class Mid(Actor):
                def __init__(self):
                    self.leaves = this_host().spawn_procs(per_host={"n": 2}).spawn("leaf", Leaf)

                @endpoint
                def where(self):
                    from podium._core import mesh
                    return (os.getpid(), mesh.this_proc_id(),
                            sorted(self.leaves.where.call().get(timeout=30).values()))

            enable_transport("tcp://127.0.0.1:0")
            hosts = attach_to_workers(workers=sys.argv[1:])
            procs = hosts.spawn_procs(per_host={"mid": 1})
            mid_pid, mid_id, leaves = procs.spawn("mid", Mid).where.call_one().get(timeout=30)
            print("MID", mid_pid, mid_id, flush=True)
            for pid, proc_id in leaves:
                print("LEAF", pid, proc_id, flush=True)
            procs.stop().get(timeout=30)
            print("STOPPED", flush=True)
            """
        ))
        r = subprocess.run([sys.executable, str(script), worker.address], cwd=tmp_path,
                           capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        mid = [l.split() for l in lines if l.startswith("MID")][0]
        leaves = [l.split() for l in lines if l.startswith("LEAF")]
        assert len(leaves) == 2 and "STOPPED" in lines
        assert mid[2].startswith("tcp:") and all(l[2].startswith("tcp:127.0.0.1:") for l in leaves)
        pids = [int(mid[1])] + [int(l[1]) for l in leaves]
        assert _wait_gone(pids) == [], "the stop left procs of the attached host behind"
    finally:
        worker.kill()
