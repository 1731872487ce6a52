"""``podium bench workspace [--workers ADDR ...] [--files N] [--json]``: the time
HostMesh.sync_workspace takes to sync a tree of N files (1,000 by default) where one file
changed, to this host or to the workers given (each a host: ``tcp://ADDR:PORT``).

It writes the tree in a temporary directory, syncs it once (every file goes), changes one
file, and times the second sync, which sends that file only (workspace.py, WS-1)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from podium.actor import attach_to_workers, enable_transport, this_host
from podium._src import workspace_sync
from podium.tools.config import Workspace


def make_tree(top: str, files: int) -> List[str]:
    """``files`` Python files of about 1 KiB in 10 packages."""
    paths = []
    for i in range(files):
        pkg = os.path.join(top, f"pkg{i % 10}")
        os.makedirs(pkg, exist_ok=True)
        path = os.path.join(pkg, f"mod{i}.py")
        with open(path, "w") as f:
            f.write(f"VALUE = {i}\n" + "# padding\n" * 100)
        paths.append(path)
    return paths


def measure(hm: Any, files: int, top: str) -> Dict[str, Any]:
    paths = make_tree(os.path.join(top, "tree"), files)
    ws = Workspace(dirs=[os.path.join(top, "tree")])
    t0 = time.perf_counter()
    hm.sync_workspace(ws).get()
    first = time.perf_counter() - t0
    first_stats = workspace_sync.last_stats()
    with open(paths[files // 2], "a") as f:
        f.write("VALUE = -1\n")
    t0 = time.perf_counter()
    hm.sync_workspace(ws).get()
    second = time.perf_counter() - t0
    stats = workspace_sync.last_stats()
    return {"files": files, "hosts": len(stats["sent"]), "first_sync_s": round(first, 4),
            "first_sent": first_stats["sent"], "one_change_sync_s": round(second, 4),
            "one_change_sent": stats["sent"]}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="podium bench workspace", description=__doc__)
    p.add_argument("--workers", nargs="*", default=[], metavar="ADDR",
                   help="worker addresses (tcp://HOST:PORT), one host each; default: this "
                        "host")
    p.add_argument("--listen", default=None, metavar="ADDR",
                   help="the controller's address, for workers (tcp://IP:0)")
    p.add_argument("--files", type=int, default=1000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.workers:
        if args.listen:
            enable_transport(args.listen)
        hm = attach_to_workers(workers=args.workers)
        hm.initialized.get(timeout=60)
    else:
        hm = this_host()
    with tempfile.TemporaryDirectory(prefix="podium-bench-ws-") as top:
        try:
            result = measure(hm, args.files, top)
        finally:
            if args.workers:
                hm.shutdown().get()
            else:
                hm.stop().get()
    if args.json:
        print(json.dumps(result))
    else:
        print(f"sync of {result['files']} files to {result['hosts']} host(s): first "
              f"{result['first_sync_s']:.3f} s; with 1 changed file "
              f"{result['one_change_sync_s']:.3f} s (files sent per host: "
              f"{result['one_change_sent']})")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
