"""`podium bench ft [--json]`: fault-tolerant training (podium._src.ft, examples/ft/train.py)
with faults injected, against the same run without faults.

For a fixed run of R groups (default 3, one proc each) and N steps with one fault every K steps
(the kinds in turn: SIGKILL, a segfault through ctypes, os._exit), per fault kind: the time from
the fault to (a) the survivors' next completed step (the commit of the step the fault hit) and
(b) the replacement group's rejoin; the progress a fault costs the survivors, in steps (the
extra time of that step over the median step of the run without faults), next to the
spread of the faulty run's ordinary steps (neither faulted nor admitting a replacement); the
progress lost from the fault through the commit of the step its replacement joined (the
replacement's spawn and its read of a donor's state included), and the steps replacements
joined; throughput (steps/s) with faults against the
same run without; and the time a full restart of all groups takes (stop every group, spawn
them all again, reload the last state from the controller's copy over the data plane), in the
same run, as the reference; and what a fault costs the machine by itself: the time a group's
proc killed with SIGKILL on an idle machine takes to exit (the kernel tearing its memory
down), in steps. As root, ``--host-cuts`` runs (default 3) with a group's host cut off the
network (podium/_src/bench_ft_host.py): the time from the cut to the group's drop, to the
survivors' next step and to its replacement's rejoin. Progress goes to stderr; --json prints
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

from podium._src import bench_ft_host, ft


def _log(message: str) -> None:
    print(f"bench ft: {message}", file=sys.stderr, flush=True)


def _stats(values: List[float]) -> Optional[Dict[str, float]]:
    if not values:
        return None
    ordered = sorted(values)
    return {"n": len(values), "median": statistics.median(values), "max": max(values),
            "min": min(values), "p90": ordered[min(len(ordered) - 1, (9 * len(ordered)) // 10)]}


def _exit_costs(trainer: ft.Trainer, n: int) -> List[float]:
    """What a fault costs the machine by itself: a group like the run's (spawned the same way,
    one step computed) is killed with SIGKILL while everything else is idle, and the time to
    its exit (its pidfd readable: the kernel has torn its memory down) is taken. On a machine
    with few cores that CPU time is taken from the survivors' step."""
    out = []
    for i in range(n):
        g = trainer._spawn(trainer.R + i, 0)  # a slot the run never uses
        try:
            g.ranks[0].compute.call_one(0).get(timeout=trainer.wait_s)
            time.sleep(0.1)  # the step's replies are out; the machine is quiet
            fd = os.pidfd_open(g.pid)
            try:
                t0 = time.monotonic()
                os.kill(g.pid, signal.SIGKILL)
                if not select.select([fd], [], [], 10.0)[0]:
                    raise RuntimeError(f"proc {g.pid} did not exit within 10 s of SIGKILL")
                out.append(time.monotonic() - t0)
            finally:
                os.close(fd)
        finally:
            try:
                g.procs.stop().get(timeout=10)
            except Exception:
                pass  # it is gone: the stop has nothing left to do
    return out


