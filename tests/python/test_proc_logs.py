"""Per-proc log files (python/podium/_src/proc_log.py, PL-1, PL-2), read back with
``ProcMesh.logs()`` and ``podium logs`` (python/podium/debugger/logs.py, PL-3), on this host
and across network-namespace hosts; and the issue's aggregation target: many ranks printing
the same line 100 times show a few lines per window at the controller, with the right
counts."""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import subprocess
import sys
import textwrap

from conftest import CHILD_TIMEOUT_S
from test_multihost_netns import PORT, start_workers, stop_workers

PRELUDE = textwrap.dedent("""
    import asyncio, json, logging, os, sys, time
    from podium.actor import (Actor, endpoint, this_host, enable_transport, attach_to_workers,
                              debug_controller)

    class Printer(Actor):
        @endpoint
        def say(self, text, n=1):
            for i in range(n):
                print(text.format(i=i))

        @endpoint
        def log(self, text):
            logging.getLogger("printer").warning(text)

    def say(tag, value):
        print(tag, json.dumps(value), flush=True)
    """)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path, **extra):
    return {**os.environ, "PODIUM_LOG_DIR": str(tmp_path / "logs"), **extra}


def _controller(tmp_path, body, args=(), **env):
    script = tmp_path / "controller.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                       timeout=CHILD_TIMEOUT_S * 2, stdin=subprocess.DEVNULL, cwd=tmp_path,
                       env=_env(tmp_path, **env))
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _tagged(text):
    out = {}
    for line in text.splitlines():
        tag, _, value = line.partition(" ")
        if tag.isupper() and value[:1] in "[{":
            out[tag] = json.loads(value)
    return out


def test_every_line_goes_to_the_procs_log_files_and_logs_reads_them_back(tmp_path):
    r = _controller(tmp_path, """
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        p = procs.spawn("printer", Printer)
        p.say.call("plain line").get()
        p.log.call("a logging record").get()
        procs.logging_option(stream_to_client=True, aggregate_window_sec=None).get()
        p.say.call("streamed line").get()
        procs.logging_option(stream_to_client=False).get()
        p.say.call("quiet line").get()
        say("ALL", procs.logs(tail=4).get())
        say("ONE", procs.logs(rank=1, tail=1).get())
        procs.stop().get()
        """)
    out = _tagged(r.stdout)
    # PL-1: print, logging, streamed lines and lines kept off the terminal, in order.
    shown = [line for line in (r.stdout + r.stderr).splitlines()
             if not line.startswith(("ALL ", "ONE "))]
    assert not [line for line in shown if "quiet line" in line], shown
    host = socket.gethostname()
    for rank in (0, 1):
        mine = [line for line in out["ALL"] if line.startswith(f"[gpus={rank} rank {rank} ")]
        assert len(mine) == 4, out["ALL"]
        # PL-3: each line prefixed with coordinates, rank and host, then the actor's prefix.
        p = f"[gpus={rank} rank {rank} {host}] [printer {{'gpus': {rank}/2}}] "
        assert mine[0] == p + "plain line"
        assert mine[1].startswith(p) and mine[1].endswith("a logging record")
        assert mine[2] == p + "streamed line" and mine[3] == p + "quiet line"
    assert out["ONE"] == [f"[gpus=1 rank 1 {host}] [printer {{'gpus': 1/2}}] quiet line"]
    files = glob.glob(str(tmp_path / "logs" / "proc-*.log"))
    assert len(files) == 2, files


def test_a_log_file_is_capped_and_its_tail_spans_the_rotation(tmp_path):
    cap = 4096
    r = _controller(tmp_path, """
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        p = procs.spawn("printer", Printer)
        p.say.call("line {i:05d} " + "x" * 30, 200).get()
        say("TAIL", procs.logs(tail=50).get())
        procs.stop().get()
        """, PODIUM_PROC_LOG_MAX_BYTES=str(cap))
    tail = _tagged(r.stdout)["TAIL"]
    numbers = [int(re.search(r"line (\d{5})", line).group(1)) for line in tail]
    # PL-2: the last 50 lines, in order, some of them from the rotated file.
    assert numbers == list(range(150, 200)), numbers
    current = glob.glob(str(tmp_path / "logs" / "proc-*.log"))
    rotated = glob.glob(str(tmp_path / "logs" / "proc-*.log.1"))
    assert len(current) == 1 and len(rotated) == 1, (current, rotated)
    for f in current + rotated:
        assert os.path.getsize(f) <= cap, f
    with open(current[0]) as f:
        assert len(f.read().splitlines()) < 50  # so the tail read the rotated file too


LIVE = """
    debug_controller()  # the debug server listens: podium logs reaches this job
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    p = procs.spawn("printer", Printer)
    p.say.call("before {i}", 3).get()
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "more":
            p.say.call("later line").get()
            print("SAID", flush=True)
        else:
            break
    procs.stop().get()
    """


def _read_until(c, word: str) -> None:
    """Reads the controller's stdout (its procs' lines come there too) up to ``word``."""
    seen = []
    for _ in range(100):
        line = c.stdout.readline()
        if not line:
            break
        if line.strip() == word:
            return
        seen.append(line)
    raise AssertionError(f"no {word} from the controller: {seen}")


