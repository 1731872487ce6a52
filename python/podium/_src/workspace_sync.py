"""HostMesh.sync_workspace: the actors that carry a Workspace to the hosts and into the procs
(the protocol and its invariants WS-1..WS-4: workspace.py)."""

from __future__ import annotations

import ast
import asyncio
import hashlib
import importlib
import inspect
import os
import sys
import threading
import time
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple

from podium._core import mesh as _mesh
from podium._src import workspace as _ws
from podium._src.endpoint import Actor, endpoint
from podium._src.future import CoroFuture, Future

HOST_MESH = "podium_workspace"
AGENT_MESH = "podium_workspace_agent"
_last: Dict[str, Any] = {}
_sync_lock = threading.Lock()  # one sync at a time per controller


def last_stats() -> Dict[str, Any]:
    """What the last sync_workspace of this process did: ``sent`` and ``deleted`` (files per
    host, by host rank), ``bytes`` sent in all, ``seconds``, and ``reloaded`` (module names
    per running proc rank, with auto_reload)."""
    return dict(_last)


class WorkspaceHost(Actor):
    """One per host: the host's copy of the workspace (workspace.HostStore)."""

    def __init__(self) -> None:
        self.stores: Dict[str, _ws.HostStore] = {}

    def _store(self, job: str) -> _ws.HostStore:
        store = self.stores.get(job)
        if store is None:
            store = self.stores[job] = _ws.HostStore(job)
        return store

    @endpoint
    def have(self, job: str) -> Dict[str, str]:
        return self._store(job).have()

    @endpoint
    def apply(self, job: str, files: Dict[str, bytes], delete: List[str]) -> Tuple[int, int]:
        return self._store(job).apply(files, delete)


def _add_paths(job: str, dsts: List[str]) -> List[str]:
    root = _ws.host_root(job)
    os.environ.setdefault("WORKSPACE_DIR", root)
    added = []
    for dst in dsts:
        path = os.path.join(root, *dst.split("/")) if dst else root
        if path not in sys.path:
            sys.path.insert(0, path)
        added.append(path)
    importlib.invalidate_caches()  # new files become importable in a running proc
    return added


def _reload(root: str, changed: List[str]) -> List[str]:
    """Reloads the imported modules whose files are among ``changed`` (workspace-relative),
    each after the changed modules its source imports or its namespace refers to (WS-4)."""
    files = {os.path.realpath(os.path.join(root, *rel.split("/"))) for rel in changed}
    mods: Dict[str, ModuleType] = {}
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if isinstance(f, str) and os.path.realpath(f) in files:
            mods[name] = mod
    deps: Dict[str, set] = {}
    for name, mod in mods.items():
        refs = _imports_of(mod)
        for v in list(vars(mod).values()):
            other = v.__name__ if isinstance(v, ModuleType) else getattr(v, "__module__", None)
            if isinstance(other, str):
                refs.add(other)
        deps[name] = {r for r in refs if r in mods and r != name}
    order: List[str] = []
    seen: set = set()

    def visit(n: str, stack: set) -> None:
        if n in seen or n in stack:  # a cycle: reloaded in name order
            return
        stack.add(n)
        for d in sorted(deps[n]):
            visit(d, stack)
        seen.add(n)
        order.append(n)

    for n in sorted(mods):
        visit(n, set())
    for n in order:
        importlib.reload(sys.modules[n])
    return order


def _imports_of(mod: ModuleType) -> set:
    """The modules that ``mod``'s (new) source imports: ``import X``, ``from X import y``
    (relative ones resolved against its package), and ``X.y`` for each ``from X import y``."""
    out: set = set()
    try:
        with open(mod.__file__, "rb") as f:  # type: ignore[arg-type]
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return out
    package = getattr(mod, "__package__", None) or ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[:len(parts) - node.level + 1] if node.level > 1 else parts
                base = ".".join(p for p in parts + ([base] if base else []) if p)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


class WorkspaceAgent(Actor):
    """One per running proc: puts the workspace on sys.path and reloads changed modules."""

    @endpoint
    def update(self, job: str, dsts: List[str], changed: List[str],
               auto_reload: bool) -> List[str]:
        _add_paths(job, dsts)
        return _reload(_ws.host_root(job), changed) if auto_reload and changed else []


class WithWorkspace:
    """A spawn_procs bootstrap: the workspace on sys.path, then the user's bootstrap (WS-4)."""

    def __init__(self, job: str, dsts: List[str], inner: Optional[Callable[[], Any]]) -> None:
        self.job, self.dsts, self.inner = job, list(dsts), inner

    def __call__(self) -> None:
        _add_paths(self.job, self.dsts)
        if self.inner is None:
            return
        if inspect.iscoroutinefunction(self.inner):
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self.inner())
            finally:
                loop.close()
        else:
            self.inner()