def _one_run(groups: int, procs: int, steps: int, inject: Optional[str],
             step_timeout_s: float, restart: bool) -> Dict[str, Any]:
    trainer = ft.Trainer(groups=groups, procs=procs, inject=inject,
                         step_timeout_s=step_timeout_s, log=_log)
    try:
        t0 = time.monotonic()
        trainer.start()
        started = time.monotonic() - t0
        t0 = time.monotonic()
        trainer.run(steps, progress_every=max(1, steps // 5))
        wall = time.monotonic() - t0
        if inject:
            trainer.wait_rejoined(60.0)  # a fault near the end: its rejoin still counts
        full_restart = trainer.full_restart() if restart else None
        exits = _exit_costs(trainer, 3) if inject else []
    finally:
        trainer.stop()
    times = [b.t - a.t for a, b in zip(trainer.steps, trainer.steps[1:])]
    # The run's own yardstick for a fault's cost: its steps that neither met a fault nor
    # admitted a replacement (whose state transfer runs at the step's start).
    unusual = {f.step for f in trainer.faults} | {r[2] for r in trainer.rejoins}
    ordinary = [b.t - a.t for a, b in zip(trainer.steps, trainer.steps[1:])
                if b.step not in unusual]
    joins = {r[2] for r in trainer.rejoins}
    joining = [b.t - a.t for a, b in zip(trainer.steps, trainer.steps[1:]) if b.step in joins]
    return {"trainer": trainer, "start_s": started, "wall_s": wall, "steps_per_s": steps / wall,
            "step_s_median": statistics.median(times) if times else wall,
            "ordinary_step_s": _stats(ordinary),
            "joining_step_s": _stats(joining),
            "final_loss": trainer.steps[-1].loss, "full_restart_s": full_restart,
            "exit_s": exits,
            "slot_steps_lost": sum(groups - len(s.quorum) for s in trainer.steps)}


def _through_rejoin(trainer: Any, step_s: float) -> Dict[int, float]:
    """Per fault (by id) whose slot rejoined: the survivors' progress lost from the fault to
    the commit of the step its replacement joined, in steps of ``step_s``: that time less
    the steps committed in it at ``step_s`` each. What the fault's step alone does not show:
    the replacement's spawn (CPU taken from the survivors on a small machine) and the step
    it joins (the live groups wait for its read of a donor's state)."""
    out: Dict[int, float] = {}
    by_step = {s.step: s for s in trainer.steps}
    for f in trainer.faults:
        joined = [r for r in trainer.rejoins if r[0] == f.slot and r[2] > f.step]
        if not joined or min(r[2] for r in joined) not in by_step:
            continue
        at = min(r[2] for r in joined)
        took = by_step[at].t - f.t_fault
        out[id(f)] = max(0.0, took - (at - f.step + 1) * step_s) / step_s
    return out


def run(groups: int, procs: int, steps: int, every: int, kinds: List[str],
        step_timeout_s: float, host_cuts: int = 0) -> Dict[str, Any]:
    _log(f"{groups} groups x {procs} procs, {steps} steps without faults")
    clean = _one_run(groups, procs, steps, None, step_timeout_s, restart=False)
    inject = f"every={every} kinds={','.join(kinds)}"
    _log(f"the same with faults: {inject}")
    faulty = _one_run(groups, procs, steps, inject, step_timeout_s, restart=True)
    step_s = clean["step_s_median"]
    per_kind: Dict[str, Any] = {}
    through = _through_rejoin(faulty["trainer"], step_s)
    for kind in kinds:
        fs = [f for f in faulty["trainer"].faults if f.kind == kind]
        nxt = [f.t_next_step - f.t_fault for f in fs if f.t_next_step is not None]
        rej = [f.t_rejoin - f.t_fault for f in fs if f.t_rejoin is not None]
        per_kind[kind] = {
            "faults": len(fs),
            "to_next_step_s": _stats(nxt),
            "to_rejoin_s": _stats(rej),
            "steps_lost": _stats([max(0.0, t - step_s) / step_s for t in nxt]),
            "steps_lost_through_rejoin": _stats([through[id(f)] for f in fs if id(f) in through]),
            "not_rejoined": len(fs) - len(rej),
        }
    all_next = [f.t_next_step - f.t_fault for f in faulty["trainer"].faults if f.t_next_step]
    all_rej = [f.t_rejoin - f.t_fault for f in faulty["trainer"].faults if f.t_rejoin]
    worst_lost = max([max(0.0, t - step_s) / step_s for t in all_next], default=0.0)
    lost_host = (bench_ft_host.run(host_cuts, step_timeout_s, log=_log) if host_cuts > 0
                 else {"skipped": "--host-cuts 0"})
    if "runs" in lost_host:
        cuts = lost_host["runs"]
        for key in ("detect_s", "continue_s", "rejoin_s"):
            lost_host[key] = _stats([c[key] for c in cuts if c[key] is not None])
        lost_host["worst_continue_s"] = max(
            (c["continue_s"] for c in cuts if c["continue_s"] is not None), default=None)
        lost_host["all_continued"] = all(
            c["continue_s"] is not None and c["lost_step"] == c["cut_step"] for c in cuts)
    host_worst = lost_host.get("worst_continue_s")
    out = {
        "benchmark": "ft",
        "groups": groups, "procs_per_group": procs, "steps": steps, "inject": inject,
        "parameters": sum(p.numel() for p in ft.make_model(0).parameters()),
        "averaging": "controller: mean of the quorum's gradients",
        "without_faults": {k: clean[k] for k in ("start_s", "wall_s", "steps_per_s",
                                                 "step_s_median", "final_loss")},
        "with_faults": {**{k: faulty[k] for k in ("wall_s", "steps_per_s", "step_s_median",
                                                  "ordinary_step_s", "joining_step_s",
                                                  "final_loss",
                                                  "slot_steps_lost")},
                        "faults": len(faulty["trainer"].faults)},
        "throughput_ratio": faulty["steps_per_s"] / clean["steps_per_s"],
        "per_kind": per_kind,
        "full_restart_s": faulty["full_restart_s"],
        # The machine's own cost of a fault: a group's proc torn down by the kernel after
        # SIGKILL on an idle machine, and that time in steps of the run without faults.
        "proc_exit_s": _stats(faulty["exit_s"]),
        "proc_exit_steps": (statistics.median(faulty["exit_s"]) / step_s
                            if faulty["exit_s"] else None),
        "full_restart_steps": faulty["full_restart_s"] / step_s,
        # A group's host cut off the network: from the cut to the drop, to the survivors'
        # next step, to the replacement's rejoin (bench_ft_host.py).
        "lost_host": lost_host,
        "targets": {
            "survivors_lose_at_most_1_step": worst_lost <= 1.0,
            "worst_steps_lost": worst_lost,
            "worst_steps_lost_through_rejoin": max(through.values(), default=None),
            "rejoin_within_10_s": bool(all_rej) and max(all_rej) <= 10.0,
            "worst_rejoin_s": max(all_rej, default=None),
            "lost_host_survivors_continue_within_5_s": (
                None if host_worst is None else lost_host["all_continued"] and host_worst <= 5.0),
            "worst_lost_host_continue_s": host_worst,
        },
    }
    return out


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="podium bench ft", description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=3)
    p.add_argument("--procs", type=int, default=1, help="procs per group")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 300)")
    p.add_argument("--every", type=int, default=None, help="a fault every K steps (default 30)")
    p.add_argument("--kinds", default=",".join(ft.FAULT_KINDS))
    p.add_argument("--step-timeout", type=float, default=3.0)
    p.add_argument("--host-cuts", type=int, default=None,
                   help="runs with a host cut off the network, as root (default 3; 0 with --quick)")
    p.add_argument("--quick", action="store_true", help="60 steps, a fault every 15 (the test's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    steps = a.steps or (60 if a.quick else 300)
    every = a.every or (15 if a.quick else 30)
    kinds = [k for k in a.kinds.split(",") if k]
    ft.parse_inject(f"every={every} kinds={','.join(kinds)}")
    host_cuts = a.host_cuts if a.host_cuts is not None else (0 if a.quick else 3)
    r = run(a.groups, a.procs, steps, every, kinds, a.step_timeout, host_cuts)
    if a.json:
        print(json.dumps(r))
        return 0
    w, f = r["without_faults"], r["with_faults"]
    print(f"{r['groups']} groups x {r['procs_per_group']} procs, {r['parameters']} parameters, "
          f"{r['steps']} steps, {r['inject']}")
    print(f"without faults: {w['steps_per_s']:.1f} steps/s (median step "
          f"{w['step_s_median'] * 1e3:.1f} ms), final loss {w['final_loss']:.4f}")
    print(f"with {f['faults']} faults: {f['steps_per_s']:.1f} steps/s "
          f"({r['throughput_ratio']:.2f}x), final loss {f['final_loss']:.4f}")
    o = f["ordinary_step_s"]
    if o:
        print(f"  its steps without a fault or a rejoin: median {o['median'] * 1e3:.1f} ms, "
              f"p90 {o['p90'] * 1e3:.1f}, max {o['max'] * 1e3:.1f}")
    o = f["joining_step_s"]
    if o:
        print(f"  the steps a replacement joined: median {o['median'] * 1e3:.1f} ms, "
              f"max {o['max'] * 1e3:.1f}")
    for kind, k in r["per_kind"].items():
        if not k["faults"]:
            continue
        n, j, lost = k["to_next_step_s"], k["to_rejoin_s"], k["steps_lost"]
        th = k["steps_lost_through_rejoin"]
        print(f"  {kind:8s} x{k['faults']}: survivors' next step after {n['median']:.3f} s "
              f"(max {n['max']:.3f}), {lost['max']:.1f} steps lost at most; rejoin after "
              + (f"{j['median']:.2f} s (max {j['max']:.2f})" if j else "never")
              + (f"; through the rejoin {th['median']:.1f} steps lost (max {th['max']:.1f})"
                 if th else ""))
    print(f"full restart of all groups (reference): {r['full_restart_s']:.2f} s "
          f"({r['full_restart_steps']:.0f} steps)")
    e = r["proc_exit_s"]
    if e:
        print(f"a group's proc killed on an idle machine takes {e['median'] * 1e3:.1f} ms to "
              f"exit (max {e['max'] * 1e3:.1f}): {r['proc_exit_steps']:.2f} steps of CPU "
              f"taken from the survivors on a machine this small")
    h = r["lost_host"]
    if "skipped" in h:
        print(f"lost host: not measured ({h['skipped']})")
    else:
        def s(x: Optional[Dict[str, float]]) -> str:
            return "never" if x is None else f"{x['median']:.2f} s (max {x['max']:.2f})"
        print(f"lost host x{len(h['runs'])} (link cut): dropped after {s(h['detect_s'])}, "
              f"survivors' next step after {s(h['continue_s'])}, replacement rejoined after "
              f"{s(h['rejoin_s'])}; the step timeout is {h['step_timeout_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
