"""Fault-tolerant training (podium._src.ft, examples/ft/train.py, docs/fault_tolerance.md):
faults of every kind are survived within the step they hit, replacements rejoin with the
survivors' exact weights and optimizer state, each step is committed once, the loss with faults
tracks the fault-free loss, and `podium bench ft --json` reports its fields. A group on a
namespace host whose link is cut is dropped and replaced.

Each run is a child controller (its fault hook and its zygote's preloads are its own); every
wait is bounded; times are printed, never asserted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import CHILD_TIMEOUT_S  # noqa: E402
from podium._src import bench_ft_host, ft, netns  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 240

CHILD = textwrap.dedent("""
    import json, os, signal, sys, time
    import torch
    from podium._src import ft

    cfg = json.loads(sys.argv[1])
    R, P = cfg["groups"], cfg["procs"]
    log = lambda m: print(m, file=sys.stderr, flush=True)

    def settled(tr):
        return (len(tr.faults) >= cfg["faults"] and len(tr.live) == R
                and all(f.t_rejoin is not None for f in tr.faults))

    tr = ft.Trainer(groups=R, procs=P, inject=cfg["inject"], log=log)
    extra = {}
    try:
        tr.start()
        if cfg.get("lose_donor"):
            # Group 1's proc is killed; once its replacement is ready, the group whose stage it
            # is to read in the next step is killed too, before that step.
            tr.run(3, progress_every=0)
            os.kill(tr.live[1].pid, signal.SIGKILL)
            tr.run_step()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with tr._lock:
                    if tr._ready or tr._ready_cv.wait(0.05):
                        break
            assert tr._ready, "no replacement within 60 s"
            donor = next(g for g in tr.live.values() if g.staged == tr.step)
            extra = {"donor": donor.slot, "lost_step": tr.step}
            os.kill(donor.pid, signal.SIGKILL)
            tr.run_step()
        while tr.step < cfg["max_steps"] and not settled(tr):
            if len(tr.faults) >= cfg["faults"]:
                tr.every = 0  # the faults asked for are in: no more
            tr.run_step()
        tr.every = 0  # no more faults: train on with the full quorum
        tr.run(cfg["extra_steps"], progress_every=0)
        states, infos = {}, {}
        for slot, g in sorted(tr.live.items()):
            states[slot] = [s for _, s in g.actors.state.call().get(timeout=60).items()]
            infos[slot] = [i for _, i in g.actors.info.call().get(timeout=60).items()]
        digests = {slot: sorted(set(g.actors.digest.call().get(timeout=60).values()))
                   for slot, g in tr.live.items()}
    finally:
        tr.stop()
    first = states[min(states)][0]
    ref = ft.reference(0, tr.steps)["flat"]
    out = {
        "steps": [[s.step, s.quorum, s.loss] for s in tr.steps],
        "faults": [[f.step, f.slot, f.kind, f.t_next_step and f.t_next_step - f.t_fault,
                    f.t_rejoin and f.t_rejoin - f.t_fault] for f in tr.faults],
        "rejoins": [[s, g, step] for s, g, step, _ in tr.rejoins],
        "applied": {slot: [i["applied"] for i in v] for slot, v in infos.items()},
        "generation": {slot: v[0]["generation"] for slot, v in infos.items()},
        "identical": all(torch.equal(s, first) for v in states.values() for s in v),
        "state_floats": first.numel(),
        "vs_reference": float((first - ref).abs().max()),
        "digests": digests,
        **extra,
    }
    if cfg["clean"]:
        clean = ft.Trainer(groups=R, procs=P, log=log)
        try:
            clean.start()
            clean.run(len(tr.steps), progress_every=0)
        finally:
            clean.stop()
        out["clean"] = [[s.step, s.quorum, s.loss] for s in clean.steps]
    print("RESULT " + json.dumps(out), flush=True)
    """)


def _child(cfg: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True,
                       text=True, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-6000:]
    out = json.loads(lines[0][len("RESULT "):])
    out["stderr"] = r.stderr
    return out


def _smooth(values, window=9):
    return [sum(values[max(0, i - window + 1):i + 1]) / len(values[max(0, i - window + 1):i + 1])
            for i in range(len(values))]


def _check_run(out: dict, groups: int) -> None:
    steps = out["steps"]
    n = len(steps)
    # FT-1: every step committed once, in order.
    assert [s[0] for s in steps] == list(range(n)), steps
    # FT-1: each live group applied every step from the one it joined at, once, in order.
    joined = {slot: 0 for slot in range(groups)}
    for slot, gen, step in out["rejoins"]:
        joined[slot] = step
    for slot, per_rank in out["applied"].items():
        for applied in per_rank:
            assert applied == list(range(joined[int(slot)], n)), (slot, applied[:5], joined)
    # FT-3: the step a fault hit was completed by the others, without the failed group, and
    # the slot came back (a replacement of a later generation).
    for step, slot, kind, to_next, to_rejoin in out["faults"]:
        quorum = steps[step][1]
        assert slot not in quorum and len(quorum) == groups - 1, (step, slot, quorum)
        assert to_next is not None and to_rejoin is not None, out["faults"]
        print(f"{kind}: survivors' step after {to_next:.3f} s, rejoin after {to_rejoin:.2f} s")
    assert all(len(s[1]) == groups for s in steps[-3:]), steps[-3:]
    assert sorted(int(s) for s in out["applied"]) == list(range(groups))
    # FT-4: every proc of every group holds the same weights and optimizer state, bit for bit.
    assert out["identical"], out["digests"]
    assert len({d for v in out["digests"].values() for d in v}) == 1, out["digests"]
    # FT-2: replaying the step log (each step the mean over its quorum) in one process gives
    # the same weights and optimizer state.
    assert out["vs_reference"] < 1e-5, out["vs_reference"]


# FT-1, FT-2, FT-3, FT-4, FT-5: SIGKILL, a segfault and os._exit, each survived and replaced;
# the loss with faults tracks the loss without.
def test_every_fault_kind_is_survived_and_the_loss_tracks_the_fault_free_run():
    out = _child({"groups": 3, "procs": 1, "inject": "every=6 kinds=sigkill,segfault,exit",
                  "faults": 3, "max_steps": 400, "extra_steps": 20, "clean": True})
    kinds = [f[2] for f in out["faults"]]
    assert kinds[:3] == ["sigkill", "segfault", "exit"], out["faults"]
    _check_run(out, 3)
    # Each drop is logged with its cause, and the segfaulting proc printed where it was.
    drops = [l.split(" dropped: ", 1)[1] for l in out["stderr"].splitlines() if " dropped: " in l]
    for cause in ("was killed by signal SIGKILL (9)", "was killed by signal SIGSEGV (11)",
                  "exited with status 3"):
        assert any(d.startswith("SupervisionError: its proc (pid ") and d.endswith(cause)
                   for d in drops), drops
    assert "Fatal Python error: Segmentation fault" in out["stderr"]
    assert re.search(r"ft\.py\", line \d+ in inject_fault\n", out["stderr"]), out["stderr"][-4000:]
    assert all(g >= 1 for slot, g in out["generation"].items()
               if int(slot) in {f[1] for f in out["faults"]}), out["generation"]
    faulty = _smooth([s[2] for s in out["steps"]])
    clean = _smooth([s[2] for s in out["clean"]])
    assert len(faulty) == len(clean)
    rel = [abs(a - b) / b for a, b in zip(faulty, clean)]
    print(f"{len(rel)} steps, loss {clean[0]:.4f} -> {clean[-1]:.4f} without faults, "
          f"{faulty[-1]:.4f} with; largest relative gap {max(rel):.4f}")
    assert clean[-1] < 0.7 * clean[0]  # it learns
    assert max(rel) < 0.1 and sum(rel) / len(rel) < 0.03, rel


# FT-2, FT-3, FT-4 with two procs per group: the intra-group gloo all-reduce, a group that
# loses one proc is dropped whole and replaced.
def test_groups_of_two_procs_recover_from_a_killed_proc():
    out = _child({"groups": 2, "procs": 2, "inject": "every=5 kinds=sigkill",
                  "faults": 1, "max_steps": 300, "extra_steps": 8, "clean": False})
    _check_run(out, 2)
    assert all(len(v) == 2 for v in out["applied"].values())


# FT-3, FT-4: the group a replacement is to read its state from dies just before the step the
# replacement joins: that step is committed by the one group left, the replacement does not
# join with a state it could not check, and every slot comes back with the survivor's state.
def test_a_donor_lost_as_a_replacement_joins():
    out = _child({"groups": 3, "procs": 1, "inject": None, "faults": 0, "lose_donor": True,
                  "max_steps": 400, "extra_steps": 5, "clean": False})
    _check_run(out, 3)
    lost = out["lost_step"]
    assert out["steps"][lost][1] == [s for s in (0, 1, 2) if s not in (1, out["donor"])], \
        out["steps"][lost - 1:lost + 2]
    assert all(step > lost for slot, _, step in out["rejoins"] if slot == out["donor"]), out
    assert all(step >= lost for slot, _, step in out["rejoins"] if slot == 1), out
    drops = [l for l in out["stderr"].splitlines() if " dropped: " in l]
    assert any(f"step {lost}: group {out['donor']} " in l and "SIGKILL" in l for l in drops), \
        drops


# FT-5: a batch is a function of (seed, step, slot, rank) alone.
def test_data_depends_only_on_seed_step_slot_and_rank():
    a, b = ft.batch(0, 7, 1, 0), ft.batch(0, 7, 1, 0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for other in (ft.batch(0, 8, 1, 0), ft.batch(0, 7, 2, 0), ft.batch(0, 7, 1, 1),
                  ft.batch(1, 7, 1, 0)):
        assert not torch.equal(a[0], other[0])


def test_inject_specs():
    assert ft.parse_inject("every=5 kinds=sigkill,exit") == (5, ["sigkill", "exit"])
    assert ft.parse_inject(None) == (0, [])
    for bad in ("every=0", "every=3 kinds=boom", "often=3"):
        with pytest.raises(ValueError):
            ft.parse_inject(bad)


def test_train_example_help_and_a_short_run(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "ft" / "train.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--inject" in r.stdout, r.stderr
    png = tmp_path / "loss.png"
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "ft" / "train.py"),
                        "--steps", "30", "--inject", "every=10 kinds=exit", "--plot", str(png)],
                       capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "fault exit" in r.stdout and "final loss" in r.stdout, r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def test_bench_ft_json_report():
    # With one run of a host cut off the network where namespaces can be made (root).
    r = subprocess.run([sys.executable, "-m", "podium", "bench", "ft", "--quick", "--json",
                        "--host-cuts", "1"],
                       capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-4000:]
    (line,) = [l for l in r.stdout.splitlines() if l.strip()]
    rep = json.loads(line)
    print(json.dumps(rep, indent=1))
    assert rep["benchmark"] == "ft" and rep["groups"] == 3 and rep["steps"] == 60
    for part in ("without_faults", "with_faults"):
        assert all(_number(rep[part][k]) for k in ("wall_s", "steps_per_s", "final_loss"))
    assert rep["with_faults"]["faults"] >= 3
    o = rep["with_faults"]["ordinary_step_s"]  # the faulty run's own yardstick
    assert o["n"] >= 60 - 1 - 2 * rep["with_faults"]["faults"], o
    assert 0 < o["min"] <= o["median"] <= o["p90"] <= o["max"], o
    j = rep["with_faults"]["joining_step_s"]  # the steps replacements joined (FT-4)
    assert j["n"] >= 1 and 0 < j["min"] <= j["max"], j
    assert _number(rep["throughput_ratio"]) and _number(rep["full_restart_s"])
    for kind in ft.FAULT_KINDS:
        k = rep["per_kind"][kind]
        assert k["faults"] >= 1 and k["not_rejoined"] == 0, k
        for field in ("to_next_step_s", "to_rejoin_s", "steps_lost"):
            assert all(_number(k[field][s]) for s in ("n", "median", "max")), (kind, field)
        # None where the kind's faults rejoined only after the run's last step.
        through = k["steps_lost_through_rejoin"]
        assert through is None or all(_number(through[s]) for s in ("n", "median", "max"))
    assert any(rep["per_kind"][kind]["steps_lost_through_rejoin"] for kind in ft.FAULT_KINDS)
    assert rep["proc_exit_s"]["n"] == 3 and _number(rep["proc_exit_steps"]), rep["proc_exit_s"]
    assert 0 < rep["proc_exit_s"]["min"] <= rep["proc_exit_s"]["max"] < 10
    assert set(rep["targets"]) >= {"survivors_lose_at_most_1_step", "rejoin_within_10_s",
                                   "worst_steps_lost", "worst_rejoin_s",
                                   "worst_steps_lost_through_rejoin"}
    assert _number(rep["targets"]["worst_steps_lost_through_rejoin"])
    h, t = rep["lost_host"], rep["targets"]
    if netns.unavailable_reason() is not None:
        assert h == {"skipped": netns.unavailable_reason()}, h
        assert t["lost_host_survivors_continue_within_5_s"] is None
        return
    (run,) = h["runs"]
    assert run["lost_step"] == run["cut_step"] and h["all_continued"], h
    assert 0 < run["detect_s"] <= run["continue_s"] < run["rejoin_s"], run
    assert run["detect_cause"], run
    assert h["worst_continue_s"] == run["continue_s"] == h["continue_s"]["max"]
    assert t["lost_host_survivors_continue_within_5_s"] == (run["continue_s"] <= 5.0)


# FT-3, FT-4 across hosts: a group's host is cut off the network (frames silently dropped);
# the others finish their step without it once its gradient is late, train on, and a
# replacement on another host rejoins with their state.
def test_a_group_on_a_cut_host_is_dropped_and_replaced(network, tmp_path):
    # The run of `podium bench ft`'s lost host (bench_ft_host.py), checked here in full.
    r = bench_ft_host.cut_once(network(3), timeout_s=CHILD_TIMEOUT_S * 3)
    print(f"host cut: group 0 dropped {r['detect_s']:.3f} s after the cut "
          f"({r['detect_cause']}), survivors' step done after {r['continue_s']:.3f} s, "
          f"replacement rejoined after {r['rejoin_s']:.2f} s")
    assert r["lost_step"] == r["cut_step"], r  # the first step after the cut goes on without it
    assert r["rejoin_s"] is not None and r["generation"]["0"] >= 1, r
    assert r["detect_s"] is not None and r["detect_s"] <= r["continue_s"], r
    _check_run(r, 3)
