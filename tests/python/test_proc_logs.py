"""Per-proc log files (python/podium/_src/proc_log.py, PL-1, PL-2, PL-4, PL-5), read back with
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


FD_ACTORS = """
    import ctypes, signal, subprocess

    class Raw(Actor):
        @endpoint
        def raw(self, text):
            os.write(1, f"{text} on fd 1\\n".encode())
            os.write(2, f"{text} on fd 2\\n".encode())

        @endpoint
        def echo(self, text):
            subprocess.run(["echo", text], check=True)

        @endpoint
        def die(self, how):
            os.write(1, f"last words before {how}\\n".encode())
            print(f"printed before {how}", flush=True)
            if how == "exit":
                os._exit(1)
            if how == "segfault":
                ctypes.string_at(0)
            os.kill(os.getpid(), signal.SIGKILL)

    def poll_logs(procs, want, tries=100):
        \"\"\"procs.logs() until every line of `want` is in it (a dead proc's pump may still be
        draining its pipes), bounded.\"\"\"
        for _ in range(tries):
            got = procs.logs(tail=50).get()
            if all(any(line.endswith(w) for line in got) for w in want):
                return got
            time.sleep(0.1)
        return got
    """


def _file_lines(tmp_path):
    out = []
    for f in sorted(glob.glob(str(tmp_path / "logs" / "proc-*.log"))):
        with open(f) as fh:
            out.extend(fh.read().splitlines())
    return out


def test_what_procs_write_to_fds_1_and_2_and_their_subprocesses_is_in_their_log(tmp_path):
    r = _controller(tmp_path, textwrap.dedent(FD_ACTORS) + textwrap.dedent("""
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        raw = procs.spawn("raw", Raw)
        printer = procs.spawn("printer", Printer)
        raw.raw.call("straight").get()
        raw.echo.call("from a subprocess").get()
        printer.say.call("printed once").get()
        say("ALL", procs.logs(tail=10).get())
        procs.stop().get()
        """))
    out = _tagged(r.stdout)["ALL"]
    host = socket.gethostname()
    for rank in (0, 1):
        mine = [line for line in out if line.startswith(f"[gpus={rank} rank {rank} {host}] ")]
        texts = [line.split("] ", 1)[1] for line in mine]
        # PL-4 (PS-4: fds 1 and 2 are pumped by the spawner): os.write to fds 1 and 2 and a
        # subprocess's echo; PL-5: read after the calls,
        # every line is there.
        assert "straight on fd 1" in texts and "straight on fd 2" in texts, mine
        assert "from a subprocess" in texts, mine
        assert f"[printer {{'gpus': {rank}/2}}] printed once" in texts, mine
    # Still on the terminal (the controller's stdout / stderr) as before the pumps.
    assert r.stdout.count("straight on fd 1\n") == 2 and r.stderr.count("straight on fd 2\n") == 2
    assert r.stdout.count("from a subprocess\n") == 2
    # PL-5: a call that printed answers once the pump has its lines: they reach the terminal
    # ahead of what the controller prints after the call.
    shown = r.stdout.splitlines()
    said = [i for i, line in enumerate(shown) if line.endswith("] printed once")]
    assert len(said) == 2 and max(said) < shown.index(next(
        line for line in shown if line.startswith("ALL "))), r.stdout
    # PL-1: one line in the files per line written, no duplicates.
    lines = _file_lines(tmp_path)
    assert len(glob.glob(str(tmp_path / "logs" / "proc-*.log"))) == 2
    for text in ("straight on fd 1", "straight on fd 2", "from a subprocess", "printed once"):
        assert sum(line.endswith(text) for line in lines) == 2, (text, lines)


def test_the_last_lines_of_procs_that_die_are_in_their_logs(tmp_path):
    r = _controller(tmp_path, textwrap.dedent(FD_ACTORS) + textwrap.dedent("""
        import podium.actor
        podium.actor.unhandled_fault_hook = lambda failure: None  # the deaths are the test
        procs = this_host().spawn_procs(per_host={"gpus": 4})
        raw = procs.spawn("raw", Raw)
        for rank, how in enumerate(["exit", "segfault", "kill"]):
            try:
                raw.slice(gpus=rank).die.call_one(how).get(timeout=30)
                say("SURVIVED", how)
            except Exception as e:
                pass
        # Ranks 0-2 are dead: their files are read through rank 3 on the same host (PL-6).
        say("ALL", poll_logs(procs, [f"last words before {h}" for h in ("exit", "segfault",
                                                                        "kill")]))
        procs.stop().get()
        # All dead: read from the files on this host.
        say("AFTER", poll_logs(procs, ["last words before kill"]))
        """))
    out = _tagged(r.stdout)
    assert "SURVIVED" not in out
    for key in ("ALL", "AFTER"):
        lines = out[key]
        for rank, how in enumerate(["exit", "segfault", "kill"]):
            mine = [line.split("] ", 1)[1] for line in lines
                    if line.startswith(f"[gpus={rank} rank {rank} ")]
            if key == "ALL" or how == "kill":
                # PL-4: the os.write and the print just before the death.
                assert f"last words before {how}" in mine, (key, lines)
                assert f"[raw {{'gpus': {rank}/4}}] printed before {how}" in mine, (key, lines)
    # The segfault's backtrace (written to fd 2 by the fault handler) is in the file too.
    files = _file_lines(tmp_path)
    assert any("Segmentation fault" in line or "SIGSEGV" in line for line in files), files


def test_a_dead_procs_log_is_read_through_its_namespace_host(network, tmp_path):
    """PL-6 across hosts: the workers keep their files in a directory the controller does not
    read, so the dead proc's lines can only come through a live proc on its host."""
    net = network(2)
    workers = start_workers(net, env={"PODIUM_LOG_DIR": str(tmp_path / "host-logs")})
    try:
        r = _controller(tmp_path, textwrap.dedent(FD_ACTORS) + textwrap.dedent("""
            import podium.actor
            podium.actor.unhandled_fault_hook = lambda failure: None  # the death is the test
            enable_transport(f"tcp://{sys.argv[1]}:0")
            hosts = attach_to_workers(workers=sys.argv[2:])
            hosts.initialized.get(timeout=30)
            procs = hosts.spawn_procs(per_host={"gpus": 2})
            raw = procs.spawn("raw", Raw)
            raw.raw.call("straight").get()
            try:
                raw.slice(hosts=0, gpus=0).die.call_one("exit").get(timeout=30)
                say("SURVIVED", 1)
            except Exception:
                pass
            say("ALL", poll_logs(procs, ["last words before exit"]))
            hosts.shutdown().get()
            """), args=[net.controller_addr, *[f"tcp://{h.addr}:{PORT}" for h in net.hosts]])
    finally:
        stop_workers(workers)
    out = _tagged(r.stdout)
    assert "SURVIVED" not in out
    dead = [line.split("] ", 1)[1] for line in out["ALL"]
            if line.startswith("[hosts=0,gpus=0 rank 0 ")]
    assert dead[:2] == ["straight on fd 1", "straight on fd 2"] or \
        sorted(dead[:2]) == ["straight on fd 1", "straight on fd 2"], out["ALL"]
    assert "last words before exit" in dead, out["ALL"]
    assert "[raw {'hosts': 0/2, 'gpus': 0/2}] printed before exit" in dead, out["ALL"]
    for rank in (1, 2, 3):
        assert any(line.endswith("straight on fd 1") and f" rank {rank} " in line
                   for line in out["ALL"]), out["ALL"]
    assert not glob.glob(str(tmp_path / "logs" / "proc-*.log"))  # nothing read here


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
