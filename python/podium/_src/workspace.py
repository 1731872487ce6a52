"""Workspace sync: ``HostMesh.sync_workspace(Workspace(dirs=[...]), auto_reload=False)`` copies
local directories to every host of the mesh, sending only what changed, and puts them on the
procs' ``sys.path`` (docs/interactive.md "Workspace sync").

How it goes: the controller hashes its directories (``scan``; a file whose size and mtime did
not change keeps its hash from the last scan). One proc per host (``podium_workspace``, spawned
on the HostMesh at the first sync and kept) holds the host's copy under the job's workspace
directory. Each sync asks every host what it has (``have``: path -> sha256, answered from the
host's own index), and sends each host, in parallel, only the files it lacks or has with
another hash, and the paths to delete (``apply``). All of it travels as actor messages, over
podium's authenticated channels. Then every running proc of the HostMesh puts the
directories on its ``sys.path`` and, with ``auto_reload``, reloads the modules whose files
changed; procs spawned later get them before any actor (the bootstrap of spawn_procs).

  WS-1 Only what differs is sent: each host answers with the hashes it has, and the
    controller sends it only the files missing or different there and the paths to delete;
    one sync call per host (not per proc), to all hosts at once.
  WS-2 A path that would leave the workspace is refused with a ValueError naming it: a
    destination that is absolute or has ``..``, a source file or directory that is a symlink
    pointing outside its directory (the controller's check), and, on the host, any relative
    path that is absolute, has ``..`` or resolves outside the host's directory (the host's
    own check, whatever the controller sent). Nothing is written then.
  WS-3 Files are written atomically: to a temporary file in the same directory, then renamed
    over the old one; a proc never imports half a file.
  WS-4 After a sync every running proc of the HostMesh has each synced directory on its
    sys.path, and procs spawned on it later have them before any actor's constructor runs;
    with auto_reload, each running proc reloads (importlib.reload) the modules it imported
    whose files changed, a module after the changed modules its new source imports (or its
    namespace refers to); in a cycle, in name order.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, List, Tuple

SKIP_DIRS = {"__pycache__", ".git"}
CHUNK_BYTES = 16 << 20  # files per apply message, at most about this much content
ROOT_ENV = "PODIUM_WORKSPACE_ROOT"


class Workspace:
    """One or more local directories to sync, as Monarch's ``Workspace``: ``dirs`` is a list
    (each directory goes to ``<workspace>/<its name>``) or a dict ``{local: remote_relpath}``
    (``""`` puts the directory's contents at the workspace's top)."""

    def __init__(self, dirs: Any = None, env: Any = None) -> None:
        self.env = env
        self.dirs: Dict[Path, str] = {}
        if dirs is None:
            return
        items = ([(d, Path(d).name) for d in dirs] if isinstance(dirs, (list, tuple))
                 else list(dict(dirs).items()))
        for src, dst in items:
            if not src:
                raise ValueError(f"Workspace: an empty directory name ({src!r}) would sync the "
                                 f"current directory by accident; name it")
            self.dirs[Path(src)] = check_relpath(str(dst), f"destination of {src}",
                                                 allow_empty=True)

    @staticmethod
    def null() -> "Workspace":
        return Workspace()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workspace) and self.dirs == other.dirs

    def __repr__(self) -> str:
        return f"Workspace(dirs={ {str(k): v for k, v in self.dirs.items()} })"


def check_relpath(rel: str, what: str, allow_empty: bool = False) -> str:
    """``rel`` normalised with ``/``; ValueError if it is absolute or has ``..`` (WS-2)."""
    if not isinstance(rel, str):
        raise ValueError(f"workspace path {rel!r} ({what}) is not a str")
    if rel in ("", "."):
        if allow_empty:
            return ""
        raise ValueError(f"workspace path {rel!r} ({what}) is empty")
    if os.path.isabs(rel) or rel.startswith(("/", "\\")):
        raise ValueError(f"workspace path {rel!r} ({what}) is absolute: it would leave the "
                         f"workspace")
    parts = [p for p in rel.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts or "\x00" in rel:
        raise ValueError(f"workspace path {rel!r} ({what}) has '..': it would leave the "
                         f"workspace")
    return "/".join(parts)


# --- the controller's side: scanning ------------------------------------------------------

_hash_cache: Dict[str, Tuple[int, int, str]] = {}  # abs path -> (size, mtime_ns, sha256)
_hash_lock = threading.Lock()


def _sha(path: str, st: os.stat_result) -> str:
    key = (st.st_size, st.st_mtime_ns)
    with _hash_lock:
        hit = _hash_cache.get(path)
    if hit is not None and hit[:2] == key:
        return hit[2]
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with _hash_lock:
        _hash_cache[path] = (*key, digest)
    return digest


def scan(workspace: Workspace) -> Dict[str, Tuple[str, str]]:
    """workspace-relative path -> (sha256, local absolute path) of every file to sync. Symlinks
    are followed when they stay inside their directory and refused otherwise (WS-2);
    ``__pycache__`` and ``.git`` are not synced."""
    out: Dict[str, Tuple[str, str]] = {}
    for src, dst in workspace.dirs.items():
        top = os.path.realpath(src)
        if not os.path.isdir(top):
            raise ValueError(f"sync_workspace: {src} is not a directory")
        for dirpath, dirnames, filenames in os.walk(top):
            for d in list(dirnames):
                full = os.path.join(dirpath, d)
                if d in SKIP_DIRS:
                    dirnames.remove(d)
                elif os.path.islink(full):
                    _inside(top, full, src)
                    raise ValueError(f"sync_workspace: {full} is a symlink to a directory; "
                                     f"podium syncs files and real directories only")
            for name in filenames:
                full = os.path.join(dirpath, name)
                if os.path.islink(full):
                    _inside(top, full, src)
                st = os.stat(full)
                if not _is_file(st):
                    continue  # sockets, fifos: not code
                rel = os.path.relpath(full, top).replace(os.sep, "/")
                key = f"{dst}/{rel}" if dst else rel
                if key in out:
                    raise ValueError(f"sync_workspace: {key} comes from two directories "
                                     f"({out[key][1]} and {full})")
                out[key] = (_sha(full, st), full)
    return out


def _is_file(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode)


def _inside(top: str, full: str, src: Any) -> None:
    target = os.path.realpath(full)
    if os.path.commonpath([top, target]) != top:
        raise ValueError(f"sync_workspace: {full} is a symlink to {target}, outside {src}: "
                         f"refused (it would leave the workspace)")


def plan(local: Dict[str, Tuple[str, str]], remote: Dict[str, str]
         ) -> Tuple[List[str], List[str]]:
    """(paths to send, paths to delete) for a host that has ``remote`` (WS-1)."""
    send = sorted(p for p, (sha, _) in local.items() if remote.get(p) != sha)
    delete = sorted(p for p in remote if p not in local)
    return send, delete


def batches(local: Dict[str, Tuple[str, str]], send: List[str]) -> List[Dict[str, bytes]]:
    """The files to send, read and grouped into messages of about CHUNK_BYTES."""
    out: List[Dict[str, bytes]] = [{}]
    size = 0
    for p in send:
        with open(local[p][1], "rb") as f:
            data = f.read()
        if size and size + len(data) > CHUNK_BYTES:
            out.append({})
            size = 0
        out[-1][p] = data
        size += len(data)
    return out


# --- the host's side ---------------------------------------------------------------------


def host_key() -> str:
    """What tells this host from another: its name and, for hosts that are network namespaces
    of one machine, the namespace (procs of one host share it)."""
    try:
        ns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        ns = 0
    return f"{socket.gethostname()}-{ns}"


def host_root(job: str) -> str:
    """The job's workspace directory on this host (created)."""
    base = os.environ.get(ROOT_ENV) or os.path.join(tempfile.gettempdir(),
                                                    f"podium-workspace-{os.getuid()}")
    root = os.path.join(base, job, host_key())
    os.makedirs(root, mode=0o700, exist_ok=True)
    return os.path.realpath(root)


