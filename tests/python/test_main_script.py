"""A program run as a script: actor classes defined in __main__ travel by value
(cloudpickle), what actors print reaches the controller's terminal, and no proc outlives the
program."""

from __future__ import annotations

import os
import textwrap
import time

from conftest import run_script

SCRIPT = textwrap.dedent(
    """
    import os
    from podium.actor import Actor, endpoint, this_host

    def square(x):            # a plain function of __main__, used by the actor
        return x * x

    class Squarer(Actor):
        @endpoint
        def run(self, x):
            print(f"actor in pid {os.getpid()} squares {x}", flush=True)
            return square(x), os.getpid()

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("squarer", Squarer)
    results = mesh.run.call(7).get(timeout=20)
    print("results", [v for v, _ in results.values()])
    print("pids", " ".join(str(p) for _, p in results.values()))
    # no stop(): leaving the program must take the procs down
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_main_module_actor_prints_reach_the_controller_and_procs_exit(tmp_path):
    r = run_script(tmp_path, "prog.py", SCRIPT)
    assert r.returncode == 0, r.stderr
    assert "results [49, 49]" in r.stdout
    assert r.stdout.count("squares 7") == 2
    # The actors' lines reach the terminal as they come, before or after the program's own.
    line = next(l for l in r.stdout.splitlines() if l.startswith("pids "))
    pids = [int(p) for p in line.split()[1:]]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)
