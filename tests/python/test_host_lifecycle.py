"""Host lifecycle, as Monarch's HostMesh: stop() stops the procs spawned through this
HostMesh and keeps its hosts (HM-1); `with` / `async with` shuts it down on exit; an attached
HostMesh pickles to an actor, which spawns on it, while the copy cannot shut the hosts down;
shutdown() of a worker that is not persistent ends it with its zygote and procs (HA-16), and a
job's kill leaves no process. Controllers are scripts of their own (this_host() and the
transport are per process); workers are real `python -m podium worker` processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import CHILD_TIMEOUT_S, Worker, gone_within, pid_alive

PRELUDE = textwrap.dedent("""
    import asyncio, os, pickle, sys
    from podium.actor import (Actor, endpoint, attach_to_workers, enable_transport,
                              SupervisionError, this_host)

    class Who(Actor):
        @endpoint
        def pid(self):
            return os.getpid()

    class Spawner(Actor):
        @endpoint
        def spawn_on(self, hosts):
            assert hosts.initialized.get(timeout=60) is True
            pm = hosts.spawn_procs(per_host={"gpus": 2})
            who = pm.spawn("who", Who)
            pids = sorted(who.pid.call().get(timeout=60).values())
            who.stop().get(timeout=60)  # the procs stay: the controller's stop() ends them
            try:
                hosts.shutdown()
                shut = "shut down?!"
            except RuntimeError as e:
                shut = str(e)
            return pids, shut, hosts.is_fake_in_process

    WORKERS = sys.argv[1:]

    def pids_of(procs):
        return sorted(procs.spawn("who", Who).pid.call().get(timeout=60).values())
    """)


def controller(tmp_path: Path, body: str, workers: list[str] = ()) -> subprocess.CompletedProcess:
    script = tmp_path / "controller.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script), *workers], capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL)


def numbers(out: str, tag: str) -> list[int]:
    m = re.search(rf"^{tag} (.*)$", out, re.M)
    assert m, out
    return [int(x) for x in re.findall(r"\d+", m.group(1))]


def descendants(pid: int) -> list[int]:
    """Every live process under `pid`, from a scan of /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


# HM-1: stop() ends the procs spawned through this HostMesh (and its slices' spawns), not
# another HostMesh's on the same host, and the host spawns again afterwards.
def test_stop_ends_this_host_meshes_procs_and_keeps_the_host(tmp_path):
    r = controller(tmp_path, """
        host = this_host()
        mine = host.spawn_procs(per_host={"gpus": 2})
        am = mine.spawn("who2", Who)
        other = this_host().with_python_executable(sys.executable).spawn_procs(
            per_host={"gpus": 1})
        print("MINE", *pids_of(mine), flush=True)
        print("OTHER", *pids_of(other), flush=True)
        assert host.stop().get(timeout=60) is None
        try:
            am.pid.call().get(timeout=30)
            print("answered?!")
        except SupervisionError as e:
            print("CALL:", e, flush=True)
        print("OTHER AFTER", *pids_of(other), flush=True)
        print("AGAIN", *pids_of(host.spawn_procs(per_host={"gpus": 1})), flush=True)
        """)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert gone_within(numbers(r.stdout, "MINE")) == [], out
    assert numbers(r.stdout, "OTHER AFTER") == numbers(r.stdout, "OTHER"), out
    assert "CALL:" in r.stdout and len(numbers(r.stdout, "AGAIN")) == 1, out


# HM-1 on attached hosts: stop() ends the procs (a slice's spawns too) and the worker stays
# attached: the same HostMesh spawns again.
def test_stop_keeps_attached_hosts_for_the_next_spawn(tmp_path):
    w = Worker()
    try:
        r = controller(tmp_path, """
            enable_transport("tcp://127.0.0.1:0")
            hosts = attach_to_workers(workers=WORKERS)
            assert hosts.initialized.get(timeout=60) is True
            a = pids_of(hosts.spawn_procs(per_host={"gpus": 2}))
            b = pids_of(hosts.slice(hosts=slice(0, 1)).spawn_procs(per_host={"gpus": 1}))
            print("PIDS", *a, *b, flush=True)
            hosts.stop().get(timeout=60)
            print("AGAIN", *pids_of(hosts.spawn_procs(per_host={"gpus": 1})), flush=True)
            """, [w.address])
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert gone_within(numbers(r.stdout, "PIDS")) == [], out
        assert len(numbers(r.stdout, "AGAIN")) == 1, out
        assert w.proc.poll() is None, w.text()  # the worker serves on
    finally:
        w.kill()


