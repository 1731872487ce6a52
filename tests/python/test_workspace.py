"""HostMesh.sync_workspace (python/podium/_src/workspace.py, WS-1..WS-4): only what changed
is sent, deletions reach the hosts, running procs import the synced code and reload it, procs
spawned later have it, and paths that would leave the workspace are refused; on this host and
across three network-namespace hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import CHILD_TIMEOUT_S
from test_multihost_netns import PORT, start_workers, stop_workers

SCENARIO = textwrap.dedent("""
    import json, os, sys, time
    from podium.actor import (Actor, endpoint, attach_to_workers, enable_transport, this_host,
                              ActorError)
    from podium.tools.config import Workspace
    from podium._src import workspace_sync

    class User(Actor):
        @endpoint
        def version(self):
            import mymod
            return mymod.version()

        @endpoint
        def alpha(self):
            import alpha
            return alpha.get()

        @endpoint
        def exists(self, rel):
            return os.path.exists(os.path.join(os.environ["WORKSPACE_DIR"], rel))

    def say(tag, value):
        print(tag, json.dumps(value), flush=True)

    src, mode = sys.argv[1], sys.argv[2]
    if mode == "local":
        hosts = this_host()
    else:
        enable_transport(f"tcp://{mode}:0")
        hosts = attach_to_workers(workers=sys.argv[3:])
        hosts.initialized.get(timeout=30)
    proj = os.path.join(src, "proj")
    os.makedirs(os.path.join(proj, "sub"))
    for i in range(20):
        with open(os.path.join(proj, "sub", f"f{i}.txt"), "w") as f:
            f.write(f"file {i}\\n")
    with open(os.path.join(proj, "dep.py"), "w") as f:
        f.write("BASE = 1\\n")
    with open(os.path.join(proj, "mymod.py"), "w") as f:
        f.write("import dep\\ndef version():\\n    return dep.BASE\\n")
    try:
        procs = hosts.spawn_procs(per_host={"gpus": 2})  # running before the first sync
        users = procs.spawn("user", User)
        users.initialized.get(timeout=30)
        ws = Workspace(dirs=[proj])
        hosts.sync_workspace(ws).get(timeout=60)
        say("FIRST", workspace_sync.last_stats())
        say("V1", sorted(users.version.call().get(timeout=30).values()))
        time.sleep(0.01)
        with open(os.path.join(proj, "dep.py"), "w") as f:  # one changed file
            f.write("BASE = 2  # changed\\n")
        hosts.sync_workspace(ws, auto_reload=True).get(timeout=60)
        say("SECOND", workspace_sync.last_stats())
        say("V2", sorted(users.version.call().get(timeout=30).values()))
        os.unlink(os.path.join(proj, "sub", "f3.txt"))
        hosts.sync_workspace(ws).get(timeout=60)
        say("THIRD", workspace_sync.last_stats())
        say("EXISTS", sorted(users.exists.call("proj/sub/f3.txt").get(timeout=30).values())
            + sorted(users.exists.call("proj/sub/f4.txt").get(timeout=30).values()))
        # Two changed modules, one importing from the other: the dependency reloads first.
        with open(os.path.join(proj, "zeta.py"), "w") as f:
            f.write("VALUE = 'old'\\n")
        with open(os.path.join(proj, "alpha.py"), "w") as f:
            f.write("from zeta import VALUE\\ndef get():\\n    return VALUE\\n")
        hosts.sync_workspace(ws).get(timeout=60)
        say("ALPHA1", sorted(users.alpha.call().get(timeout=30).values()))
        time.sleep(0.01)
        with open(os.path.join(proj, "zeta.py"), "w") as f:
            f.write("VALUE = 'new'\\n")
        with open(os.path.join(proj, "alpha.py"), "w") as f:
            f.write("from zeta import VALUE\\ndef get():\\n    return VALUE + '!'\\n")
        hosts.sync_workspace(ws, auto_reload=True).get(timeout=60)
        say("BOTH", workspace_sync.last_stats())
        say("ALPHA2", sorted(users.alpha.call().get(timeout=30).values()))
        later = hosts.spawn_procs(per_host={"gpus": 1}).spawn("later", User)
        say("LATER", sorted(later.version.call().get(timeout=30).values()))
        # WS-2: refused at the controller...
        errors = []
        try:
            Workspace(dirs={proj: "../out"})
        except ValueError as e:
            errors.append(str(e))
        try:
            Workspace(dirs={proj: "/abs"})
        except ValueError as e:
            errors.append(str(e))
        os.symlink("/etc/hostname", os.path.join(proj, "escape"))
        try:
            hosts.sync_workspace(ws).get(timeout=60)
        except ValueError as e:
            errors.append(str(e))
        os.unlink(os.path.join(proj, "escape"))
        # ...and by each host, whatever it is sent.
        host_mesh = workspace_sync._host_mesh(hosts, {})
        for bad in ("../evil.py", "/tmp/evil.py", "proj/../../evil.py"):
            try:
                host_mesh.apply.call(workspace_sync.job_key(), {bad: b"x"}, []).get(timeout=30)
                errors.append(f"NOT REFUSED {bad}")
            except ActorError as e:
                errors.append(str(e))
        say("ERRORS", errors)
    finally:
        if mode == "local":
            hosts.stop().get()
        else:
            hosts.shutdown().get()
