"""Every public name of Monarch's monarch.actor is a name of podium.actor (PN-1), each doing
what Monarch's does (issue 18, part 11); and the older spelling proc_mesh(gpus=N) and
`await procs.spawn(...)` (part 10, PN-2)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import podium.actor
from conftest import CHILD_TIMEOUT_S, gone_within, Worker
from podium.actor import Actor, endpoint, this_host

T = 30
NAMES_FILE = Path(__file__).with_name("monarch_actor_names.txt")
# Names podium leaves out, with the reason.
NOT_YET: dict = {}


def monarch_names() -> set:
    try:
        import monarch.actor as m  # type: ignore

        return set(m.__all__)
    except Exception:  # Monarch is not installed here: its 0.7.0 list, checked in
        return {line.strip() for line in NAMES_FILE.read_text().splitlines()
                if line.strip() and not line.startswith("#")}


def test_podium_actor_exports_every_name_of_monarch_actor():  # PN-1
    names = monarch_names()
    assert len(names) >= 44
    missing = sorted(n for n in names - set(NOT_YET) if not hasattr(podium.actor, n))
    assert not missing, missing
    not_listed = sorted(n for n in names - set(NOT_YET) if n not in podium.actor.__all__)
    assert not not_listed, not_listed
    for n in podium.actor.__all__:
        assert hasattr(podium.actor, n), n


def run_py(tmp_path, body: str, env=None) -> subprocess.CompletedProcess:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})}, cwd=tmp_path)


# --- config -----------------------------------------------------------------------------------


def test_config_configures_podiums_settings_by_monarchs_names():  # CF-1
    from podium._src import actor_mesh, proc_mesh

    config = podium.actor.config
    assert config.prefix_python_logs_with_actor is True
    before = (actor_mesh.STOP_GRACE_S, proc_mesh.STOP_GRACE_MS)
    with config.configured(stop_actor_timeout="2s 500ms", process_exit_timeout="1m") as now:
        assert actor_mesh.STOP_GRACE_S == 2.5 and proc_mesh.STOP_ACTORS_MS == 2500
        assert proc_mesh.STOP_GRACE_MS == 60_000
        assert now["stop_actor_timeout"] == 2.5
        assert config.get_runtime_config() == {"stop_actor_timeout": "2s 500ms",
                                               "process_exit_timeout": "1m"}
    assert (actor_mesh.STOP_GRACE_S, proc_mesh.STOP_GRACE_MS) == before
    assert config.get_runtime_config() == {}
    # Unknown keys and bad values raise, and change nothing (CF-1).
    with pytest.raises(ValueError, match="unknown setting 'no_such_key'"):
        config.configure(stop_actor_timeout="5s", no_such_key=1)
    with pytest.raises(ValueError, match="not a duration"):
        config.configure(stop_actor_timeout="soon")
    assert actor_mesh.STOP_GRACE_S == before[0]
    # A Monarch key podium has no counterpart for: recorded, with a warning.
    with pytest.warns(RuntimeWarning, match="changes nothing"):
        config.configure(enable_log_forwarding=True)
    assert config.get_runtime_config()["enable_log_forwarding"] is True
    config.clear_runtime_config()
    import importlib

    same = importlib.import_module("podium.actor.config")
    assert same is config
    assert importlib.import_module("podium.config").configure is config.configure


# --- bootstrap command, transports, ids -------------------------------------------------------


def test_default_bootstrap_cmd_is_podiums_proc_launcher():
    cmd = podium.actor.default_bootstrap_cmd()
    assert cmd.program == sys.executable and cmd.argv == [sys.executable, "-m",
                                                          "podium._src.proc"]
    custom = cmd.with_env({"A": "1", "HOME": None})
    assert custom.env == {"A": "1", "HOME": None} and cmd.env == {}
    env = custom.child_env({"HOME": "/root", "PATH": "/bin"})
    assert env == {"PATH": "/bin", "A": "1"}
    custom.inherit_env = False
    assert custom.child_env({"PATH": "/bin"}) == {"A": "1"}


def test_channel_transport_picks_how_procs_talk(tmp_path):
    ChannelTransport = podium.actor.ChannelTransport
    assert ChannelTransport.Unix.value == "unix"
    assert {m.name for m in ChannelTransport} >= {"TcpWithLocalhost", "TcpWithHostname",
                                                  "Unix", "Local", "Tls"}
    r = run_py(tmp_path, """
        from podium.actor import Actor, ChannelTransport, enable_transport, endpoint, this_host
        from podium._src import runtime
        enable_transport(ChannelTransport.TcpWithLocalhost)
        class A(Actor):
            @endpoint
            def one(self):
                return 1
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        print("VALUE", procs.spawn("a", A).one.call_one().get(timeout=30))
        print("LISTEN", runtime.listen_address())
        procs.stop().get(timeout=30)
        """)
    assert r.returncode == 0, r.stderr
    assert "VALUE 1" in r.stdout and "LISTEN tcp:127.0.0.1:" in r.stdout


def test_uid_and_proc_id_round_trip_through_their_text():
    Uid, ProcId = podium.actor.Uid, podium.actor.ProcId
    u = Uid.instance("service")
    assert u.is_instance and not u.is_singleton and u.label == "service"
    assert Uid.from_string(str(u)) == u and str(u).startswith("service<")
    v = Uid.instance_from_value(12345)
    assert v.instance_value == 12345 and v.label is None and Uid.from_string(str(v)) == v
    s = Uid.from_string("service")
    assert s.is_singleton and s.instance_value is None and str(s) == "service"
    assert Uid.anonymous() != Uid.anonymous()
    p = ProcId(u)
    assert p.uid == u and p.label == "service" and ProcId.from_string(str(p)) == p
    assert len({p, ProcId(u)}) == 1
    import pickle

    assert pickle.loads(pickle.dumps(p)) == p


# --- telemetry --------------------------------------------------------------------------------


def test_get_meter_records_counters_and_histograms():
    meter = podium.actor.get_meter()
    assert meter is podium.actor.get_meter()
    c = meter.create_counter("test_public_names.requests")
    c.add(2, {"route": "/a"})
    c.add(3, {"route": "/a"})
    c.add(1)
    h = meter.create_histogram("test_public_names.latency")
    for x in (0.5, 1.5):
        h.record(x)
    snap = meter.snapshot()
    assert snap["test_public_names.requests"] == {(("route", "/a"),): 5, (): 1}
    assert snap["test_public_names.latency"][()] == {"count": 2, "sum": 2.0, "min": 0.5,
                                                     "max": 1.5}
    with pytest.raises(ValueError):
        c.add(-1)


def test_span_and_traced_time_sync_and_async_code(caplog):
    span, traced = podium.actor.span, podium.actor.traced
    caplog.set_level(logging.DEBUG, logger="podium.telemetry")
    with span("test_public_names.block") as s:
        pass
    assert s.duration is not None and s.duration >= 0

    @traced
    def add(a, b):
        return a + b

    @traced(name="test_public_names.custom")
    async def mul(a, b):
        return a * b

    assert add(2, 3) == 5 and add.__name__ == "add"
    assert asyncio.run(mul(2, 3)) == 6
    snap = podium.actor.get_meter().snapshot()
    assert snap["span.add.seconds"][()]["count"] >= 1
    assert snap["span.test_public_names.custom.seconds"][()]["count"] >= 1
    assert any("span test_public_names.block took" in r.getMessage() for r in caplog.records)


# --- returns_future ---------------------------------------------------------------------------

_var: contextvars.ContextVar = contextvars.ContextVar("test_public_names", default="unset")


def test_returns_future_makes_an_async_function_return_a_future():
    started = []

    @podium.actor.returns_future
    async def compute(x):
        started.append(x)
        await asyncio.sleep(0)
        if x < 0:
            raise ValueError("negative")
        return x * 2, _var.get()

    _var.set("caller's")
    f = compute(21)
    assert isinstance(f, podium.actor.Future) and started == []  # not started by the call
    assert f.get(timeout=T) == (42, "caller's")  # the caller's context variables
    assert f.get(timeout=T) == (42, "caller's") and started == [21]  # ran once

    async def main():
        return await compute(1)

    assert asyncio.run(main()) == (2, "caller's")
    with pytest.raises(ValueError, match="negative"):
        compute(-1).get(timeout=T)
    with pytest.raises(TypeError):
        podium.actor.returns_future(lambda: 1)


# --- attach, shutdown_context -----------------------------------------------------------------


def test_attach_comes_before_the_client_and_names_a_gateway_it_cannot_reach(tmp_path):
    # attach() itself is tested in test_attach_gateway.py; here its order and its failure.
    r = run_py(tmp_path, """
        from podium.actor import attach, this_host
        try:
            attach("tcp://gateway.invalid:1234")
        except Exception as e:
            print("BEFORE", e)
        this_host()  # the failed attach left no client: this one starts locally
        try:
            attach("tcp://gateway.invalid:1234")
        except RuntimeError as e:
            print("AFTER", e)
        """, env={"PODIUM_ATTACH_TIMEOUT_MS": "1000"})
    assert r.returncode == 0, r.stderr
    assert ("BEFORE attach failed: the gateway at tcp://gateway.invalid:1234 did not open a "
            "duplex within 1000 ms") in r.stdout, r.stdout + r.stderr
    assert "AFTER client was initialized without a remote attachment" in r.stdout


def test_shutdown_context_stops_the_procs_and_the_client_once(tmp_path):
    r = run_py(tmp_path, """
        import os
        from podium.actor import Actor, endpoint, shutdown_context, this_host
        print("FIRST_NOOP", shutdown_context().get(timeout=5))  # podium never started here
        class A(Actor):
            @endpoint
            def pid(self):
                return os.getpid()
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        print("PIDS", *procs.spawn("a", A).pid.call().get(timeout=30).values(), flush=True)
        f = shutdown_context(host_timeout=5)
        print("DONE", f.get(timeout=30))
        print("AGAIN", shutdown_context().done())
        try:
            this_host().spawn_procs(per_host={"gpus": 1}).initialized.get(timeout=10)
            print("SPAWNED")
        except Exception as e:
            print("REFUSED", type(e).__name__)
        """)
    assert r.returncode == 0, r.stderr
    assert "FIRST_NOOP None" in r.stdout and "DONE None" in r.stdout and "AGAIN True" in r.stdout
    assert "SPAWNED" not in r.stdout and "REFUSED" in r.stdout, r.stdout
    pids = [int(p) for p in r.stdout.split("PIDS ")[1].split("\n")[0].split()]
    assert gone_within(pids) == []
    with pytest.raises(ValueError):
        podium.actor.shutdown_context(host_timeout=-1)


# --- worker loops -----------------------------------------------------------------------------


def test_start_worker_loop_forever_reports_a_worker_that_cannot_start():
    f = podium.actor.start_worker_loop_forever(address="udp://nowhere")
    with pytest.raises(Exception, match="udp://nowhere"):
        f.get(timeout=T)


def test_run_worker_loop_until_shutdown_returns_when_its_host_is_shut_down(tmp_path):
    worker = Worker(argv=[sys.executable, "-c", textwrap.dedent("""
        from podium.actor import run_worker_loop_until_shutdown
        run_worker_loop_until_shutdown(address="tcp://127.0.0.1:0")
        print("RETURNED", flush=True)
        """)])
    try:
        r = run_py(tmp_path, f"""
            from podium.actor import Actor, attach_to_workers, enable_transport, endpoint
            enable_transport("tcp")
            class A(Actor):
                @endpoint
                def one(self):
                    return 1
            hosts = attach_to_workers(workers=["{worker.address}"])
            procs = hosts.spawn_procs(per_host={{"gpus": 1}})
            print("VALUE", procs.spawn("a", A).one.call_one().get(timeout=30), flush=True)
            hosts.shutdown().get(timeout=30)
            print("SHUT", flush=True)
            """)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "VALUE 1" in r.stdout and "SHUT" in r.stdout
        worker.proc.wait(timeout=30)
        assert worker.proc.returncode == 0, worker.text()
        assert worker.saw("RETURNED"), worker.text()
    finally:
        worker.kill()


# --- the older spelling (part 10) -------------------------------------------------------------


class Counter(Actor):
    def __init__(self, start):
        self.n = start

    @endpoint
    async def incr(self):
        self.n += 1
        return self.n

    @endpoint
    async def env(self, name):
        return os.environ.get(name)


def test_proc_mesh_gpus_is_awaitable_and_blocking():  # PN-2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)

        async def main():
            procs = await podium.actor.proc_mesh(gpus=2, env={"TEST_PN2": "yes"})
            try:
                counters = await procs.spawn("counters", Counter, 10)
                assert isinstance(counters, podium.actor.ActorMesh)
                assert dict(procs.extent) == {"hosts": 1, "gpus": 2}
                assert (await counters.incr.call()).values() == [11, 11]
                assert (await counters.env.call("TEST_PN2")).values() == ["yes", "yes"]
            finally:
                await procs.stop()

        asyncio.run(main())
        procs = podium.actor.proc_mesh(gpus=1)
        try:
            assert procs.get(timeout=T) is procs
            assert procs.spawn("c", Counter, 0).incr.call_one().get(timeout=T) == 1
        finally:
            procs.stop().get(timeout=T)
    with pytest.warns(DeprecationWarning):
        with pytest.raises(ValueError):
            podium.actor.proc_mesh(gpus=0)


def test_await_spawn_raises_when_init_fails(new_procs):
    class Broken(Actor):
        def __init__(self):
            raise RuntimeError("no")

        @endpoint
        async def x(self):
            return 1

    procs = new_procs(gpus=1)

    async def main():
        await procs.spawn("broken", Broken)

    with pytest.raises(Exception, match="no"):
        asyncio.run(main())


# --- hosts_from_config ------------------------------------------------------------------------


def test_hosts_from_config_gives_two_attached_hosts(tmp_path):
    r = run_py(tmp_path, """
        from podium.actor import Actor, enable_transport, endpoint, hosts_from_config
        import podium.job
        assert podium.job.hosts_from_config is hosts_from_config
        enable_transport("tcp")
        class A(Actor):
            @endpoint
            def one(self):
                return 1
        hosts = hosts_from_config("trainers")
        print("EXTENT", dict(hosts.extent))
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        print("VALUES", procs.spawn("a", A).one.call().get(timeout=30).values())
        """)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "VALUES [1, 1]" in r.stdout and "2" in r.stdout.split("EXTENT")[1].split("\n")[0]
