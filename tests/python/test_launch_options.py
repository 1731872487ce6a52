"""Launch options of HostMesh.spawn_procs, as Monarch's: proc_bind (CPU and NUMA binding per
proc, LA-1), bootstrap_command with default_bootstrap_cmd() (one command, or one per rank),
HostMesh.with_python_executable() and HostMesh.is_fake_in_process. Each proc is a real
process: what it reports (its affinity, its interpreter, its environment, its pid) shows how
it was started."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from conftest import CHILD_TIMEOUT_S, Worker
from podium._src.bootstrap_cmd import BootstrapCommand, default_bootstrap_cmd
from podium.actor import Actor, endpoint, SupervisionError, this_host

T = CHILD_TIMEOUT_S
CPUS = sorted(os.sched_getaffinity(0))


class Probe(Actor):
    @endpoint
    def affinity(self) -> list:
        return sorted(os.sched_getaffinity(0))

    @endpoint
    def thread_affinities(self) -> list:
        import threading
        out = []

        def read():
            out.append(sorted(os.sched_getaffinity(0)))
        t = threading.Thread(target=read)
        t.start()
        t.join()
        return out

    @endpoint
    def executable(self) -> str:
        return sys.executable

    @endpoint
    def env(self, name: str):
        return os.environ.get(name)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def numa_policy(self) -> str:
        with open("/proc/self/numa_maps") as f:
            return f.read()


@pytest.fixture
def stop_after():
    meshes = []
    yield meshes.append
    for pm in meshes:
        try:
            pm.stop().get(timeout=T)
        except Exception:
            pass


# LA-1: each proc runs on the CPUs its proc_bind entry names, threads it starts included.
@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to tell the procs' bindings apart")
def test_proc_bind_cpus_sets_each_procs_affinity(stop_after):
    a, b = str(CPUS[0]), str(CPUS[1])
    pm = this_host().spawn_procs(per_host={"gpus": 2},
                                 proc_bind=[{"cpus": a}, {"physcpubind": b}])
    stop_after(pm)
    probe = pm.spawn("probe", Probe)
    got = probe.affinity.call().get(timeout=T)
    assert [got.item(gpus=0), got.item(gpus=1)] == [[CPUS[0]], [CPUS[1]]]
    assert probe.slice(gpus=1).thread_affinities.call_one().get(timeout=T) == [[CPUS[1]]]


# LA-1: cpunodebind takes the node's CPUs from /sys; membind binds the memory policy.
def test_proc_bind_numa_node_binds_cpus_and_memory(stop_after):
    node0 = Path("/sys/devices/system/node/node0/cpulist")
    if not node0.exists():
        pytest.skip("no NUMA node 0 on this host")
    want = set()
    for part in node0.read_text().strip().split(","):
        lo, _, hi = part.partition("-")
        want.update(range(int(lo), int(hi or lo) + 1))
    pm = this_host().spawn_procs(per_host={"gpus": 1},
                                 proc_bind=[{"cpunodebind": "0", "membind": "0"}])
    stop_after(pm)
    probe = pm.spawn("probe", Probe)
    assert set(probe.affinity.call_one().get(timeout=T)) == want & set(CPUS)
    assert "bind:0" in probe.numa_policy.call_one().get(timeout=T)


def test_proc_bind_length_must_match_the_procs_per_host():
    with pytest.raises(ValueError, match=r"proc_bind length \(1\) must equal procs_per_host \(2\)"):
        this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": "0"}])
    with pytest.raises(ValueError, match="proc_bind key 'cores'"):
        this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cores": "0"}])
    with pytest.raises(ValueError, match="'zero' is not a list"):
        this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "zero"}])


# LA-1: a binding the host cannot apply fails the proc (and initialized), naming it.
def test_a_binding_that_cannot_be_applied_fails_initialized(stop_after):
    pm = this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpunodebind": "999"}])
    stop_after(pm)
    with pytest.raises(SupervisionError, match=r"proc rank 0 .*exited with status 2"):
        pm.initialized.get(timeout=T)


def test_default_bootstrap_cmd_is_the_command_podium_uses():
    cmd = default_bootstrap_cmd()
    assert isinstance(cmd, BootstrapCommand)
    assert cmd.program == sys.executable and cmd.args == ["-m", "podium._src.proc"]
    assert cmd.env == {} and cmd.inherit_env
    assert cmd.with_env({"A": "1"}).env == {"A": "1"} and cmd.env == {}


def _recording_command(mark: Path, extra_env: dict | None = None) -> BootstrapCommand:
    """The default command behind a shell that appends its pid to `mark`, then execs it."""
    d = default_bootstrap_cmd()
    return BootstrapCommand("/bin/sh", None,
                            ["-c", f'echo $$ >> {mark}; exec "$0" "$@"', d.program, *d.args],
                            dict(extra_env or {}))


# The command is what starts the procs: the wrapper ran, in the very process that serves.
def test_bootstrap_command_starts_the_procs(tmp_path, stop_after, monkeypatch):
    mark = tmp_path / "ran"
    monkeypatch.setenv("PODIUM_TEST_REMOVED", "inherited")
    cmd = _recording_command(mark, {"PODIUM_TEST_SET": "yes", "PODIUM_TEST_REMOVED": None})
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=cmd)
    stop_after(pm)
    probe = pm.spawn("probe", Probe)
    pids = sorted(probe.pid.call().get(timeout=T).values())
    assert sorted(int(x) for x in mark.read_text().split()) == pids
    assert list(probe.env.call("PODIUM_TEST_SET").get(timeout=T).values()) == ["yes", "yes"]
    assert list(probe.env.call("PODIUM_TEST_REMOVED").get(timeout=T).values()) == [None, None]


# One command per rank: a function of the proc's Point.
def test_bootstrap_command_per_rank(stop_after):
    seen = []

    def per_rank(point):
        seen.append(dict(point))
        return default_bootstrap_cmd().with_env({"PODIUM_TEST_RANK": str(point.rank)})

    pm = this_host().spawn_procs(per_host={"gpus": 3}, bootstrap_command=per_rank)
    stop_after(pm)
    got = pm.spawn("probe", Probe).env.call("PODIUM_TEST_RANK").get(timeout=T)
    assert [got.item(gpus=i) for i in range(3)] == ["0", "1", "2"]
    assert seen == [{"gpus": 0}, {"gpus": 1}, {"gpus": 2}]
    with pytest.raises(TypeError, match="not a BootstrapCommand"):
        this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=lambda p: "python")


def _python_alias(tmp_path: Path) -> str:
    """Another path to this virtual environment's interpreter (a venv of links to it)."""
    prefix = Path(sys.prefix)
    alias = tmp_path / "venv"
    (alias / "bin").mkdir(parents=True)
    os.symlink(prefix / "lib", alias / "lib")
    if (prefix / "pyvenv.cfg").exists():
        os.symlink(prefix / "pyvenv.cfg", alias / "pyvenv.cfg")
    exe = alias / "bin" / "python"
    os.symlink(sys.executable, exe)
    return str(exe)