def wrap_bootstrap(shared: Any, bootstrap: Optional[Callable[[], Any]]
                   ) -> Optional[Callable[[], Any]]:
    """spawn_procs' bootstrap for a HostMesh that has synced a workspace."""
    ws = getattr(shared, "workspace", None)
    if ws is None:
        return bootstrap
    return WithWorkspace(ws[0], ws[1], bootstrap)


def job_key() -> str:
    """The controller's address, hashed: the job's directory on the hosts."""
    return hashlib.sha256(str(_mesh.this_proc_id()).encode()).hexdigest()[:16]


def _points(mesh: Any) -> List[Dict[str, int]]:
    sizes = mesh.sizes
    out = []
    for rank in range(len(mesh)):
        coords, rest = {}, rank
        for dim in reversed(list(sizes)):  # row-major: the last dimension varies fastest
            coords[dim], rest = rest % sizes[dim], rest // sizes[dim]
        out.append({d: coords[d] for d in sizes})
    return out


def _one(mesh: Any, coords: Dict[str, int]) -> Any:
    return mesh.slice(**coords) if coords else mesh


def sync(hm: Any, workspace: Any, conda: bool, auto_reload: bool,
         listed: Dict[int, Any]) -> "Future[None]":
    """HostMesh.sync_workspace; ``listed``: the controller's ProcMeshes for ``podium exec`` and
    ``podium logs`` (proc_mesh.spawned), which the sync's own host procs leave."""
    if not isinstance(workspace, _ws.Workspace):
        raise TypeError(f"sync_workspace takes a Workspace, not {type(workspace).__name__}")
    if conda:
        raise NotImplementedError("sync_workspace(conda=True): podium does not sync conda "
                                  "environments; install packages on the hosts")
    if hm._host.reference is not None:
        raise RuntimeError(f"cannot call sync_workspace on {hm!r}: {hm._host.reference}")

    async def go() -> None:
        await asyncio.to_thread(_sync, hm, workspace, auto_reload, listed)
    return CoroFuture(go())


def _host_mesh(hm: Any, listed: Dict[int, Any]) -> Any:
    shared = hm._host
    key = str(hm._r)
    with shared.lock:
        cache = shared.workspace_hosts
        entry = cache.get(key)
    if entry is not None and not entry[0]._shared.stopped:
        return entry[1]
    pm = hm.spawn_procs(per_host={})
    listed.pop(id(pm), None)  # podium's own: not one of the job's meshes for exec and logs
    mesh = pm.spawn(HOST_MESH, WorkspaceHost)
    with shared.lock:
        cache[key] = (pm, mesh)
    return mesh


def _sync(hm: Any, workspace: Any, auto_reload: bool, listed: Dict[int, Any]) -> None:
    with _sync_lock:
        t0 = time.perf_counter()
        job = job_key()
        local = _ws.scan(workspace)
        dsts = sorted(set(workspace.dirs.values()))
        hosts = _host_mesh(hm, listed)
        points = _points(hosts)
        haves = [_one(hosts, p).have.call_one(job) for p in points]
        pending, sent, deleted, nbytes = [], {}, {}, 0
        changed: set = set()
        for rank, (p, fut) in enumerate(zip(points, haves)):
            remote = fut.get()
            send, delete = _ws.plan(local, remote)
            changed.update(send)
            changed.update(delete)
            sent[rank], deleted[rank] = len(send), len(delete)
            for i, files in enumerate(_ws.batches(local, send) if send else [{}]):
                if not files and not delete:
                    continue
                nbytes += sum(len(v) for v in files.values())
                pending.append(_one(hosts, p).apply.call_one(job, files,
                                                             delete if i == 0 else []))
        for fut in pending:
            fut.get()
        with hm._host.lock:
            hm._host.workspace = (job, dsts)
            sync_meshes = {id(pm) for pm, _ in hm._host.workspace_hosts.values()}
            running = [pm for pm in hm._host.proc_meshes
                       if not pm._shared.stopped and id(pm) not in sync_meshes]
        reloaded: Dict[int, List[str]] = {}
        updates = []
        for pm in running:
            agent = getattr(pm._shared, "workspace_agent", None)
            if agent is None:
                agent = pm._shared.workspace_agent = pm.spawn(AGENT_MESH, WorkspaceAgent)
            updates.append(agent.update.call(job, dsts, sorted(changed), auto_reload))
        rank = 0
        for fut in updates:
            for _, names in fut.get().items():
                reloaded[rank] = names
                rank += 1
        _last.clear()
        _last.update(sent=sent, deleted=deleted, bytes=nbytes, reloaded=reloaded,
                     seconds=time.perf_counter() - t0, files=len(local))
