"""examples/notebook.ipynb, executed in a real Jupyter kernel (ipykernel, driven by nbclient):
it starts a persistent job, spawns procs and actors, the kernel is restarted at the cell
tagged ``restart-kernel``, and the notebook re-attaches to the same procs and actors with
their state. Checked in the executed notebook's outputs:

- NB-1: what the actors print shows in the outputs of the cell whose call made them print
  it, aggregated lines included, flushed at the end of that cell; after the restart, with
  no wait for lines the procs sent to the kernel before;
- NB-2: after the restart the same proc pids answer and a counter goes on from its value.

The job is killed at the end even when a cell failed (through its state file).

The same notebook runs across two network-namespace hosts (NB-1, NB-2, HA-7): the kernel attaches to
persistent workers in the namespaces (``PODIUM_NOTEBOOK_WORKERS``), is restarted, and
re-attaches to the same remote procs and actors, with the actors' lines in the cells."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
from nbclient.util import run_sync  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"
CELL_TIMEOUT_S = 90


def _text(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o.get("text", ""))
        elif o.get("output_type") == "error":
            out.append(f"ERROR {o.get('ename')}: {o.get('evalue')}\n")
        elif "data" in o:
            out.append(o["data"].get("text/plain", ""))
    return re.sub(r"\x1b\[[0-9;]*m", "", "".join(out))


def _pids(text: str) -> list:
    m = re.search(r"proc pids: \[([0-9, ]+)\]", text)
    assert m, text
    return [int(x) for x in m.group(1).split(",")]


def _run_notebook(tmp_path, state):
    """Executes the notebook with a kernel restart at its marked cell: (the code cells' texts,
    the dashboard's state read while the kernel was idle)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    restarts = 0
    dashboard = None
    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                tags = cell.get("metadata", {}).get("tags", [])
                if "restart-kernel" in tags:
                    # As Jupyter's Restart: the kernel shuts down cleanly, then starts again.
                    run_sync(client.km.restart_kernel)(now=False)
                    run_sync(client.kc.wait_for_ready)(timeout=CELL_TIMEOUT_S)
                    restarts += 1
                    definitions = next(i for i, c in enumerate(nb.cells)
                                       if "definitions" in c.get("metadata", {}).get("tags", []))
                    client.execute_cell(nb.cells[definitions], definitions)
                    continue
                if cell.cell_type == "code":
                    client.execute_cell(cell, index)
                if "dashboard" in tags:  # the kernel serves it while idle: look at it
                    dashboard = _dashboard_state(_text(cell))
    finally:
        nbformat.write(nb, tmp_path / "executed.ipynb")  # to read when it failed
        if state.exists():  # a cell failed before job.kill(): end the job anyway
            from podium.job import job_load

            job_load(str(state)).kill()
    assert restarts == 1
    texts = [_text(c) for c in nb.cells if c.cell_type == "code"]
    for t in texts:
        assert "ERROR" not in t and "Traceback" not in t, "\n---\n".join(texts)
    return texts, dashboard


def _check_cells(texts):
    """NB-1 and NB-2 in the executed cells; returns the pids of the procs."""
    start, counts, hello, dash, reattach, counts_after, end = texts[1:]
    # NB-1: each cell shows what its own calls made the actors print, and only that.
    assert "count is now 10" in counts and "[4 similar log lines]" in counts, counts
    assert "counts: [10, 10, 10, 10]" in counts
    assert "hello from a counter" in hello and "[4 similar log lines]" in hello, hello
    assert "count is now" not in hello and "hello from a counter" not in counts
    assert "count is now 15" in counts_after, counts_after
    # NB-2: the same procs after the restart, and the counters kept their state.
    assert _pids(reattach) == _pids(start)
    assert "did not reach" not in reattach, reattach  # NB-1: nothing waited for
    assert "counts: [15, 15, 15, 15]" in counts_after
    assert "job ended" in end
    return _pids(start)


def test_the_notebook_keeps_its_actors_across_a_kernel_restart(tmp_path, monkeypatch):
    state = tmp_path / "job.json"
    monkeypatch.setenv("PODIUM_NOTEBOOK_JOB", str(state))
    monkeypatch.setenv("PODIUM_HOST_ADDR", "127.0.0.1")
    monkeypatch.delenv("PODIUM_NOTEBOOK_WORKERS", raising=False)
    for k in ("PODIUM_SECRET", "PODIUM_SECRET_FILE"):  # the job makes its own (SE-4)
        monkeypatch.delenv(k, raising=False)
    texts, dashboard = _run_notebook(tmp_path, state)
    pids = _check_cells(texts)
    assert not state.exists()
    # The dashboard the notebook served showed its mesh, with the calls it had sent.
    meshes = {m["name"]: m for m in dashboard["actor_meshes"]}
    assert meshes["counter"]["extent"] == {"hosts": 2, "gpus": 2}
    assert meshes["counter"]["sent"] >= 12 and dashboard["failures"] == []
    for pid in pids:
        assert not _alive_within(pid), f"proc {pid} outlived job.kill()"


def test_the_notebook_across_two_namespace_hosts_keeps_its_actors_across_a_restart(
        tmp_path, monkeypatch, network):
    """NB-1, NB-2 and HA-7 across hosts: the kernel (on the controller's side of the network)
    drives persistent workers in two network namespaces; after the restart it re-attaches to
    the same remote procs and actors, and their lines are in the cells."""
    from test_multihost_netns import PORT, start_workers, stop_workers

    net = network(2)
    workers = start_workers(net, persistent=True)
    try:
        state = tmp_path / "job.json"  # unused on given workers: must stay absent
        monkeypatch.setenv("PODIUM_NOTEBOOK_JOB", str(state))
        monkeypatch.setenv("PODIUM_NOTEBOOK_WORKERS",
                           " ".join(f"tcp://{h.addr}:{PORT}" for h in net.hosts))
        monkeypatch.setenv("PODIUM_NOTEBOOK_TRANSPORT", f"tcp://{net.controller_addr}:0")
        texts, dashboard = _run_notebook(tmp_path, state)
        pids = _check_cells(texts)
        assert not state.exists()
        meshes = {m["name"]: m for m in dashboard["actor_meshes"]}
        assert meshes["counter"]["extent"] == {"hosts": 2, "gpus": 2}
        # The procs ran in the namespaces, and the end cell's shutdown ended them there.
        for pid in pids:
            assert not _alive_within(pid), f"proc {pid} outlived hosts.shutdown()"
        for w in workers:
            assert w.poll() is None, "a persistent worker ended with its procs"
    finally:
        stop_workers(workers)


def _dashboard_state(text: str) -> dict:
    import json
    import urllib.request

    m = re.search(r"http://127\.0\.0\.1:[0-9]+/", text)
    assert m, text
    with urllib.request.urlopen(m.group(0) + "api/state", timeout=30) as r:
        return json.loads(r.read())


def _alive_within(pid: int, timeout: float = 10.0) -> bool:
    from conftest import gone_within

    return bool(gone_within([pid], timeout))