""")


def _run(tmp_path, args, env=None):
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    src = tmp_path / "src"
    src.mkdir()
    r = subprocess.run([sys.executable, str(script), str(src), *args], capture_output=True,
                       text=True, timeout=CHILD_TIMEOUT_S * 2,
                       env={**os.environ, "PODIUM_WORKSPACE_ROOT": str(tmp_path / "hosts"),
                            **(env or {})})
    assert r.returncode == 0, r.stdout + r.stderr
    out = {}
    for line in r.stdout.splitlines():
        tag, _, value = line.partition(" ")
        if tag.isupper():
            out[tag] = json.loads(value)
    return out, r


def _check(out, n_hosts: int, procs_per_host: int = 2):
    everyone = n_hosts * procs_per_host
    files = 22  # 20 text files, dep.py, mymod.py
    # WS-1: the first sync sends every file to each host, the second the changed one.
    assert out["FIRST"]["sent"] == {str(h): files for h in range(n_hosts)}, out["FIRST"]
    assert out["V1"] == [1] * everyone
    assert out["SECOND"]["sent"] == {str(h): 1 for h in range(n_hosts)}, out["SECOND"]
    assert out["SECOND"]["deleted"] == {str(h): 0 for h in range(n_hosts)}
    # WS-4: running procs reloaded the changed module (auto_reload) and see the new code.
    assert out["V2"] == [2] * everyone, out
    assert all(names == ["dep"] for names in out["SECOND"]["reloaded"].values()), out["SECOND"]
    # Deletions reach every host, and nothing else is sent.
    assert out["THIRD"]["sent"] == {str(h): 0 for h in range(n_hosts)}, out["THIRD"]
    assert out["THIRD"]["deleted"] == {str(h): 1 for h in range(n_hosts)}, out["THIRD"]
    assert out["EXISTS"] == [False] * everyone + [True] * everyone
    # WS-4: the module that imports from the other reloads after it, and sees its new value.
    assert out["ALPHA1"] == ["old"] * everyone
    assert out["BOTH"]["sent"] == {str(h): 2 for h in range(n_hosts)}, out["BOTH"]
    assert all(names == ["zeta", "alpha"] for names in out["BOTH"]["reloaded"].values()), out
    assert out["ALPHA2"] == ["new!"] * everyone, out
    # WS-4: procs spawned after the sync import it too.
    assert out["LATER"] == [2] * n_hosts
    # WS-2: refused, each error naming the path.
    errors = out["ERRORS"]
    assert len(errors) == 6, errors
    assert "'../out'" in errors[0] and "'..'" in errors[0]
    assert "'/abs'" in errors[1] and "absolute" in errors[1]
    assert "escape" in errors[2] and "/etc/hostname" in errors[2] and "outside" in errors[2]
    for bad, err in zip(("../evil.py", "/tmp/evil.py", "proj/../../evil.py"), errors[3:]):
        assert bad in err and ("'..'" in err or "absolute" in err), err


def test_sync_workspace_on_this_host(tmp_path):
    out, _ = _run(tmp_path, ["local"])
    _check(out, 1)
    assert not (tmp_path / "evil.py").exists()


def test_sync_workspace_to_three_namespace_hosts(network, tmp_path):
    net = network(3)
    workers = start_workers(net, env={"PODIUM_WORKSPACE_ROOT": str(tmp_path / "hosts")})
    try:
        out, _ = _run(tmp_path, [net.controller_addr,
                                 *[f"tcp://{h.addr}:{PORT}" for h in net.hosts]])
    finally:
        stop_workers(workers)
    _check(out, 3)
    # Each host has a copy of its own (namespaces of one machine share the file system).
    copies = [d for d in (tmp_path / "hosts").glob("*/*") if d.is_dir()]
    assert len(copies) == 3, copies


def test_bench_workspace_one_changed_file_of_1000_to_three_namespace_hosts(network, tmp_path):
    net = network(3)
    workers = start_workers(net, env={"PODIUM_WORKSPACE_ROOT": str(tmp_path / "h")})
    try:
        r = subprocess.run([sys.executable, "-m", "podium", "bench", "workspace", "--json",
                            "--listen", f"tcp://{net.controller_addr}:0", "--workers",
                            *[f"tcp://{h.addr}:{PORT}" for h in net.hosts]],
                           capture_output=True, text=True, timeout=CHILD_TIMEOUT_S * 2,
                           env={**os.environ, "PODIUM_WORKSPACE_ROOT": str(tmp_path / "h")})
    finally:
        stop_workers(workers)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"workspace sync, 1 changed file of {result['files']} to {result['hosts']} hosts: "
          f"{result['one_change_sync_s']:.3f} s (first sync {result['first_sync_s']:.3f} s)")
    assert result["hosts"] == 3
    assert result["first_sent"] == {str(h): 1000 for h in range(3)}
    assert result["one_change_sent"] == {str(h): 1 for h in range(3)}


def test_proc_mesh_sync_workspace_points_to_host_mesh():
    from podium._src.proc_mesh import ProcMesh
    with pytest.raises(NotImplementedError, match="HostMesh.sync_workspace"):
        ProcMesh.sync_workspace(None, None)


def test_a_host_refuses_to_write_through_a_symlink_out_of_its_workspace(tmp_path, monkeypatch):
    """WS-2 on the host, WS-3: a directory of the host's copy that is a symlink to elsewhere
    is not written through; a good write replaces the file whole."""
    from podium._src import workspace
    monkeypatch.setenv("PODIUM_WORKSPACE_ROOT", str(tmp_path / "root"))
    store = workspace.HostStore("job")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, os.path.join(store.root, "link"))
    with pytest.raises(ValueError, match="outside the workspace"):
        store.apply({"ok.py": b"x = 1\n", "link/evil.py": b"boom"}, [])
    assert not (outside / "evil.py").exists()
    assert not os.path.exists(os.path.join(store.root, "ok.py"))  # nothing written
    assert store.apply({"pkg/ok.py": b"x = 1\n"}, []) == (1, 0)
    assert store.apply({"pkg/ok.py": b"x = 2\n"}, []) == (1, 0)
    with open(os.path.join(store.root, "pkg", "ok.py"), "rb") as f:
        assert f.read() == b"x = 2\n"
    assert [n for n in os.listdir(os.path.join(store.root, "pkg")) if n != "ok.py"] == []
    have = store.have()
    assert set(have) == {"pkg/ok.py"}
    # WS-1: the plan sends the missing and changed files and deletes the rest.
    local = {"pkg/ok.py": (have["pkg/ok.py"], ""), "new.py": ("abc", "")}
    assert workspace.plan(local, {**have, "old.py": "def"}) == (["new.py"], ["old.py"])
    assert store.apply({}, ["pkg/ok.py"]) == (0, 1)
    assert not os.path.exists(os.path.join(store.root, "pkg"))  # left empty: removed
