"""`podium bench ft`'s lost host (as root): a replica group's host cut off the network while
the job trains, and how long the survivors take to notice and go on.

Each run makes three hosts as network namespaces of this machine (podium/_src/netns.py),
starts a `podium worker` in each and a controller in a child process of its own, attached to
them over TCP. The controller trains with three groups, group i on host i (podium._src.ft);
after ``STEPS_BEFORE`` steps host 0's link is cut: every frame to and from it is dropped, with
no RST and no ICMP, as when a machine loses power or its cable. The run then reports, from
the moment the cut was made: when the controller dropped group 0 and why (`detect_s`), when
the survivors committed their first step without it (`continue_s`), and when group 0's
replacement, spawned on host 1, rejoined with their state (`rejoin_s`). The controller's
output also carries what the multi-host test checks (each step once, identical state in
every group, the replay of the step log): tests/python/test_ft.py runs `cut_once` too.
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import torch

from podium._src import ft, netns
from podium.actor import attach_to_workers, enable_transport

STEPS_BEFORE = 10  # steps trained before the cut
STEPS_AFTER = 5  # steps trained after the replacement rejoined
CUT_HOST = 0
_RESULT = "RESULT "


def cut_once(net: netns.Network, step_timeout_s: float = 3.0, timeout_s: float = 180.0,
             log: Callable[[str], None] = lambda m: None) -> Dict[str, Any]:
    """One run on ``net`` (three hosts or more, one group each): workers started, the
    controller started, host CUT_HOST cut after STEPS_BEFORE steps, everything stopped again
    (the network is the caller's). Returns the controller's report (see _controller); raises
    RuntimeError with the controller's output if it failed."""
    # One secret for the controller and the workers (SE-1 would make the controller's own only
    # once its runtime starts, after the workers).
    os.environ.setdefault("PODIUM_SECRET", secrets.token_hex(32))
    # The zygote of each worker preloads what a group's proc imports (podium._src.ft).
    workers = netns.start_workers(net, env={"PODIUM_ZYGOTE_PRELOAD": ",".join(ft.ZYGOTE_PRELOAD)})
    c: Optional[subprocess.Popen] = None
    try:
        c = subprocess.Popen(
            [sys.executable, "-m", "podium._src.bench_ft_host", net.controller_addr,
             str(step_timeout_s), *[f"tcp://{h.addr}:{netns.PORT}" for h in net.hosts]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = c.stdout.readline()
        if not line.startswith("CUT?"):
            c.kill()
            raise RuntimeError(f"the controller did not reach the cut: {line!r}\n"
                               + c.communicate(timeout=30)[1][-6000:])
        net.cut(CUT_HOST)
        t_cut = time.monotonic()  # CLOCK_MONOTONIC: the controller's clock too
        log(f"host {CUT_HOST} ({net.hosts[CUT_HOST].addr}) cut")
        out, err = c.communicate(f"{t_cut!r}\n", timeout=timeout_s)
    except subprocess.TimeoutExpired:
        c.kill()
        out, err = c.communicate(timeout=30)
        raise RuntimeError(f"the controller did not finish within {timeout_s:.0f} s of the "
                           f"cut:\n{err[-6000:]}")
    finally:
        if c is not None and c.poll() is None:
            c.kill()
            c.wait(timeout=30)
        netns.stop_workers(workers)
    lines = [x for x in out.splitlines() if x.startswith(_RESULT)]
    if c.returncode != 0 or not lines:
        raise RuntimeError(f"the controller failed (status {c.returncode}):\n{out[-3000:]}\n"
                           f"{err[-6000:]}")
    r = json.loads(lines[0][len(_RESULT):])
    r["stderr"] = err
    return r


def _s(seconds: Optional[float]) -> str:
    return "never" if seconds is None else f"{seconds:.3f} s"


def run(reps: int, step_timeout_s: float = 3.0,
        log: Callable[[str], None] = lambda m: None) -> Dict[str, Any]:
    """``reps`` runs, each on a network of its own: the figures of each (bench_ft summarizes).
    Where namespaces cannot be made (not root, no `ip`), says why and measures nothing."""
    reason = netns.unavailable_reason()
    if reason is not None:
        return {"skipped": reason}
    netns.remove_stale()
    cuts = []
    for i in range(reps):
        with netns.Network(3) as net:
            log(f"lost host {i + 1}/{reps}: 3 hosts, group i on host i, "
                f"{STEPS_BEFORE} steps, then host {CUT_HOST}'s link cut")
            r = cut_once(net, step_timeout_s, log=log)
        cut = {k: r[k] for k in ("detect_s", "detect_cause", "continue_s", "rejoin_s",
                                 "cut_step", "lost_step", "step_s_median")}
        log(f"  dropped after {_s(r['detect_s'])} ({r['detect_cause']}); survivors' step "
            f"after {_s(r['continue_s'])}; replacement rejoined after {_s(r['rejoin_s'])}")
        cuts.append(cut)
    return {"runs": cuts, "step_timeout_s": step_timeout_s}


def _controller(argv: List[str]) -> int:
    """The controller of one run: argv = controller address, step timeout, worker URLs.
    Prints "CUT?" after STEPS_BEFORE steps, reads the time of the cut from stdin, trains until
    the cut host's group is back and STEPS_AFTER steps more, and prints one RESULT line."""
    addr, step_timeout_s, workers = argv[0], float(argv[1]), argv[2:]

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    enable_transport(f"tcp://{addr}:0")
    hosts = attach_to_workers(workers=workers)
    hosts.initialized.get(timeout=60)

    def spawn(slot: int, generation: int) -> Any:
        # Group i starts on host i; a replacement goes to the next host.
        h = slot if generation == 0 else (slot + 1) % len(workers)
        return hosts.slice(hosts=slice(h, h + 1)).spawn_procs(per_host={"gpus": 1})

    tr = ft.Trainer(groups=len(workers), procs=1, spawn_procs=spawn,
                    step_timeout_s=step_timeout_s, log=log)
    try:
        tr.start()
        tr.run(STEPS_BEFORE, progress_every=0)
        print("CUT?", flush=True)
        t_cut = float(sys.stdin.readline())
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(s == CUT_HOST for s, _, _, _ in tr.rejoins):
            tr.run_step()
        tr.run(STEPS_AFTER, progress_every=0)
        drops = [(t, why) for t, slot, _, why in tr.drops if slot == CUT_HOST and t > t_cut]
        after = [s for s in tr.steps if s.t > t_cut]
        lost = next((s for s in after if CUT_HOST not in s.quorum), None)
        back = [t for s, _, _, t in tr.rejoins if s == CUT_HOST]
        states = {slot: [s for _, s in g.actors.state.call().get(timeout=60).items()]
                  for slot, g in sorted(tr.live.items())}
        infos = {slot: [i for _, i in g.actors.info.call().get(timeout=60).items()]
                 for slot, g in sorted(tr.live.items())}
        digests = {slot: sorted(set(g.actors.digest.call().get(timeout=60).values()))
                   for slot, g in tr.live.items()}
    finally:
        tr.stop()
    before = [b.t - a.t for a, b in zip(tr.steps[:STEPS_BEFORE], tr.steps[1:STEPS_BEFORE])]
    first = states[min(states)][0]
    out = {
        "steps": [[s.step, s.quorum, s.loss] for s in tr.steps],
        "faults": [],
        "rejoins": [[s, g, step] for s, g, step, _ in tr.rejoins],
        "applied": {slot: [i["applied"] for i in v] for slot, v in infos.items()},
        "generation": {slot: v[0]["generation"] for slot, v in infos.items()},
        "identical": all(torch.equal(s, first) for v in states.values() for s in v),
        "vs_reference": float((first - ft.reference(0, tr.steps)["flat"]).abs().max()),
        "digests": digests,
        "cut_step": after[0].step if after else None,
        "lost_step": lost.step if lost else None,
        "detect_s": drops[0][0] - t_cut if drops else None,
        "detect_cause": drops[0][1] if drops else None,
        "continue_s": lost.t - t_cut if lost else None,
        "rejoin_s": back[0] - t_cut if back else None,
        "step_s_median": statistics.median(before) if before else None,
    }
    print(_RESULT + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_controller(sys.argv[1:]))
