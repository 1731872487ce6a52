"""Streamed and aggregated proc output, as Monarch's ``ProcMesh.logging_option`` (issue 18
part 8, issue 22 part 2): with ``stream_to_client=True`` the procs send their lines to the
controller over the runtime, in batches; with ``aggregate_window_sec=W`` similar lines of a
window print once as ``[N similar log lines] <line>``; nothing is lost or doubled on stop, on
a change of option or at the controller's exit; procs on attached hosts stream the same way.

Each controller is a script of its own, run as a child process; the test reads its stdout and
stderr. Windows are long (1000 s) where a test checks what stop() or a change flushes, so
that no window closes by itself during the test."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import CHILD_TIMEOUT_S, Worker
from podium._src import log_aggregate
from podium._src.log_aggregate import Aggregator, similar

PRELUDE = textwrap.dedent("""
    import asyncio, logging, os, sys, time
    from podium.actor import Actor, endpoint, this_host, enable_transport, attach_to_workers

    class Printer(Actor):
        @endpoint
        def say(self, text, n=1):
            for _ in range(n):
                print(text)

        @endpoint
        def say_own(self, words):
            from podium.actor import current_rank
            print(words[current_rank()["gpus"]])

        @endpoint
        def log(self, level, text):
            logging.getLogger("printer").log(level, text)

    class Cleans(Printer):
        def __cleanup__(self, exc):
            print("cleanup line", flush=True)

    WORKERS = sys.argv[1:]
    """)

GROUP = re.compile(r"^(?:\x1b\[33m)?\[(\d+) similar log lines\](?:\x1b\[0m)? (.*)$", re.M)


def controller(tmp_path: Path, body: str, workers: list[str] = ()) -> subprocess.CompletedProcess:
    script = tmp_path / "controller.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    r = subprocess.run([sys.executable, str(script), *workers], capture_output=True, text=True,
                       timeout=CHILD_TIMEOUT_S, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def groups(text: str, what: str) -> list[tuple[int, str]]:
    """(count, line) of each printed group whose line contains `what`."""
    return [(int(n), line) for n, line in GROUP.findall(text) if what in line]


def lines_with(text: str, what: str) -> list[str]:
    return [line for line in text.splitlines() if what in line]


# --- the aggregator itself (no procs) ---------------------------------------------------------

def test_similar_is_monarchs_normalized_edit_distance():
    assert similar("loss 0.31 at step 100", "loss 0.31 at step 100")
    assert similar("step 1 done", "step 2 done")  # 1 edit in 11: similar, as in Monarch
    assert not similar("alpha apples", "zulu zebras")
    assert not similar("a", "b")  # 1 edit in 1
    assert similar("", "")
    assert not similar("x" * 20, "x" * 17)  # 3 edits in 20 = 0.15: not below the threshold


def test_aggregator_counts_every_line_once_in_first_seen_order():  # LG-4
    agg = Aggregator()
    for rank in range(4):
        agg.add(f"[w {{'gpus': {rank}/4}}] ", "the same line")
    agg.add("[w {'gpus': 0/4}] ", "something else entirely")
    agg.add("[w {'gpus': 3/4}] ", "the same line")
    assert len(agg) == 2
    assert agg.take() == [(5, "[w {'gpus': 0/4}] the same line"),
                          (1, "[w {'gpus': 0/4}] something else entirely")]
    assert len(agg) == 0 and agg.take() == []
    agg.add("", "again")
    block = agg.render(color=False)
    assert re.match(r">>> Aggregated Logs \(.+\) >>>\n\[1 similar log lines\] again\n"
                    r"<<< Aggregated Logs \(.+\) <<<\n$", block), block
    assert agg.render(color=False) == ""


def test_a_varied_window_compares_with_recent_groups_only():  # LG-4, the bounds
    agg = Aggregator()
    words = [f"{i:05d} " + "abcdefghij"[i % 10] * (5 + i % 7) for i in range(300)]
    for w in words:
        agg.add("", w)
    for w in words:
        agg.add("", w)  # an exact repeat finds its group whatever its age
    total = sum(n for n, _ in agg.take())
    assert total == 600
    assert log_aggregate.FUZZY_GROUPS <= log_aggregate.MAX_GROUPS


# --- streamed output of procs -----------------------------------------------------------------

def test_four_ranks_printing_the_same_line_show_one_line_with_the_count(tmp_path):  # LG-7
    r = controller(tmp_path, """
        async def main():
            pm = this_host().spawn_procs(per_host={"gpus": 4})
            p = pm.spawn("printer", Printer)
            await pm.logging_option(stream_to_client=True, aggregate_window_sec=1000)
            await p.say.call("hello from every rank")
            await p.say_own.call(["alpha apples", "bravo bears", "charlie cats", "delta dogs"])
            await pm.stop()
            print("STOPPED", flush=True)

        asyncio.run(main())
        """)
    out = r.stdout
    before_stop = out.split("STOPPED")[0]
    (n, line), = groups(before_stop, "hello from every rank")
    assert n == 4 and re.match(r"\[printer \{'gpus': [0-3]/4\}\] hello from every rank$", line)
    assert len(lines_with(out, "hello from every rank")) == 1, out
    # Different lines are shown each, with a count of 1.
    for word in ("alpha apples", "bravo bears", "charlie cats", "delta dogs"):
        assert [n for n, _ in groups(before_stop, word)] == [1], out
    assert "<<< Aggregated Logs" in before_stop


def test_lines_on_both_sides_of_a_window_boundary_print_in_two_windows(tmp_path):
    r = controller(tmp_path, """
        async def main():
            pm = this_host().spawn_procs(per_host={"gpus": 4})
            p = pm.spawn("printer", Printer)
            await pm.logging_option(stream_to_client=True, aggregate_window_sec=1)
            await p.say.call("tick tock")
            await asyncio.sleep(3)  # past the first window's close
            await p.say.call("tick tock")
            await pm.stop()

        asyncio.run(main())
        """)
    found = groups(r.stdout, "tick tock")
    # 8 lines in all, and the two calls, 3 s apart, never share a 1 s window.
    assert sum(n for n, _ in found) == 8 and len(found) >= 2, r.stdout
    assert r.stdout.count(">>> Aggregated Logs") >= 2


def test_stop_flushes_every_line_once_cleanup_output_included(tmp_path):  # LG-6, LG-7
    r = controller(tmp_path, """
        async def main():
            pm = this_host().spawn_procs(per_host={"gpus": 4})
            await pm.logging_option(stream_to_client=True, aggregate_window_sec=1000)
            p = pm.spawn("printer", Cleans)
            await asyncio.gather(*[p.say.call("has print streaming") for _ in range(5)])
            await p.say.call("chatty line", 250)
            await pm.stop()
            print("STOPPED", flush=True)
            from podium._src import log_sink
            batches = [n for m in log_sink.existing()._meshes.values()
                       for n in m.received.values()]
            print("BATCHES", max(batches), len(batches), flush=True)

        asyncio.run(main())
        """)
    before_stop, after_stop = r.stdout.split("STOPPED")
    assert [n for n, _ in groups(before_stop, "has print streaming")] == [20], r.stdout
    assert [n for n, _ in groups(before_stop, "chatty line")] == [1000], r.stdout
    assert [n for n, _ in groups(before_stop, "cleanup line")] == [4], r.stdout
    assert "similar log lines" not in after_stop  # nothing left for the exit
    # Batched: 250 lines of each proc went in a few messages, not one per line.
    most, procs = map(int, re.search(r"BATCHES (\d+) (\d+)", after_stop).groups())
    assert procs == 4 and most < 50, r.stdout


def test_level_filters_logging_not_print(tmp_path):  # LG-3
    r = controller(tmp_path, """
        async def main():
            pm = this_host().spawn_procs(per_host={"gpus": 4})
            p = pm.spawn("printer", Printer)
            await pm.logging_option(stream_to_client=True, aggregate_window_sec=1000,
                                    level=logging.ERROR)
            await p.log.call(logging.WARNING, "below the level")
            await p.log.call(logging.ERROR, "at the level")
            await p.say.call("printed anyway")
            await pm.stop()

        asyncio.run(main())
        """)
    assert "below the level" not in r.stdout + r.stderr
    (n, line), = groups(r.stderr, "at the level")  # stderr's lines print to stderr
    assert n == 4 and "[actor=<client>.<__main__.Printer printer{'gpus': " in line
    assert [n for n, _ in groups(r.stdout, "printed anyway")] == [4]
    assert not groups(r.stdout, "at the level") and not groups(r.stderr, "printed anyway")


def test_without_a_window_each_line_prints_at_once_with_host_and_pid(tmp_path):  # LG-5
    r = controller(tmp_path, """
        import socket

        async def main():
            pm = this_host().spawn_procs(per_host={"gpus": 4})
            p = pm.spawn("printer", Printer)
            other = this_host().spawn_procs(per_host={"gpus": 2})
            await pm.logging_option(stream_to_client=True, aggregate_window_sec=1000)
            await p.say.call("aggregated log line", 5)
            # Disabling aggregation prints what the window holds before it resolves.
            await pm.logging_option(stream_to_client=True, aggregate_window_sec=None)
            print("SWITCHED", flush=True)
            await p.say.call("single log line")
            await other.spawn("quiet", Printer).say.call("default line")  # never streamed
            await pm.stop()
            await other.stop()
            print("HOST", socket.gethostname(), flush=True)

        asyncio.run(main())
        """)
    out = r.stdout
    before, after = out.split("SWITCHED")
    assert [n for n, _ in groups(before, "aggregated log line")] == [20], out
    host = re.search(r"^HOST (.*)$", out, re.M).group(1)
    singles = lines_with(after, "single log line")
    assert len(singles) == 4, out
    for line in singles:
        assert re.match(rf"\[{re.escape(host)} \d+\] \[printer \{{'gpus': [0-3]/4\}}\] "
                        r"single log line$", line), line
    # A mesh that never called logging_option writes as before: prefixed, not aggregated.
    assert sorted(lines_with(out, "default line")) == [
        "[quiet {'gpus': 0/2}] default line", "[quiet {'gpus': 1/2}] default line"], out


def test_the_controllers_exit_prints_what_a_mesh_not_stopped_streamed(tmp_path):  # LG-7
    r = controller(tmp_path, """
        pm = this_host().spawn_procs(per_host={"gpus": 4})
        p = pm.spawn("printer", Printer)
        pm.logging_option(stream_to_client=True, aggregate_window_sec=1000).get(timeout=30)
        p.say.call("said before exit").get(timeout=30)
        print("LEAVING", flush=True)
        """)
    after = r.stdout.split("LEAVING")[1]
    assert [n for n, _ in groups(after, "said before exit")] == [4], r.stdout
    assert len(lines_with(r.stdout, "said before exit")) == 1


def test_procs_on_an_attached_host_stream_to_the_controller(tmp_path):
    w = Worker()
    try:
        r = controller(tmp_path, """
            enable_transport("tcp://127.0.0.1:0")
            hosts = attach_to_workers(workers=WORKERS)
            pm = hosts.spawn_procs(per_host={"gpus": 2})
            p = pm.spawn("printer", Printer)
            pm.logging_option(stream_to_client=True, aggregate_window_sec=1000).get(timeout=30)
            p.say.call("from the attached host", 3).get(timeout=30)
            pm.stop().get(timeout=30)
            print("STOPPED", flush=True)
            hosts.shutdown().get(timeout=30)
            """, [w.address])
        before_stop = r.stdout.split("STOPPED")[0]
        (n, line), = groups(before_stop, "from the attached host")
        assert n == 6 and line.startswith("[printer {'hosts': 0/1, 'gpus': "), r.stdout
        assert not w.saw("from the attached host")  # streamed, not the worker's pipes
    finally:
        w.kill()


def test_the_end_of_a_notebook_cell_prints_the_open_windows(tmp_path):  # LG-7
    # IPython's post_run_cell event, as a notebook fires it after each cell (a stand-in
    # IPython module: the hook is what is tested, not Jupyter).
    r = controller(tmp_path, """
        import types

        class Events:
            def __init__(self):
                self.callbacks = []

            def register(self, name, fn):
                assert name == "post_run_cell"
                self.callbacks.append(fn)

        shell = types.SimpleNamespace(events=Events())
        sys.modules["IPython"] = types.SimpleNamespace(get_ipython=lambda: shell)

        pm = this_host().spawn_procs(per_host={"gpus": 4})
        p = pm.spawn("printer", Printer)
        for cell in range(2):
            pm.logging_option(stream_to_client=True, aggregate_window_sec=1000).get(timeout=30)
            p.say.call(f"cell {cell} output").get(timeout=30)
            for fn in shell.events.callbacks:
                fn(None)
            print(f"END OF CELL {cell}", flush=True)
        print("REGISTERED", len(shell.events.callbacks), flush=True)
        pm.stop().get(timeout=30)
        """)
    cell0, cell1, rest = re.split(r"END OF CELL \d", r.stdout)
    assert [n for n, _ in groups(cell0, "cell 0 output")] == [4], r.stdout
    assert [n for n, _ in groups(cell1, "cell 1 output")] == [4], r.stdout
    assert "similar log lines" not in rest and "REGISTERED 1" in rest  # registered once
