"""The entry point of a proc: ``python -m podium._src.proc`` (started by the C++ runtime with
PODIUM_BOOT set). It serves Python actors until the controller says exit, or dies."""

from __future__ import annotations

import os
import sys

from podium._core import mesh as _mesh
from podium._src import output, server


def main() -> int:
    if not _mesh.is_proc():
        print("podium._src.proc is started by podium's runtime, not by hand", file=sys.stderr)
        return 2
    # Output reaches the controller's terminal line by line, each line in one write(2) and,
    # when an actor wrote it, prefixed with the actor's name and rank (see output.py).
    output.install()
    server.mark_proc()
    server.start()
    rc = 0
    try:
        _mesh.serve_proc()
    except BaseException as e:  # a bad PODIUM_BOOT, a failed listen, Ctrl-C
        print(f"podium proc {os.getpid()}: {e}", file=sys.stderr)
        rc = 2
    server.stop()
    return rc


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Actor threads may still be inside user code; the process ends here without waiting.
    os._exit(code)
