"""The dashboard (docs/interactive.md): a controller program of its own serves it; `podium
dashboard` finds it through the controller's debug address (its channel, the job's secret),
and `podium dashboard --serve` serves the page in a process of its own with the data fetched
through that channel; a real headless Chromium (Debian's `chromium`) loads the page, and the
test checks that the spawned meshes, an injected failure (a proc killed with SIGKILL) and a
rank stopped in the debugger appear, then saves a screenshot.

DS-1 (message counts, in-flight calls), DS-2 (per-rank health, failures with their reports),
DS-3 (rates), DS-4 (loopback only, no token) are checked here."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request

import pytest

from conftest import Program, eventually, free_port

T = 60  # bound on each wait

PROG = textwrap.dedent('''
    import os, sys, time
    import podium
    import podium.actor
    from podium.actor import Actor, current_rank, debug_controller, endpoint, this_host

    faults = []
    podium.actor.unhandled_fault_hook = lambda f: faults.append(f)  # the job goes on


    class Counter(Actor):
        def __init__(self):
            self.n = 0

        @endpoint
        def incr(self):
            self.n += 1
            return self.n

        @endpoint
        def pid(self):
            return os.getpid()

        @endpoint
        def stop_here(self):
            breakpoint()
            return "resumed"


    if __name__ == "__main__":
        if len(sys.argv) > 1:  # argv: controller address, workers (one per namespace host)
            from podium.actor import attach_to_workers, enable_transport
            enable_transport(f"tcp://{sys.argv[1]}:0")
            hosts = attach_to_workers(workers=sys.argv[2:])
            hosts.initialized.get(timeout=30)
            per_host, other_per_host = {"gpus": 2}, {"gpus": 1}
        else:
            hosts = this_host()
            per_host, other_per_host = {"hosts": 2, "gpus": 2}, {"gpus": 2}
        ctrl = debug_controller()  # the debug server listens: `podium dashboard` reaches it
        procs = hosts.spawn_procs(per_host=per_host)
        counters = procs.spawn("counter", Counter)
        for _ in range(5):
            counters.incr.call().get(timeout=30)
        other = hosts.spawn_procs(per_host=other_per_host)
        victims = other.spawn("victim", Counter)
        pids = victims.pid.call().get(timeout=30)
        print("DASHBOARD", podium.dashboard().url, flush=True)
        stopped = counters.slice(hosts=1, gpus=0).stop_here.call_one()
        print("SESSIONS", ctrl.wait_pending_session.call_one(1).get(timeout=60), flush=True)
        os.kill(list(pids.values())[1], 9)  # the injected failure: rank 1's proc
        deadline = time.monotonic() + 60
        while not faults and time.monotonic() < deadline:
            time.sleep(0.02)
        print("FAULTS", len(faults), flush=True)
        sys.stdin.readline()  # the test looked: resume the stopped rank, and end
        podium.debug()  # reads `continue` and `quit` from stdin
        print("RESUMED", stopped.get(timeout=60), flush=True)
        procs.stop().get(timeout=30)
        other.stop().get(timeout=30)
        print("DONE", flush=True)
''')


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Debian's chromium is not installed on this machine (`make setup` installs "
                    "it with apt-get; it could not here): the dashboard test needs a real "
                    "browser")
    return path


def browse(browser: str, url: str, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    """Chromium, headless, on `url`: its JavaScript runs for 4 s of virtual time (the page
    polls the controller's JSON meanwhile); `extra` says what it outputs."""
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=4000",
         *extra, url],
        capture_output=True, text=True, timeout=T, stdin=subprocess.DEVNULL)


class Controller(Program):
    def __init__(self, tmp_path, env: dict, args: tuple = ()) -> None:
        super().__init__(tmp_path, "dash_prog.py", PROG, args, env, stdin=subprocess.PIPE)


@pytest.fixture
def controller(tmp_path):
    made = []

    def start(*args: str, **env: str) -> Controller:
        c = Controller(tmp_path, env, args)
        made.append(c)
        return c

    yield start
    for c in made:
        c.close()


def state(url: str) -> dict:
    base = url.split("?")[0]
    query = url.split("?", 1)[1] if "?" in url else ""
    with urllib.request.urlopen(base + "api/state" + ("?" + query if query else ""),
                                timeout=10) as r:
        return json.loads(r.read())