class HostStore:
    """A host's copy of the workspace: its files under ``root`` and their hashes."""

    def __init__(self, job: str) -> None:
        self.root = host_root(job)
        self.index: Dict[str, Tuple[int, int, str]] = {}  # rel -> (size, mtime_ns, sha256)

    def _target(self, rel: str) -> str:
        """WS-2, on the host: the absolute path of ``rel``, which must stay under root."""
        clean = check_relpath(rel, "sent by the controller")
        path = os.path.join(self.root, *clean.split("/"))
        parent = os.path.realpath(os.path.dirname(path))
        if os.path.commonpath([self.root, parent]) != self.root:
            raise ValueError(f"workspace path {rel!r} resolves to {parent}, outside the "
                             f"workspace {self.root}: refused")
        return path

    def have(self) -> Dict[str, str]:
        out: Dict[str, str] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            for name in filenames:
                if name.startswith(".podium-tmp-"):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                st = os.lstat(full)
                hit = self.index.get(rel)
                if hit is None or hit[:2] != (st.st_size, st.st_mtime_ns):
                    with open(full, "rb") as f:
                        hit = (st.st_size, st.st_mtime_ns, hashlib.sha256(f.read()).hexdigest())
                    self.index[rel] = hit
                out[rel] = hit[2]
        return out

    def apply(self, files: Dict[str, bytes], delete: List[str]) -> Tuple[int, int]:
        """Writes ``files`` (WS-3) and removes ``delete``; every path is checked before
        anything is written (WS-2)."""
        targets = {rel: self._target(rel) for rel in files}
        gone = {rel: self._target(rel) for rel in delete}
        for rel, path in targets.items():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".podium-tmp-", dir=os.path.dirname(path))
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(files[rel])
                os.replace(tmp, path)
                st = os.stat(path)
                self.index[rel] = (st.st_size, st.st_mtime_ns,
                                   hashlib.sha256(files[rel]).hexdigest())
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        for rel, path in gone.items():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            self.index.pop(rel, None)
            d = os.path.dirname(path)
            while d != self.root:  # directories left empty go too
                try:
                    os.rmdir(d)
                except OSError:
                    break
                d = os.path.dirname(d)
        return len(targets), len(gone)