def test_with_python_executable_starts_procs_with_that_interpreter(tmp_path, stop_after):
    python = _python_alias(tmp_path)
    hosts = this_host().with_python_executable(python)
    assert hosts.extent == this_host().extent and hosts.is_fake_in_process is False
    pm = hosts.spawn_procs(per_host={"gpus": 2})
    stop_after(pm)
    assert list(pm.spawn("probe", Probe).executable.call().get(timeout=T).values()) == \
        [python, python]
    other = this_host().spawn_procs(per_host={"gpus": 1})  # this_host() itself is unchanged
    stop_after(other)
    assert other.spawn("probe", Probe).executable.call_one().get(timeout=T) == sys.executable


def test_a_real_host_is_not_fake_in_process_and_initializes_to_true():
    assert this_host().is_fake_in_process is False
    assert this_host().initialized.get(timeout=T) is True


# On attached workers the launches travel in the spawn request (HostSpawn) and the worker
# applies them: binding, command and per-rank environment.
def test_launch_options_on_an_attached_worker(tmp_path):
    import subprocess
    import textwrap
    w = Worker()
    try:
        mark = tmp_path / "ran"
        script = tmp_path / "controller.py"
        script.write_text(textwrap.dedent(f"""
            import os, sys
            from podium.actor import Actor, endpoint, attach_to_workers, enable_transport
            from podium._src.bootstrap_cmd import BootstrapCommand, default_bootstrap_cmd

            class Probe(Actor):
                @endpoint
                def info(self):
                    return (os.getpid(), sorted(os.sched_getaffinity(0)),
                            os.environ.get("PODIUM_TEST_RANK"))

            enable_transport("tcp://127.0.0.1:0")
            hosts = attach_to_workers(workers=sys.argv[1:])
            d = default_bootstrap_cmd()
            def per_rank(point):
                return BootstrapCommand("/bin/sh", None,
                    ["-c", 'echo $$ >> {mark}; exec "$0" "$@"', d.program, *d.args],
                    {{"PODIUM_TEST_RANK": str(point.rank)}})
            pm = hosts.spawn_procs(per_host={{"gpus": 1}}, proc_bind=[{{"cpus": "{CPUS[-1]}"}}],
                                   bootstrap_command=per_rank)
            print("INFO", pm.spawn("p", Probe).info.call_one().get(timeout=60), flush=True)
            hosts.shutdown().get(timeout=60)
            """))
        r = subprocess.run([sys.executable, str(script), w.address], capture_output=True,
                           text=True, timeout=T, stdin=subprocess.DEVNULL)
    finally:
        w.kill()
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    pid, cpus, rank = eval(r.stdout.split("INFO", 1)[1].strip())
    assert cpus == [CPUS[-1]] and rank == "0", out
    assert [int(x) for x in mark.read_text().split()] == [pid], out
