"""LG-8, SG-1, SG-2: what procs write never lands inside a line the controller writes in
pieces, whether their lines are pumped to its terminal or streamed to its log sink, and
whether its stdout is unbuffered or block-buffered. Real programs, real procs."""

from __future__ import annotations

import fcntl
import io
import os
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import CHILD_TIMEOUT_S, Worker

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from podium.actor import Actor, attach_to_workers, enable_transport, endpoint, this_host

    class Chatty(Actor):
        @endpoint
        def chat(self, n):
            for i in range(n):
                print(f"proc line {i}", flush=True)
                time.sleep(0.002)
            return n

    if sys.argv[1] == "remote":  # lines of a worker's procs, written by the output writer
        enable_transport("tcp://127.0.0.1:0")
        procs = attach_to_workers(workers=sys.argv[2:]).spawn_procs(per_host={"gpus": 2})
    else:
        procs = this_host().spawn_procs(per_host={"gpus": 2})
    if sys.argv[1] == "streamed":
        procs.logging_option(stream_to_client=True).get(timeout=30)
    mesh = procs.spawn("chatty", Chatty)
    mesh.chat.call(1).get(timeout=30)  # the procs' output is flowing
    fut = mesh.chat.call(300)
    i = 0
    deadline = time.monotonic() + 60
    while not fut.done() and time.monotonic() < deadline:
        sys.stdout.write("ctl ")
        time.sleep(0.0005)  # the pieces of one line, spread over time
        sys.stdout.write(str(i))
        sys.stdout.write(" end" + "." * 40 + "\\n")
        i += 1
    print("lines", i, "calls", sorted(fut.get(timeout=30).values()))
    procs.stop().get(timeout=30)
    """
)


@pytest.fixture
def worker():
    started = []

    def start() -> str:
        w = Worker()
        started.append(w)
        return w.address

    yield start
    for w in started:
        w.kill()


def _run(tmp_path, mode: str, unbuffered: bool, args=()) -> subprocess.CompletedProcess:
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    return subprocess.run([sys.executable, str(script), mode, *args], cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)


@pytest.mark.parametrize("mode", ["pumped", "streamed", "remote"])
@pytest.mark.parametrize("unbuffered", [True, False], ids=["unbuffered", "buffered"])
def test_proc_lines_never_split_the_controllers_lines(tmp_path, mode, unbuffered, worker):
    r = _run(tmp_path, mode, unbuffered, [worker()] if mode == "remote" else [])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    summary = next(l for l in lines if l.startswith("lines "))
    assert summary.endswith("calls [300, 300]"), summary
    count = int(summary.split()[1])
    ctl = [l for l in lines if "ctl" in l or "end..." in l]
    broken = [l for l in ctl if not re.fullmatch(r"ctl \d+ end\.{40}", l)]
    assert not broken, broken[:5]
    assert len(ctl) == count
    procs = [l for l in lines if "proc line" in l]
    assert len(procs) == 2 * 301, len(procs)
    host = r"\[\S+ \d+\] " if mode == "streamed" else ""
    point = r"'hosts': 0/1, " if mode == "remote" else ""
    pattern = host + r"\[chatty \{" + point + r"'gpus': [01]/2\}\] proc line \d+"
    bad = [l for l in procs if not re.fullmatch(pattern, l)]
    assert not bad, bad[:3]


PROMPT = textwrap.dedent(
    """
    import sys, time
    from podium._core import host
    from podium.actor import Actor, endpoint, this_host

    class Talker(Actor):
        @endpoint
        def say(self):
            print("proc says hi", flush=True)

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn("talker", Talker)
    sys.stdout.write("prompt> ")
    sys.stdout.flush()
    mesh.say.call().get(timeout=30)
    # the proc's line waits for the open line, for the gate's hold at most
    deadline = time.monotonic() + 20
    seen = b""
    while b"proc says hi" not in seen and time.monotonic() < deadline:
        time.sleep(0.02)
        seen = open(sys.argv[1], "rb").read()
    sys.stdout.write("answer\\n")
    print("hold", host.stdio_hold())
    procs.stop().get(timeout=30)
    """
)


def test_a_line_left_open_holds_proc_lines_for_the_hold_only(tmp_path):
    # stdout is a file the program reads back, to see the proc's line arrive
    out = tmp_path / "out.txt"
    script = tmp_path / "prompt.py"
    script.write_text(PROMPT)
    with open(out, "wb") as f:
        r = subprocess.run([sys.executable, str(script), str(out)], cwd=tmp_path,
                           stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.PIPE,
                           text=True, timeout=CHILD_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.startswith("prompt> [talker {'gpus': 0/1}] proc says hi\nanswer\n"), text
    assert "hold 0.5\n" in text


# --- the guard over a block-buffered stream (no gate: fd -1 is not one of the gate's) ------


class _Pipe:
    """A block-buffered text stream over a pipe, and what came out of it so far."""

    def __init__(self) -> None:
        self.r, w = os.pipe()
        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ: room for what a test writes
        os.set_blocking(self.r, False)
        self.raw = open(w, "wb", buffering=1 << 20, closefd=True)
        self.inner = io.TextIOWrapper(self.raw, encoding="utf-8", line_buffering=False,
                                      write_through=False)
        self.seen = b""

    def getvalue(self) -> bytes:
        try:
            while chunk := os.read(self.r, 1 << 20):
                self.seen += chunk
        except BlockingIOError:
            pass
        return self.seen

    def close(self) -> None:
        os.close(self.r)


@pytest.fixture
def buffered():
    """A guard over a block-buffered pipe; its fd is not the gate's 1 or 2, so marks do
    nothing and emit() writes through at once."""
    from podium._src.line_guard import LineGuard

    pipes = []

    def make():
        p = _Pipe()
        pipes.append(p)
        return LineGuard(p.inner, p.raw.fileno()), p

    yield make
    for p in pipes:
        p.close()


def test_a_block_buffered_guard_hands_over_whole_lines_only(buffered):
    g, raw = buffered()
    g.write("partial")
    assert raw.getvalue() == b""  # buffered, as the stream would
    line = "x" * 99 + "\n"
    for _ in range(100):  # 10,000 characters: past the chunk
        g.write("a ")
        g.write(line)
    g.write("open")
    got = raw.getvalue()
    assert got and got.endswith(b"\n"), got[-20:]
    assert got.startswith(b"partiala ")
    g.flush()  # an explicit flush writes the open line too
    assert raw.getvalue().endswith(b"\nopen")
    g.write(" and the rest")
    g.close()  # so does closing the stream
    assert raw.getvalue().endswith(b"\nopen and the rest")


def test_a_block_buffered_guard_loses_nothing_to_threads_printing_at_once(buffered):
    import threading

    g, raw = buffered()

    def printer(k):
        for i in range(3000):
            g.write(f"t{k} {i}\n")

    threads = [threading.Thread(target=printer, args=(k,)) for k in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch inside the guard's write as often as can be
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        sys.setswitchinterval(interval)
    g.flush()
    lines = raw.getvalue().decode().splitlines()
    assert len(lines) == 4 * 3000
    for k in range(4):  # each thread's lines whole and in its order
        mine = [int(l.split()[1]) for l in lines if l.startswith(f"t{k} ")]
        assert mine == list(range(3000))


def test_streamed_lines_follow_the_controllers_whole_lines_and_precede_its_open_one(buffered):
    g, raw = buffered()
    g.write("before\n")
    g.write("resul")
    g.emit("[h 1] [m 0] proc\n")
    assert raw.getvalue() == b"before\n[h 1] [m 0] proc\n"
    g.write("ts\n")
    g.flush()
    assert raw.getvalue() == b"before\n[h 1] [m 0] proc\nresults\n"