def text_of(dom: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", dom))


def test_the_dashboard_in_chromium_shows_meshes_a_killed_proc_and_a_stopped_rank(
        tmp_path, controller):
    browser = chromium()
    port = free_port()
    c = controller(PODIUM_DEBUG_SERVER_PORT=str(port))
    check_dashboard(tmp_path, c, port, browser, victim_extent={"gpus": 2}, shot_docs=True)


def test_the_dashboard_of_procs_on_namespace_hosts(tmp_path, network, controller):
    """The same job on two hosts (each a network namespace with its own worker; the
    controller in the root namespace): the procs on attached hosts, the SIGKILLed one on the
    second host, and the stopped rank show as on one host."""
    from test_multihost_netns import PORT, start_workers, stop_workers

    browser = chromium()
    net = network(2)
    workers = start_workers(net)
    try:
        port = free_port()
        c = controller(net.controller_addr, *[f"tcp://{h.addr}:{PORT}" for h in net.hosts],
                       PODIUM_DEBUG_SERVER_PORT=str(port))
        check_dashboard(tmp_path, c, port, browser, victim_extent={"hosts": 2, "gpus": 1})
    finally:
        stop_workers(workers)


def check_dashboard(tmp_path, c, port: int, browser: str, victim_extent: dict,
                    shot_docs: bool = False) -> None:
    url = c.line("DASHBOARD ").split(" ", 1)[1]
    assert url.startswith("http://127.0.0.1:") and "?" not in url  # DS-4: loopback, no token
    c.line("SESSIONS")
    assert c.line("FAULTS ") == "FAULTS 1"

    # `podium dashboard` reaches the running controller as `podium debug` does, and prints
    # the URL of the dashboard it serves.
    cli = subprocess.run([sys.executable, "-m", "podium", "dashboard", "--port", str(port)],
                         capture_output=True, text=True, timeout=T, stdin=subprocess.DEVNULL)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == url
    # `podium dashboard --serve` serves the page itself; what it shows comes from the
    # controller through the channel (DebugController.dashboard_state), as the controller's
    # own page's does.
    served = subprocess.Popen([sys.executable, "-m", "podium", "dashboard", "--port", str(port),
                               "--serve"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True)
    try:
        url2 = served.stdout.readline().strip()
        assert url2.startswith("http://127.0.0.1:") and url2 != url, served.stderr.read()
        s2 = eventually(lambda: (lambda s: s if s["stopped"] else None)(state(url2)), T,
                        "the stopped rank in the state served by `podium dashboard --serve`")
        assert {m["name"] for m in s2["actor_meshes"]} >= {"counter", "victim"}
        assert s2["controller"]["pid"] == c.proc.pid
        with urllib.request.urlopen(url2, timeout=T) as r:
            assert b"podium dashboard" in r.read()
    finally:
        served.kill()
        served.wait(timeout=T)

    # The JSON the page polls: the runtime's own state (DS-1, DS-2, DS-3).
    s = eventually(lambda: (lambda s: s if s["failures"] and s["stopped"] else None)(state(url)),
                   T, "a failure and a stopped rank in the state")
    meshes = {m["name"]: m for m in s["actor_meshes"]}
    counter, victim = meshes["counter"], meshes["victim"]
    assert counter["extent"] == {"hosts": 2, "gpus": 2}
    # DS-1: 5 calls to 4 actors, 1 call to one: 21 messages, and the stopped call in flight.
    assert counter["sent"] >= 21
    assert counter["in_flight"] == 1
    assert [r["in_flight"] for r in counter["ranks"]] == [0, 0, 1, 0]
    assert [r["health"] for r in counter["ranks"]] == ["ok", "ok", "debugger", "ok"]  # DS-2
    assert [r["health"] for r in victim["ranks"]] == ["ok", "failed"]
    failure = s["failures"][0]
    assert failure["mesh"] == "victim" and failure["rank"] == 1 and failure["kind"] == "proc"
    assert failure["signal"] == "SIGKILL" and "victim" in failure["report"]
    procs = s["proc_meshes"]
    assert [p["extent"] for p in procs] == [{"hosts": 2, "gpus": 2}, victim_extent]
    assert [p["health"] for p in procs[1]["procs"]] == ["ok", "exited"]
    assert sum(h["procs"] for h in s["hosts"]) == 6
    assert s["stopped"][0]["actor"] == "counter"  # as the debugger's `list` shows it
    assert s["stopped"][0]["actor_id"] == counter["ranks"][2]["actor"]
    assert s["stopped"][0]["function"].endswith("stop_here")
    later = state(url)
    assert later["actor_meshes"][0]["rate"] is not None  # DS-3: a second snapshot has rates

    # The page, as a real browser renders it after its script ran.
    def rendered():
        out = browse(browser, url, tmp_path, "--dump-dom")
        dom = out.stdout
        return dom if 'id="failure-table"' in dom and 'id="stopped-table"' in dom else None

    dom = eventually(rendered, T, "the page rendered with its failure and debugger tables")
    text = text_of(dom)
    assert "counter" in text and "{hosts: 2, gpus: 2}" in text
    assert "victim" in text and "SIGKILL" in text
    assert "stop_here" in text
    assert 'class="failed"' in dom and 'class="debugger"' in dom
    shot = tmp_path / "dashboard.png"
    out = browse(browser, url, tmp_path, "--window-size=1300,640", f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 10000, out.stderr[-2000:]
    print(f"dashboard screenshot: {shot}")
    # PODIUM_DASHBOARD_DOCS_SHOT=docs/images/dashboard.png refreshes the docs' image.
    if shot_docs and os.environ.get("PODIUM_DASHBOARD_DOCS_SHOT"):
        shutil.copy(shot, os.environ["PODIUM_DASHBOARD_DOCS_SHOT"])

    # The controller resumes the stopped rank and ends cleanly.
    c.proc.stdin.write("go\ncontinue\nquit\n")
    c.proc.stdin.flush()
    assert c.line("RESUMED ") == "RESUMED resumed"
    c.line("DONE")
    assert c.proc.wait(timeout=T) == 0


def test_a_dashboard_listens_on_loopback_only():
    """DS-4: another address is refused (the page has no authentication of its own; from
    another machine, `podium dashboard --serve` reaches the controller through the channel)."""
    from podium._src import dashboard as dash_mod

    with pytest.raises(ValueError, match="loopback only.*--serve"):
        dash_mod.Dashboard("0.0.0.0", 0, lambda: {})
    d = dash_mod.Dashboard("127.0.0.1", 0, lambda: {"actor_meshes": []})
    try:
        assert d.url == f"http://127.0.0.1:{d.port}/"
        with urllib.request.urlopen(d.url, timeout=10) as r:
            assert b"podium dashboard" in r.read()
        assert state(d.url) == {"actor_meshes": []}  # what fetch() returned
        # The HTTP is the C++ responder's (HT-1..HT-3): GET only, a bounded head, one
        # request per connection.
        assert raw_http(d.port, b"POST / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
        big = b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n"
        assert raw_http(d.port, big).startswith(b"HTTP/1.1 431")
        assert b"Connection: close" in raw_http(d.port, b"GET / HTTP/1.1\r\n\r\n")
    finally:
        d.stop()


def raw_http(port: int, request: bytes) -> bytes:
    """What the dashboard answers to ``request``, until it closes the connection."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=T) as s:
        s.sendall(request)
        while True:
            data = s.recv(65536)
            if not data:
                return got
            got += data


def test_call_stats_count_in_flight_calls_and_drop_done_ones():
    """DS-1 on its own: calls count until their future is done, per rank; done ones are
    dropped (so their replies are not kept alive) within a bound."""
    from podium._src import call_stats

    class Fut:
        def __init__(self):
            self.done = False

        def ready(self):
            return self.done

    mesh = "ds1-test-mesh"
    before = call_stats.messages_sent().get(mesh, 0)
    waiting = Fut()
    call_stats.call(mesh, 4, waiting, lambda: [0, 1, 2, 3])
    call_stats.sent(mesh, 2)
    assert call_stats.messages_sent()[mesh] == before + 6
    assert call_stats.in_flight()[mesh] == {"calls": 1, "ranks": {0: 1, 1: 1, 2: 1, 3: 1}}
    finished = []
    for _ in range(5000):
        f = Fut()
        call_stats.call(mesh, 1, f, lambda: [2])
        f.done = True
        finished.append(f)
    with call_stats._lock:
        kept = sum(1 for p in call_stats._pending if p[0] == mesh)
    assert kept <= max(call_stats._MIN_PRUNE_AT, 2 * 1) + 1
    assert call_stats.in_flight()[mesh]["calls"] == 1
    waiting.done = True
    assert mesh not in call_stats.in_flight()