def test_podium_logs_selects_tails_and_follows(tmp_path):
    port = str(_free_port())
    script = tmp_path / "controller.py"
    script.write_text(PRELUDE + textwrap.dedent(LIVE))
    env = _env(tmp_path, PODIUM_DEBUG_SERVER_PORT=port)
    c = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    follow = None
    try:
        _read_until(c, "READY")

        def podium_logs(*args):
            return subprocess.run([sys.executable, "-m", "podium", "logs", *args],
                                  capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                                  env=env)
        host = socket.gethostname()
        r = podium_logs("printer", "--tail", "2")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.splitlines() == [
            f"[gpus=0 rank 0 {host}] [printer {{'gpus': 0/2}}] before 1",
            f"[gpus=0 rank 0 {host}] [printer {{'gpus': 0/2}}] before 2",
            f"[gpus=1 rank 1 {host}] [printer {{'gpus': 1/2}}] before 1",
            f"[gpus=1 rank 1 {host}] [printer {{'gpus': 1/2}}] before 2",
            "podium logs: 2 proc(s)"]
        r = podium_logs("0", "--rank", "1", "--tail", "1")
        assert r.returncode == 0 and r.stdout.splitlines()[0].endswith("] before 2")
        assert r.stdout.splitlines()[0].startswith("[gpus=1 rank 1 ")
        r = podium_logs("trainer")
        assert r.returncode == 1
        assert "no proc mesh runs an actor mesh named 'trainer'" in r.stdout
        assert "printer" in r.stdout  # it names what there is
        # --follow: the lines already there, then those the procs add.
        follow = subprocess.Popen([sys.executable, "-m", "podium", "logs", "--tail", "1",
                                   "--rank", "0", "--follow"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env)
        assert follow.stdout.readline().endswith("] before 2\n")
        c.stdin.write("more\n")
        c.stdin.flush()
        _read_until(c, "SAID")
        later = follow.stdout.readline()
        assert later == f"[gpus=0 rank 0 {host}] [printer {{'gpus': 0/2}}] later line\n", later
    finally:
        if follow is not None:
            follow.kill()
            follow.wait(timeout=10)
        try:
            c.stdin.write("quit\n")
            c.stdin.flush()
            c.wait(timeout=CHILD_TIMEOUT_S)
        except Exception:
            c.kill()
            c.wait(timeout=10)
    assert c.returncode == 0, c.stderr.read()


def test_logs_of_procs_on_two_namespace_hosts(network, tmp_path):
    net = network(2)
    workers = start_workers(net, env={"PODIUM_LOG_DIR": str(tmp_path / "logs")})
    try:
        r = _controller(tmp_path, """
            enable_transport(f"tcp://{sys.argv[1]}:0")
            hosts = attach_to_workers(workers=sys.argv[2:])
            hosts.initialized.get(timeout=30)
            procs = hosts.spawn_procs(per_host={"gpus": 2})
            p = procs.spawn("printer", Printer)
            p.say.call("hello from a host").get()
            say("ALL", procs.logs(tail=1).get())
            hosts.shutdown().get()
            """, args=[net.controller_addr, *[f"tcp://{h.addr}:{PORT}" for h in net.hosts]])
    finally:
        stop_workers(workers)
    lines = _tagged(r.stdout)["ALL"]
    assert [re.match(r"\[(hosts=\d,gpus=\d) rank (\d) ", line).groups() for line in lines] == [
        ("hosts=0,gpus=0", "0"), ("hosts=0,gpus=1", "1"), ("hosts=1,gpus=0", "2"),
        ("hosts=1,gpus=1", "3")], lines
    assert all(line.endswith("] hello from a host") for line in lines), lines


AGG_RANKS = int(os.environ.get("PODIUM_TEST_AGG_RANKS", "16"))
AGG_GROUP = re.compile(r"^(?:\x1b\[33m)?\[(\d+) similar log lines\](?:\x1b\[0m)? (.*)$")


def test_many_ranks_printing_the_same_line_100_times_show_few_lines_per_window(tmp_path):
    """The issue's target (64 ranks: PODIUM_TEST_AGG_RANKS=64): at most 3 lines per window at
    the controller for the repeated line, with counts that add up to ranks x 100."""
    r = _controller(tmp_path, f"""
        procs = this_host().spawn_procs(per_host={{"gpus": {AGG_RANKS}}})
        p = procs.spawn("printer", Printer)
        procs.logging_option(stream_to_client=True, aggregate_window_sec=3).get()
        p.say.call("the same line from every rank", 100).get()
        procs.stop().get()
        """)
    windows, current = [], None
    for line in r.stdout.splitlines():
        if line.startswith(">>> Aggregated Logs"):
            current = []
        elif line.startswith("<<< Aggregated Logs"):
            windows.append(current)
            current = None
        elif current is not None and "the same line from every rank" in line:
            current.append(line)
    counts = [[int(AGG_GROUP.match(line).group(1)) for line in w] for w in windows]
    print(f"{AGG_RANKS} ranks x 100 lines: per window {[len(w) for w in windows]} line(s) at "
          f"the controller, counts {counts}")
    assert windows and all(len(w) <= 3 for w in windows), r.stdout[-3000:]
    assert sum(map(sum, counts)) == AGG_RANKS * 100, counts
    assert sum(1 for line in r.stdout.splitlines()
               if "the same line from every rank" in line) == sum(map(len, windows))
