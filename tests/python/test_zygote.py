"""Procs fork from a warm zygote (cpp/podium/host/zygote.h, podium/_src/zygote.py): each is
a child of the zygote, sees the controller's environment as it is at spawn time, has its own
random state, and nothing outlives the controller; PODIUM_ZYGOTE=0 starts procs as new
interpreters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import textwrap

import pytest

from conftest import CHILD_TIMEOUT_S, run_script

T = 20

SCRIPT = textwrap.dedent(
    """
    import json, os, random, sys
    from podium.actor import Actor, endpoint, this_host

    class Probe(Actor):
        @endpoint
        def info(self):
            return {"pid": os.getpid(), "ppid": os.getppid(),
                    "late": os.environ.get("PODIUM_TEST_LATE"), "random": random.random(),
                    "cwd": os.getcwd(), "pgid": os.getpgid(0)}

    first = this_host().spawn_procs(per_host={"procs": 1})  # starts the runtime (and zygote)
    os.environ["PODIUM_TEST_LATE"] = "set-after-start"
    procs = this_host().spawn_procs(per_host={"procs": 3})
    infos = procs.spawn("probe", Probe).info.call().get(timeout=20).values()
    print(json.dumps({"controller": os.getpid(), "procs": infos}), flush=True)
    if sys.argv[1:] == ["hang"]:
        print("ready", flush=True)
        import time
        time.sleep(600)
    """
)


def _run(tmp_path, *, zygote: bool) -> dict:
    env = {**os.environ, "PODIUM_ZYGOTE": "1" if zygote else "0"}
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=CHILD_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_procs_are_forked_from_one_zygote_with_the_environment_at_spawn_time(tmp_path):
    out = _run(tmp_path, zygote=True)
    infos = out["procs"]
    parents = {i["ppid"] for i in infos}
    assert len(parents) == 1 and out["controller"] not in parents  # one zygote, not the controller
    assert all(i["late"] == "set-after-start" for i in infos)  # ZY-4
    assert all(i["cwd"] == str(tmp_path) for i in infos)
    assert all(i["pgid"] == i["pid"] for i in infos)  # own process group (ZY-3)
    assert len({i["random"] for i in infos}) == len(infos)  # reseeded after fork


def test_without_the_zygote_procs_are_children_of_the_controller(tmp_path):
    out = _run(tmp_path, zygote=False)
    infos = out["procs"]
    assert {i["ppid"] for i in infos} == {out["controller"]}
    assert all(i["late"] == "set-after-start" for i in infos)


def _run_preloading(tmp_path, preload: str) -> subprocess.CompletedProcess:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PODIUM_ZYGOTE": "1", "PODIUM_ZYGOTE_PRELOAD": preload,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=CHILD_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout.strip().splitlines()[-1])["procs"]) == 3
    return r


# A preloaded module that leaves what a fork cannot carry (a thread started from Python here;
# CUDA initialized on a GPU build of torch) is named once, with the hazard, in the zygote's
# output; OpenBLAS's pool (numpy's import) is not a hazard and is not reported.
def test_a_preloaded_module_that_starts_a_thread_is_named(tmp_path):
    (tmp_path / "threadmod.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(600,), name='poller', daemon=True).start()\n")
    r = _run_preloading(tmp_path, "threadmod")
    warnings = [l for l in r.stderr.splitlines() if l.startswith("podium zygote: ")]
    assert len(warnings) == 1, r.stderr
    assert "after preloading threadmod (PODIUM_ZYGOTE_PRELOAD): 1 thread(s) started from " \
           "Python (poller)" in warnings[0], warnings
    r = _run_preloading(tmp_path, "numpy")
    assert "podium zygote: " not in r.stderr, r.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for init to reap it is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


def test_controller_sigkill_leaves_neither_zygote_nor_procs(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    p = subprocess.Popen([sys.executable, str(script), "hang"], cwd=tmp_path,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        line = p.stdout.readline()
        out = json.loads(line)
        assert p.stdout.readline().strip() == "ready"
        pids = [i["pid"] for i in out["procs"]] + [out["procs"][0]["ppid"]]
        assert all(_alive(q) for q in pids)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=T)
        deadline = time.monotonic() + 5
        while any(_alive(q) for q in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not [q for q in pids if _alive(q)]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=T)


def test_a_dead_zygote_fails_its_procs_and_the_next_spawn_starts_a_new_one():
    from podium.actor import Actor, SupervisionError, endpoint, this_host

    class Pid(Actor):
        @endpoint
        def pid(self):
            return os.getpid(), os.getppid()

        @endpoint
        def sleep(self):
            time.sleep(60)

    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        mesh = procs.spawn("pid", Pid)
        (pid0, zygote), (pid1, _) = mesh.pid.call().get(timeout=T).values()
        # This test process's runtime read PODIUM_ZYGOTE at start: with the zygote on (the
        # default, and make test's setting), procs must be its children, not ours.
        if os.environ.get("PODIUM_ZYGOTE", "1") == "0":
            pytest.skip("PODIUM_ZYGOTE=0 was set for this test run: there is no zygote to kill")
        assert zygote != os.getpid()
        pending = mesh.sleep.call()
        t0 = time.monotonic()
        os.kill(zygote, signal.SIGKILL)  # its procs die with it (ZY-3) and are reported (ZY-2)
        with pytest.raises(SupervisionError):
            pending.get(timeout=T)
        assert time.monotonic() - t0 < 5
        again = this_host().spawn_procs(per_host={"procs": 1})
        try:
            _, new_zygote = again.spawn("pid2", Pid).pid.call_one().get(timeout=T)
            assert new_zygote not in (zygote, os.getpid())
        finally:
            again.stop().get(timeout=T)
    finally:
        procs.stop().get(timeout=T)


CONCURRENT_FIRST_SPAWNS = textwrap.dedent(
    """
    import json, os, threading
    from podium.actor import Actor, endpoint, this_host

    class Pid(Actor):
        @endpoint
        def pid(self):
            return os.getpid(), os.getppid()

    barrier = threading.Barrier(4)
    results, errors = [None] * 4, []

    def spawn(i):
        try:
            barrier.wait(timeout=20)
            procs = this_host().spawn_procs(per_host={"procs": 1})
            results[i] = procs.spawn("pid", Pid).pid.call_one().get(timeout=20)
        except BaseException as e:
            errors.append(f"{i}: {e}")

    threads = [threading.Thread(target=spawn, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    print(json.dumps({"results": results, "errors": errors}), flush=True)
    """
)


def test_first_spawns_from_several_threads_at_once_share_one_zygote(tmp_path):
    # PS-3: each thread's first spawn found no zygote and started its own; the last one
    # replaced the others, whose stop SIGKILLed the procs already forked from them.
    r = run_script(tmp_path, "first_spawns.py", CONCURRENT_FIRST_SPAWNS)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["errors"] == [], (out["errors"], r.stderr[-2000:])
    parents = {ppid for _, ppid in out["results"]}
    assert len(parents) == 1, out
    if os.environ.get("PODIUM_ZYGOTE", "1") != "0":
        assert "killed by signal" not in r.stderr, r.stderr[-2000:]


WATCH_SCRIPT = textwrap.dedent(
    """
    import json, os
    from podium.actor import Actor, endpoint, this_host

    class Probe(Actor):
        @endpoint
        def info(self):
            maps = open("/proc/self/maps").read()
            fds = []
            for fd in os.listdir("/proc/self/fd"):
                try:
                    fds.append(os.readlink(f"/proc/self/fd/{fd}"))
                except OSError:
                    pass  # the listing's own descriptor, closed already
            return {"watched": "podium-death-watch" in maps,
                    "env": os.environ.get("PODIUM_DEATH_WATCH"),
                    "fd": any("podium-death-watch" in f for f in fds)}

    procs = this_host().spawn_procs(per_host={"procs": 2})
    print(json.dumps(list(procs.spawn("probe", Probe).info.call().get(timeout=20).values())))
    """
)


@pytest.mark.parametrize("zygote", [True, False])
def test_every_proc_is_death_watched_and_passes_the_watch_on_to_nothing(tmp_path, zygote):
    """DW-1: a proc, forked or exec'd, maps its slot of its spawner's death watch (so its death
    is told when its exit begins); the variable and the descriptor that brought it are gone, so
    programs it starts are not watched through its slot."""
    script = tmp_path / "watch.py"
    script.write_text(WATCH_SCRIPT)
    env = {**os.environ, "PODIUM_ZYGOTE": "1" if zygote else "0"}
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=CHILD_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    infos = json.loads(r.stdout.strip().splitlines()[-1])
    assert infos == [{"watched": True, "env": None, "fd": False}] * 2
