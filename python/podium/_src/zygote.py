"""The zygote: ``python -m podium._src.zygote``, started by the controller's C++ runtime with
its end of a socketpair as fd 3 (cpp/podium/host/zygote.h).

It imports what every proc needs once (podium's runtime and its dependencies, and the
modules named in PODIUM_ZYGOTE_PRELOAD, comma-separated, e.g. ``torch``), then serves fork
requests in C++ (which first backs the zygote's anonymous memory with huge pages, ZY-6: forks
and a proc's exit then handle 512 times fewer page-table entries). Each forked child comes back here with the argv, environment and working
directory the controller sent, and becomes a proc exactly as ``python -m podium._src.proc``
would. The zygote starts no thread: fork copies only the calling one.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys

from podium._core import host as _host
from podium._core.base import CoreError
from podium._src import output, proc, server  # noqa: F401  (imported here, once, for every proc)


def _preload() -> None:
    import cloudpickle  # noqa: F401  (the proc's first unpickle would import it)

    for name in filter(None, os.environ.get("PODIUM_ZYGOTE_PRELOAD", "").split(",")):
        try:
            importlib.import_module(name.strip())
        except Exception as e:  # a proc that needs it fails then, with its own traceback
            print(f"podium zygote: cannot preload {name!r}: {e}", file=sys.stderr)


def main() -> int:
    _preload()
    # Whatever the imports made is inherited by every proc: moved out of the collector's reach,
    # a proc's collections do not write to (and so copy) every inherited object's page.
    gc.collect()
    gc.freeze()
    try:
        argv, env, cwd = _host.zygote_serve(3)
    except CoreError:  # the controller closed the socket: the zygote's work is done
        return 0
    # A forked child: become the proc the controller asked for (ZY-4).
    os.environ.clear()
    os.environ.update(dict(env))
    sys.argv = list(argv[2:]) if argv[1:2] == ["-m"] else list(argv[1:])
    # It ends as the proc does: its interpreter finalizes (BT-4, podium._src.proc).
    return proc.main()


if __name__ == "__main__":
    sys.exit(main())
