"""The mesh debugger (docs/interactive.md): breakpoint() in actor endpoints, driven end to end
through the real `podium debug` command in a real terminal (pexpect's pty), against a
controller program of its own with a 4-rank mesh; post-mortem, async endpoints, the
in-process podium.debug(), the job's secret the channel asks of the commands (DB-8: they
attach to the controller's debug address, a listener of its C++ channel, and no Python
listener remains), and `list` with 64 stopped actors (its time is printed, not
asserted)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pexpect
import pytest

from conftest import Program, env_without_secret, free_port
from podium.debugger import commands
from podium.debugger.commands import Attach, Cast, CommandError, Continue, ListSessions, Quit

T = 60  # bound on each expect and wait

PROG = textwrap.dedent('''
    import os, sys
    import podium
    from podium.actor import Actor, current_rank, debug_controller, endpoint, this_host


    class Debugee(Actor):
        @endpoint
        def to_debug(self, base):
            rank = current_rank().rank
            x = rank * 10 + base
            breakpoint()
            y = x + 1  # LINE-Y
            return y

        @endpoint
        def ping(self):
            return "pong"


    class Other(Actor):
        @endpoint
        def ping(self):
            return current_rank().rank


    class Pid(Actor):
        @endpoint
        def pid(self):
            return os.getpid()


    class Stepper(Actor):
        @endpoint
        def run(self):
            total = 0
            breakpoint()
            for i in range(3):
                total += i
            total *= 2  # LINE-AFTER
            return total


    class AsyncDebugee(Actor):
        @endpoint
        async def to_debug(self):
            x = current_rank().rank + 100
            breakpoint()
            return x + 1  # LINE-ASYNC


    class Faulty(Actor):
        @endpoint
        def boom(self):
            z = 42 + current_rank().rank
            raise ValueError(f"boom {z}")  # LINE-RAISE


    def values(vm):
        return sorted(v for _, v in vm.items())


    if __name__ == "__main__":
        mode = sys.argv[1]
        if mode == "hosts":  # argv = [mode, controller address, workers...]
            from podium.actor import attach_to_workers, enable_transport
            enable_transport(f"tcp://{sys.argv[2]}:0")
        ctrl = debug_controller()
        if mode in ("main", "local"):
            pm = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
            dbg = pm.spawn("debugee", Debugee)
            other = pm.spawn("other", Other)
            fut = dbg.to_debug.call(5)
            print("SESSIONS", ctrl.wait_pending_session.call_one(4).get(timeout=60), flush=True)
            pending = dbg.ping.call()  # queued behind the stopped call: it waits
            print("OTHER SERVING", values(other.ping.call().get(timeout=30)), flush=True)
            print("PENDING WAITS", not pending.done(), flush=True)
            if mode == "local":
                podium.debug()
        elif mode == "exec":  # a job that runs until the file `stop` appears
            pm = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
            pids = pm.spawn("pid", Pid).pid.call().get(timeout=30)
            for point, pid in pids.items():
                print("PID", point["hosts"], point["gpus"], pid, flush=True)
            print("READY", flush=True)
            import time
            deadline = time.monotonic() + 120
            while not os.path.exists("stop") and time.monotonic() < deadline:
                time.sleep(0.05)
            fut = None
        elif mode == "hosts":  # procs on attached hosts
            hosts = attach_to_workers(workers=sys.argv[3:])
            hosts.initialized.get(timeout=30)
            pm = hosts.spawn_procs(per_host={"gpus": 2})
            fut = pm.spawn("debugee", Debugee).to_debug.call(5)
            print("SESSIONS", ctrl.wait_pending_session.call_one(4).get(timeout=60), flush=True)
        elif mode == "twins":  # two actor meshes of one name, each stopped at rank 0
            pm = this_host().spawn_procs(per_host={"gpus": 1})
            pm2 = this_host().spawn_procs(per_host={"gpus": 1})
            f1 = pm.spawn("twin", Debugee).to_debug.call_one(1)
            f2 = pm2.spawn("twin", Debugee).to_debug.call_one(2)
            print("SESSIONS", ctrl.wait_pending_session.call_one(2).get(timeout=60), flush=True)
            print("RESULT", sorted([f1.get(timeout=120), f2.get(timeout=120)]), flush=True)
            pm2.stop().get(timeout=30)
            fut = None
        elif mode == "steps":
            pm = this_host().spawn_procs(per_host={"gpus": 2})
            fut = pm.spawn("stepper", Stepper).run.call()
            print("SESSIONS", ctrl.wait_pending_session.call_one(2).get(timeout=60), flush=True)
        elif mode == "async":
            pm = this_host().spawn_procs(per_host={"gpus": 2})
            fut = pm.spawn("adbg", AsyncDebugee).to_debug.call()
            print("SESSIONS", ctrl.wait_pending_session.call_one(2).get(timeout=60), flush=True)
        elif mode == "post-mortem":
            pm = this_host().spawn_procs(per_host={"gpus": 2})
            fut = pm.spawn("faulty", Faulty).boom.call()
            print("SESSIONS", ctrl.wait_pending_session.call_one(2).get(timeout=60), flush=True)
        elif mode == "many":
            pm = this_host().spawn_procs(per_host={"gpus": 16})
            meshes = [pm.spawn(f"dbg{i}", Debugee) for i in range(4)]
            futs = [m.to_debug.call(i) for i, m in enumerate(meshes)]
            print("SESSIONS", ctrl.wait_pending_session.call_one(64).get(timeout=120),
                  flush=True)
            fut = None
            print("RESULT", sum(len(values(f.get(timeout=120))) for f in futs), flush=True)
        if fut is not None:
            try:
                print("RESULT", values(fut.get(timeout=120)), flush=True)
            except Exception as e:
                print("FAILED", type(e).__name__, str(e).replace("\\n", " | ")[:2000],
                      flush=True)
        if mode in ("main", "local"):
            print("PENDING", values(pending.get(timeout=30)), flush=True)
        pm.stop().get(timeout=30)
        print("DONE", flush=True)
''')


def _line_of(marker: str) -> int:
    for i, line in enumerate(PROG.splitlines(), 1):
        if marker in line:
            return i
    raise AssertionError(marker)


class Controller(Program):
    """The controller program, in a session of its own (killed with its procs at close)."""

    def __init__(self, tmp_path, mode: str, env: dict, args: tuple = ()) -> None:
        super().__init__(tmp_path, "prog.py", PROG, (mode, *args), env)


@pytest.fixture
def controller(tmp_path):
    made = []

    def start(mode: str, *args: str, **env: str) -> Controller:
        c = Controller(tmp_path, mode, env, args)
        made.append(c)
        return c

    yield start
    for c in made:
        c.close()


@pytest.fixture
def terminal():
    """`podium debug ARGS` in a real terminal (pexpect's pty); closed at the end."""
    made = []

    def start(*args: str, env: dict | None = None) -> pexpect.spawn:
        t = pexpect.spawn(sys.executable, ["-m", "podium", "debug", *args], encoding="utf-8",
                          timeout=T, env=env or dict(os.environ), dimensions=(50, 200))
        made.append(t)
        return t

    yield start
    for t in made:
        if t.isalive():
            t.close(force=True)


PROMPT = "podium_dbg> "


def command(t: pexpect.spawn, line: str) -> str:
    """Sends a prompt command and returns what it printed before the next prompt."""
    t.sendline(line)
    t.expect_exact(PROMPT)
    text = t.before.replace("\r\n", "\n")
    return text.split("\n", 1)[1] if text.startswith(line) else text


def pdb(t: pexpect.spawn, line: str) -> str:
    t.sendline(line)
    t.expect_exact("(Pdb) ")
    text = t.before.replace("\r\n", "\n")
    return text.split("\n", 1)[1] if text.startswith(line) else text


def rows(table: str) -> list:
    out = []
    for line in table.splitlines():
        if line.startswith("|") and not line.startswith("| Actor"):
            out.append([c.strip() for c in line.strip("|").split("|")])
    return out


# --- the prompt's commands (no processes) ---------------------------------------------------


def test_commands_and_rank_specs_parse_as_monarchs():  # DB-1
    assert commands.parse("list") == ListSessions() and commands.parse("l") == ListSessions()
    assert commands.parse("  ") is None
    assert commands.parse("attach debugee 3") == Attach("debugee", 3)
    assert commands.parse("a debugee 0") == Attach("debugee", 0)
    assert commands.parse("c") == Continue() and commands.parse("quit") == Quit()
    assert commands.parse("cast dbg ranks(1) p x") == Cast("dbg", 1, "p x")
    assert commands.parse("cast dbg ranks(1,3) n") == Cast("dbg", [1, 3], "n")
    assert commands.parse("cast dbg ranks(1:3) p x + 1") == Cast("dbg", range(1, 3), "p x + 1")
    assert commands.parse("cast dbg ranks(::2) n").ranks == range(0, sys.maxsize, 2)
    assert commands.parse("cast dbg ranks(hosts=1, gpus=(0,2)) n").ranks == {
        "hosts": 1, "gpus": [0, 2]}
    assert commands.parse("cast dbg ranks(gpus=1:4:2) n").ranks == {"gpus": range(1, 4, 2)}
    assert commands.selects({"hosts": 1, "gpus": [0, 2]}, 5, {"hosts": 1, "gpus": 2})
    assert not commands.selects({"hosts": 1}, 1, {"hosts": 0, "gpus": 1})
    assert commands.selects(range(1, 3), 2, {}) and not commands.selects([0, 3], 2, {})
    for bad, why in [("bogus", "unknown command"), ("attach dbg", "usage: attach"),
                     ("attach dbg x", "not an integer"), ("cast dbg 1 p x", "ranks(SPEC)"),
                     ("cast dbg ranks(1:3)", "no pdb command"), ("cast dbg ranks() n", "empty"),
                     ("cast dbg ranks(1 n", "no closing"), ("cast dbg ranks(1::0) n", "step"),
                     ("cast dbg ranks(hosts=1,2) n", "DIM=VALUE"), ("list 3", "no arguments")]:
        with pytest.raises(CommandError, match=re.escape(why)):
            commands.parse(bad)


# --- end to end: the CLI in a terminal against a 4-rank mesh --------------------------------


def test_debug_cli_list_attach_cast_continue_quit(controller, terminal):  # DB-2 DB-3 DB-6 DB-7
    port = free_port()
    job = controller("main", PODIUM_DEBUG_SERVER_PORT=str(port))
    assert job.line("SESSIONS") == "SESSIONS 4"
    # DB-2: other actors on the same procs serve while every rank of debugee is stopped, and
    # a call queued behind the stopped one waits (it does not fail).
    assert job.line("OTHER SERVING") == "OTHER SERVING [0, 1, 2, 3]"
    assert job.line("PENDING WAITS") == "PENDING WAITS True"

    t = terminal("--port", str(port))
    t.expect_exact(PROMPT)
    table = command(t, "list")
    got = rows(table)
    line_y = _line_of("LINE-Y")
    host = socket.gethostname()
    assert got == [["debugee", str(r), "{hosts: %d, gpus: %d}" % (r // 2, r % 2), host,
                    "prog.to_debug", str(line_y)] for r in range(4)], table
    assert "4 stopped actor(s)" in table

    # attach: a real pdb session on rank 1: print, next, print, detach.
    t.sendline("attach debugee 1")
    t.expect_exact("Attached to debug session for debugee 1")
    t.expect_exact("(Pdb) ")
    assert "-> y = x + 1" in t.before
    assert pdb(t, "p x").strip() == "15"
    assert "-> return y" in pdb(t, "n")
    assert pdb(t, "p y").strip() == "16"
    out = command(t, "detach")
    assert "Detached from debug session for debugee 1" in out
    # The session is still listed, now at the line `next` reached (DB-6).
    assert rows(command(t, "list"))[1][5] == str(line_y + 1)
    # Re-attaching shows what the session printed since its last command (DB-7).
    t.sendline("attach debugee 1")
    t.expect_exact("(Pdb) ")
    assert pdb(t, "p x * 2").strip() == "30"
    command(t, "detach")

    # cast to ranks 1:3 (ranks 1 and 2 only), to a list, and to mesh coordinates.
    out = command(t, "cast debugee ranks(1:3) p x")
    assert re.findall(r"\[debugee (\d)\]\n(\d+)", out) == [("1", "15"), ("2", "25")], out
    out = command(t, "cast debugee ranks(0,3) p rank")
    assert re.findall(r"\[debugee (\d)\]\n(\d+)", out) == [("0", "0"), ("3", "3")], out
    out = command(t, "cast debugee ranks(hosts=1, gpus=(0,1)) p x + 1")
    assert re.findall(r"\[debugee (\d)\]\n(\d+)", out) == [("2", "26"), ("3", "36")], out

    # DB-1: bad commands are refused with a message, and the prompt lives on.
    assert "unknown command 'bogus'" in command(t, "bogus")
    assert "no debug session for actor debugee rank 9" in command(t, "attach debugee 9")
    assert "no debug session for actor nosuch rank 0" in command(t, "attach nosuch 0")
    assert "no pdb command" in command(t, "cast debugee ranks(1:3)")
    assert "no stopped rank of actor debugee" in command(t, "cast debugee ranks(7) p x")
    assert "not an integer" in command(t, "cast debugee ranks(x) p x")
    help_text = command(t, "help")
    assert "attach | a ACTOR RANK" in help_text and "cast ACTOR ranks(SPEC) CMD" in help_text
    assert len(rows(command(t, "list"))) == 4

    # continue: every rank resumes; the calls return their values, the queued ones too.
    assert "resumed 4 stopped actor(s)" in command(t, "continue")
    assert job.line("RESULT") == "RESULT [6, 16, 26, 36]"
    assert job.line("PENDING [") == "PENDING ['pong', 'pong', 'pong', 'pong']"
    assert "0 stopped actor(s)" in command(t, "list")

    t.sendline("quit")
    t.expect_exact("Quitting the debugger")
    t.expect(pexpect.EOF)
    t.close()
    assert t.exitstatus == 0
    job.line("DONE")
    assert job.proc.wait(timeout=T) == 0, job.output()


def test_async_endpoint_breakpoint(controller, terminal):  # DB-2 DB-4
    port = free_port()
    job = controller("async", PODIUM_DEBUG_SERVER_PORT=str(port))
    assert job.line("SESSIONS") == "SESSIONS 2"
    t = terminal("--port", str(port))
    t.expect_exact(PROMPT)
    got = rows(command(t, "list"))
    assert [r[:2] + r[4:] for r in got] == [
        ["adbg", str(r), "prog.to_debug", str(_line_of("LINE-ASYNC"))] for r in range(2)]
    t.sendline("attach adbg 0")
    t.expect_exact("(Pdb) ")
    assert pdb(t, "p x").strip() == "100"
    # pdb's own `continue` ends this session (DB-4): back at the prompt, one left.
    t.sendline("c")
    t.expect_exact("has ended (it resumed)")
    t.expect_exact(PROMPT)
    assert [r[:2] for r in rows(command(t, "list"))] == [["adbg", "1"]]
    # One prompt at a time: a second `podium debug` takes over, and the first is told.
    t2 = terminal("--port", str(port))
    t2.expect_exact(PROMPT)
    t.expect_exact("another prompt took over this debugger")
    t.expect(pexpect.EOF)
    assert "resumed 1 stopped actor(s)" in command(t2, "continue")
    assert job.line("RESULT") == "RESULT [101, 102]"
    t2.sendline("quit")
    t2.expect(pexpect.EOF)
    assert job.proc.wait(timeout=T) == 0, job.output()


def test_post_mortem_on_an_endpoint_exception(controller, terminal):  # DB-5
    port = free_port()
    job = controller("post-mortem", PODIUM_DEBUG_SERVER_PORT=str(port),
                     PODIUM_DEBUG_POST_MORTEM="1")
    assert job.line("SESSIONS") == "SESSIONS 2"
    t = terminal("--port", str(port))
    t.expect_exact(PROMPT)
    got = rows(command(t, "list"))
    assert [r[:2] + r[4:] for r in got] == [
        ["faulty", str(r), "prog.boom", str(_line_of("LINE-RAISE"))] for r in range(2)]
    t.sendline("attach faulty 1")
    t.expect_exact("(Pdb) ")
    assert "post-mortem of ValueError: boom 43" in t.before
    assert pdb(t, "p z").strip() == "43"
    command(t, "detach")
    assert "resumed 2 stopped actor(s)" in command(t, "continue")
    # Once its session ends, the call fails as it would have.
    failed = job.line("FAILED")
    assert failed.startswith("FAILED ActorError") and "boom 4" in failed, failed
    t.sendline("quit")
    t.expect(pexpect.EOF)
    assert job.proc.wait(timeout=T) == 0, job.output()


def test_podium_debug_in_process_when_the_port_is_taken(controller, tmp_path):  # DB-9
    # Something else holds the debug server's port: breakpoints still stop actors, a warning
    # says why, and podium.debug() in the controller reaches them without a socket.
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    script = tmp_path / "prog.py"
    script.write_text(PROG)
    t = pexpect.spawn(sys.executable, [str(script), "local"], cwd=str(tmp_path),
                      encoding="utf-8", timeout=T, dimensions=(50, 200),
                      env={**os.environ, "PODIUM_DEBUG_SERVER_PORT": str(port),
                           "PODIUM_DEBUG_SERVER_HOST": "127.0.0.1"})
    try:
        t.expect_exact("cannot listen on 127.0.0.1:%d" % port)
        t.expect_exact(PROMPT)
        got = rows(command(t, "list"))
        assert [r[:2] for r in got] == [["debugee", str(r)] for r in range(4)]
        t.sendline("attach debugee 2")
        t.expect_exact("(Pdb) ")
        assert pdb(t, "p x").strip() == "25"
        command(t, "detach")
        assert "resumed 4 stopped actor(s)" in command(t, "continue")
        t.sendline("quit")
        t.expect_exact("RESULT [6, 16, 26, 36]")
        t.expect_exact("DONE")
        t.expect(pexpect.EOF)
        t.close()
        assert t.exitstatus == 0
    finally:
        busy.close()
        if t.isalive():
            t.close(force=True)


def _raw_client(port: int, send: bytes) -> bytes:
    """A peer that speaks no channel setup (a line client such as nc): what it reads until
    the controller closes the connection."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=T) as s:
        s.sendall(send)
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                got += data
        except (ConnectionResetError, socket.timeout):
            pass
    return got


def test_debug_server_off_loopback_requires_the_job_secret(controller, terminal,
                                                           tmp_path):  # DB-8
    port = free_port()
    job = controller("async", PODIUM_DEBUG_SERVER_PORT=str(port),
                     PODIUM_DEBUG_SERVER_HOST="0.0.0.0")
    assert job.line("SESSIONS") == "SESSIONS 2"
    # The controller says where clients find the secret, never the secret itself.
    said = job.line("podium: debugger: the debug server listens on 0.0.0.0:%d" % port)
    assert f"PODIUM_SECRET_FILE={os.environ['PODIUM_SECRET_FILE']}" in said, said
    # A peer that does not run the channel's setup gets nothing of the debugger: the channel
    # closes it before any frame (no prompt, no table).
    got = _raw_client(port, b"list\nhelp\n")
    assert b"podium_dbg" not in got and b"Actor" not in got and b"list" not in got, got
    # `podium debug` with another secret, or none, is refused by the channel, and says what
    # it lacks.
    wrong = tmp_path / "wrong.secret"
    wrong.write_text("0" * 64 + "\n")
    for args, env in ((("--secret-file", str(wrong)), None), ((), env_without_secret())):
        t = terminal("--host", "127.0.0.1", "--port", str(port), *args, env=env)
        t.expect_exact("asks for the job's secret")
        t.expect(pexpect.EOF)
        t.close()
        assert t.exitstatus == 1
    # `podium exec` and `podium logs` reach the job the same way, and are refused the same way.
    for cmd in (("exec", "--", "true"), ("logs",)):
        r = subprocess.run([sys.executable, "-m", "podium", cmd[0], "--host", "127.0.0.1",
                            "--port", str(port), "--secret-file", str(wrong), *cmd[1:]],
                           capture_output=True, text=True, timeout=T, stdin=subprocess.DEVNULL)
        assert r.returncode == 1 and "asks for the job's secret" in r.stderr, (cmd, r.stderr)
    assert "podium_dbg" not in job.output()
    # The controller goes on serving: with the job's secret (PODIUM_SECRET_FILE, as the
    # controller's), a client gets the prompt.
    t = terminal("--host", "127.0.0.1", "--port", str(port))
    t.expect_exact(PROMPT)
    assert len(rows(command(t, "list"))) == 2
    assert "resumed 2 stopped actor(s)" in command(t, "continue")
    assert job.line("RESULT") == "RESULT [101, 102]"
    t.sendline("quit")
    t.expect(pexpect.EOF)
    assert job.proc.wait(timeout=T) == 0, job.output()


def _tcp_listeners(pid: int) -> set:
    """The TCP ports process ``pid`` listens on (its sockets in /proc/PID/fd, matched with
    the LISTEN rows of /proc/PID/net/tcp and tcp6)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for row in f:
                    cols = row.split()
                    if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                        ports.add(int(cols[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return ports


def test_the_debug_address_is_the_channels_and_no_python_listener_remains(
        controller, terminal):  # DB-8
    # The controller's only TCP listener is the debug address, which its C++ channel serves:
    # a line client gets no text from it, and `podium debug` (attached through it) works.
    port = free_port()
    job = controller("async", PODIUM_DEBUG_SERVER_PORT=str(port))
    assert job.line("SESSIONS") == "SESSIONS 2"
    assert _tcp_listeners(job.proc.pid) == {port}
    got = _raw_client(port, b"\n")
    assert b"podium" not in got, got  # the old Python server greeted with "podium-debug v1"
    # On loopback, a command without the secret in its environment finds the secret file
    # in the note the controller left for its user (never the secret itself).
    note = os.path.join(tempfile.gettempdir(), f"podium-debug-{os.getuid()}", str(port))
    with open(note) as f:
        assert f.read().strip() == os.environ["PODIUM_SECRET_FILE"]
    assert os.stat(note).st_mode & 0o077 == 0
    t = terminal("--port", str(port), env=env_without_secret())
    t.expect_exact(PROMPT)
    assert len(rows(command(t, "list"))) == 2
    # A `podium exec` meanwhile is a client of its own, and leaves no listener behind.
    assert "resumed 2 stopped actor(s)" in command(t, "continue")
    assert job.line("RESULT") == "RESULT [101, 102]"
    assert _tcp_listeners(job.proc.pid) == {port}
    t.sendline("quit")
    t.expect(pexpect.EOF)
    assert job.proc.wait(timeout=T) == 0, job.output()


def test_list_with_64_stopped_actors(controller, terminal):  # DB-6
    port = free_port()
    job = controller("many", PODIUM_DEBUG_SERVER_PORT=str(port))
    assert job.line("SESSIONS", timeout=180) == "SESSIONS 64"
    t = terminal("--port", str(port))
    t.expect_exact(PROMPT)
    start = time.perf_counter()
    table = command(t, "list")
    took = time.perf_counter() - start
    assert len(rows(table)) == 64 and "64 stopped actor(s)" in table
    print(f"\n`list` with 64 stopped actors: {took * 1000:.1f} ms (CLI command to last row)")
    assert "resumed 64 stopped actor(s)" in command(t, "continue")
    assert job.line("RESULT", timeout=120) == "RESULT 64"
    t.sendline("quit")
    t.expect(pexpect.EOF)
    assert job.proc.wait(timeout=T) == 0, job.output()


def test_breakpoints_on_namespace_hosts(network, controller, terminal):  # DB-2 DB-7
    # Two hosts, each a network namespace with its own worker; the controller (and the
    # debugger's prompt) in the root namespace: the sessions travel over the job's TCP
    # channels.
    from test_multihost_netns import PORT, start_workers, stop_workers

    net = network(2)
    workers = start_workers(net)
    try:
        port = free_port()
        job = controller("hosts", net.controller_addr,
                         *[f"tcp://{h.addr}:{PORT}" for h in net.hosts],
                         PODIUM_DEBUG_SERVER_PORT=str(port))
        assert job.line("SESSIONS") == "SESSIONS 4"
        t = terminal("--port", str(port))
        t.expect_exact(PROMPT)
        got = rows(command(t, "list"))
        assert [r[:3] for r in got] == [
            ["debugee", str(r), "{hosts: %d, gpus: %d}" % (r // 2, r % 2)] for r in range(4)]
        t.sendline("attach debugee 3")
        t.expect_exact("(Pdb) ")
        assert pdb(t, "p x").strip() == "35"
        command(t, "detach")
        out = command(t, "cast debugee ranks(hosts=1) p x")
        assert re.findall(r"\[debugee (\d)\]\n(\d+)", out) == [("2", "25"), ("3", "35")], out
        # podium exec reaches the procs on both hosts while their debugee actors are stopped
        # (DB-10).
        rc, out = run_exec(port, "--all", "--", "echo", "hi")
        assert rc == 0, out
        assert sorted(re.findall(r"^\[(hosts=\d,gpus=\d)\] hi$", out, re.M)) == [
            f"hosts={h},gpus={g}" for h in range(2) for g in range(2)], out
        assert "resumed 4 stopped actor(s)" in command(t, "continue")
        assert job.line("RESULT") == "RESULT [6, 16, 26, 36]"
        t.sendline("quit")
        t.expect(pexpect.EOF)
        assert job.proc.wait(timeout=T) == 0, job.output()
    finally:
        stop_workers(workers)


# --- podium exec ------------------------------------------------------------------------------


def run_exec(port: int, *args: str) -> tuple:
    """`podium exec --port PORT ARGS...` in a terminal: (exit status, what it printed)."""
    t = pexpect.spawn(sys.executable, ["-m", "podium", "exec", "--port", str(port), *args],
                      encoding="utf-8", timeout=T, dimensions=(50, 200))
    t.expect(pexpect.EOF)
    t.close()
    return t.exitstatus, t.before.replace("\r\n", "\n")


def test_podium_exec_all_one_point(controller, terminal, tmp_path):  # DB-10
    port = free_port()
    job = controller("exec", PODIUM_DEBUG_SERVER_PORT=str(port))
    job.line("READY")
    pids = {}
    for line in job.lines:
        if line.startswith("PID "):
            _, h, g, pid = line.split()
            pids[(int(h), int(g))] = int(pid)
    assert len(pids) == 4

    def podium_exec(*args: str) -> tuple:
        return run_exec(port, *args)

    # Each proc runs the command: its shell's parent is the proc itself.
    rc, out = podium_exec("--all", "--", "echo", "parent", "$PPID")
    assert rc == 0, out
    got = re.findall(r"^\[hosts=(\d),gpus=(\d)\] parent (\d+)$", out, re.M)
    assert sorted((int(h), int(g), int(p)) for h, g, p in got) == sorted(
        (h, g, p) for (h, g), p in pids.items()), out
    assert "podium exec: 4 proc(s), 0 failed" in out
    rc, out = podium_exec("--one", "--", "echo", "one")
    assert rc == 0 and re.findall(r"^\[.*\] one$", out, re.M) == ["[hosts=0,gpus=0] one"], out
    rc, out = podium_exec("--point", "hosts=1,gpus=0", "--", "echo $PPID; echo two lines")
    assert rc == 0, out
    assert re.findall(r"^\[(.*)\] (.*)$", out, re.M) == [
        ("hosts=1,gpus=0", str(pids[(1, 0)])), ("hosts=1,gpus=0", "two lines")], out
    rc, out = podium_exec("--point", "gpus=1", "--", "exit 3")
    assert rc == 1, out
    assert "[hosts=0,gpus=1] exited with status 3" in out
    assert "podium exec: 2 proc(s), 2 failed" in out
    rc, out = podium_exec("--point", "hosts=5", "--", "true")
    assert rc == 1 and "error: no proc matches {'hosts': 5}" in out, out
    assert "'hosts': 2, 'gpus': 2" in out, out
    rc, out = podium_exec("--point", "1:3", "--", "true")
    assert rc == 2, out
    # exec does not take the prompt over: a `podium debug` prompt lives through it.
    t = terminal("--port", str(port))
    t.expect_exact(PROMPT)
    rc, out = podium_exec("--one", "--", "true")
    assert rc == 0, out
    assert "0 stopped actor(s)" in command(t, "list")
    t.sendline("quit")
    t.expect(pexpect.EOF)
    (tmp_path / "stop").write_text("")
    job.line("DONE")
    assert job.proc.wait(timeout=T) == 0, job.output()


def test_two_actor_meshes_of_one_name_are_listed_apart(controller, terminal):  # DB-6
    port = free_port()
    job = controller("twins", PODIUM_DEBUG_SERVER_PORT=str(port))
    assert job.line("SESSIONS") == "SESSIONS 2"
    t = terminal("--port", str(port))
    t.expect_exact(PROMPT)
    got = rows(command(t, "list"))
    assert sorted(r[0] for r in got) == ["twin", "twin.2"], got
    xs = set()
    for name in ("twin", "twin.2"):
        t.sendline(f"attach {name} 0")
        t.expect_exact("(Pdb) ")
        xs.add(pdb(t, "p x").strip())
        command(t, "detach")
    assert xs == {"1", "2"}
    assert "resumed 2 stopped actor(s)" in command(t, "continue")
    assert job.line("RESULT") == "RESULT [2, 3]"
    t.sendline("quit")
    t.expect(pexpect.EOF)
    assert job.proc.wait(timeout=T) == 0, job.output()


def test_sessions_end_with_their_call_and_pdb_quit_fails_it(controller, terminal):  # DB-4
    port = free_port()
    job = controller("steps", PODIUM_DEBUG_SERVER_PORT=str(port))
    assert job.line("SESSIONS") == "SESSIONS 2"
    t = terminal("--port", str(port))
    t.expect_exact(PROMPT)
    after = _line_of("LINE-AFTER")
    # Rank 0: a breakpoint set in pdb keeps the session through `c`; it stops there, and the
    # session ends when the call returns (with the breakpoint still set).
    t.sendline("attach stepper 0")
    t.expect_exact("(Pdb) ")
    assert "Breakpoint 1 at" in pdb(t, f"b {after}")
    assert f"({after})run()" in pdb(t, "c")
    assert rows(command(t, "detach")) == []
    assert [r[:2] + r[5:] for r in rows(command(t, "list"))] == [
        ["stepper", "0", str(after)], ["stepper", "1", str(after - 2)]]
    t.sendline("attach stepper 0")
    t.expect_exact("(Pdb) ")
    assert pdb(t, "p total").strip() == "3"
    t.sendline("c")
    t.expect_exact("The debug session of stepper 0")
    t.expect_exact(PROMPT)
    assert [r[:2] for r in rows(command(t, "list"))] == [["stepper", "1"]]
    # Rank 1: pdb's quit ends its session and fails its call with BdbQuit.
    t.sendline("attach stepper 1")
    t.expect_exact("(Pdb) ")
    t.sendline("q")
    t.expect_exact("has ended")
    t.expect_exact(PROMPT)
    assert "0 stopped actor(s)" in command(t, "list")
    failed = job.line("FAILED")
    assert "BdbQuit" in failed, failed
    t.sendline("quit")
    t.expect(pexpect.EOF)
    assert job.proc.wait(timeout=T) == 0, job.output()
