"""Stopping a hung actor on an attached host kills its proc (ME-8 on attached hosts, HA-11).

A kill from a process that is not the worker's controller is refused and logged: the C++
test host_agent_test (HostAgent.AKillFromAnotherProcIsRefusedAndLogged) sends one over the
wire, since Python has no way to send a raw system message.

The worker is a real `python -m podium worker`; the controller is a script of its own (it runs
on TCP, enable_transport). Before system messages carried their sender, the worker ignored
every `host_kill` (it checked an empty sender against its controller), so `ActorMesh.stop()`
of an actor hung in an endpoint resolved while its proc lived on until the controller left.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from conftest import CHILD_TIMEOUT_S, Worker, gone_within

CONTROLLER = textwrap.dedent("""
    import os, sys, threading, time
    from podium.actor import Actor, endpoint, attach_to_workers, enable_transport
    import podium._src.actor_mesh as actor_mesh

    actor_mesh.STOP_GRACE_S = 1.0  # the stop escalates to a kill after 1 s

    class Hang(Actor):
        @endpoint
        def pid(self):
            return os.getpid()

        @endpoint
        def hang(self):
            time.sleep(3600)

    enable_transport("tcp://127.0.0.1:0")
    hosts = attach_to_workers(workers=sys.argv[1:])
    hosts.initialized.get(timeout=30)
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    am = procs.spawn("hang", Hang)
    pid = am.pid.call_one().get(timeout=30)
    print("PID", pid, flush=True)
    am.hang.broadcast()
    time.sleep(0.3)  # the endpoint runs
    t = time.monotonic()
    am.stop().get(timeout=30)
    # Still attached: a proc that lives on is the worker ignoring the kill, not the detach
    # of a controller that exits.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print("GONE after %.1f s" % (time.monotonic() - t), flush=True)
            break
        time.sleep(0.05)
    else:
        print("ALIVE", flush=True)
    """)


# ME-8, HA-11: the controller's host_kill reaches the worker with its sender, and the worker
# kills the proc within the grace (plus the time to see it go).
def test_stop_of_a_hung_actor_on_an_attached_host_kills_its_proc(tmp_path):
    w = Worker()
    try:
        script = tmp_path / "controller.py"
        script.write_text(CONTROLLER)
        r = subprocess.run([sys.executable, str(script), w.address], capture_output=True,
                           text=True, timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "PID" in r.stdout, out
        pid = int(r.stdout.split("PID", 1)[1].split()[0])
        assert "GONE" in r.stdout, out
        assert "did not stop within" in r.stderr, out  # the controller said it killed it
        assert not gone_within([pid], 10)
        # The worker did not refuse its own controller's kill.
        assert not w.saw("refused host_kill"), w.text()
    finally:
        w.kill()