# `with` and `async with` shut the hosts down on exit: a worker that is not persistent
# ends, and its zygote and procs with it (HA-16); this_host()'s procs stop.
@pytest.mark.parametrize("form", ["with", "async_with"])
def test_context_manager_shuts_the_host_mesh_down(tmp_path, form):
    w = Worker()
    try:
        worker_tree = []
        body = {
            "with": """
                with attach_to_workers(workers=WORKERS) as hosts:
                    print("PIDS", *pids_of(hosts.spawn_procs(per_host={"gpus": 2})), flush=True)
                    input()
                """,
            "async_with": """
                async def main():
                    async with attach_to_workers(workers=WORKERS) as hosts:
                        print("PIDS", *pids_of(hosts.spawn_procs(per_host={"gpus": 2})),
                              flush=True)
                        input()
                    async with this_host() as local:
                        print("LOCAL", *pids_of(local.spawn_procs(per_host={"gpus": 1})),
                              flush=True)
                asyncio.run(main())
                """,
        }[form]
        script = tmp_path / "controller.py"
        script.write_text(PRELUDE + 'enable_transport("tcp://127.0.0.1:0")\n'
                          + textwrap.dedent(body) + 'print("DONE", flush=True)\n')
        p = subprocess.Popen([sys.executable, str(script), w.address], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            first = p.stdout.readline()
            assert first.startswith("PIDS"), first + p.stdout.read()
            worker_tree = descendants(w.proc.pid)  # its zygote and procs, while they run
            assert len(worker_tree) >= 2, worker_tree
            p.stdin.write("\n")
            p.stdin.flush()
            out, _ = p.communicate(timeout=CHILD_TIMEOUT_S)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0 and "DONE" in out, first + out
        assert w.proc.wait(timeout=30) == 0, w.text()
        assert gone_within(worker_tree + numbers(first, "PIDS")) == [], worker_tree
        if form == "async_with":
            assert gone_within(numbers(out, "LOCAL")) == [], out
    finally:
        w.kill()


# An attached HostMesh pickles: an actor that receives it spawns procs on those hosts (its
# own: HM-2, test_nested_attached.py), but cannot shut them down; the controller's stop() of
# the original ends what the actor spawned through it.
def test_an_attached_host_mesh_sent_to_an_actor_spawns_there(tmp_path):
    w = Worker()
    try:
        r = controller(tmp_path, """
            enable_transport("tcp://127.0.0.1:0")
            hosts = attach_to_workers(workers=WORKERS)
            hosts.initialized.get(timeout=60)
            spawner = this_host().spawn_procs(per_host={"p": 1}).spawn("spawner", Spawner)
            pids, shut, fake = spawner.spawn_on.call_one(hosts).get(timeout=60)
            print("PIDS", *pids, flush=True)
            print("SHUT:", shut, flush=True)
            print("FAKE", fake, flush=True)
            copy = pickle.loads(pickle.dumps(hosts))
            try:
                copy.stop()
                print("stopped?!")
            except RuntimeError as e:
                print("COPY:", e, flush=True)
            hosts.stop().get(timeout=60)
            print("STOPPED", flush=True)
            """, [w.address])
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        pids = numbers(r.stdout, "PIDS")
        assert len(pids) == 2 and all(p in descendants(w.proc.pid) or not pid_alive(p)
                                      for p in pids), out
        assert re.search(r"SHUT: HostMesh.shutdown\(\) on .*: it is a reference to hosts "
                         r"attached by another process", r.stdout), out
        assert "COPY: HostMesh.stop()" in r.stdout and "FAKE False" in r.stdout, out
        assert gone_within(pids) == [], out
    finally:
        w.kill()


# A LocalJob's kill (and a controller's shutdown of its hosts) leaves no process of the job:
# workers, their zygotes and procs.
@pytest.mark.parametrize("how", ["kill", "shutdown"])
def test_a_local_jobs_end_leaves_no_process(tmp_path, how):
    r = controller(tmp_path, f"""
        from podium.job import LocalJob
        job = LocalJob(hosts={{"trainers": 2}})
        hosts = job.state(cached_path=None).trainers
        pids = pids_of(hosts.spawn_procs(per_host={{"gpus": 2}}))
        workers = [w.pid for w in job._procs]
        print("WORKERS", *workers, flush=True)
        tree = []
        for w in workers:
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        stat = open(f"/proc/{{entry}}/stat").read().rsplit(")", 1)[1].split()
                    except OSError:
                        continue
                    if int(stat[1]) == w:
                        tree.append(int(entry))
        print("TREE", *tree, *pids, flush=True)
        if "{how}" == "shutdown":
            hosts.shutdown().get(timeout=60)
            print("SHUT", flush=True)
        job.kill()
        """)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    everything = numbers(r.stdout, "WORKERS") + numbers(r.stdout, "TREE")
    assert len(everything) >= 2 + 2 + 4, out  # workers, zygotes, procs
    assert gone_within(everything) == [], out
