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
import threading
from typing import List

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


def _fork_hazards() -> List[str]:
    """What the preloaded modules left that a fork cannot carry into a proc: threads started
    from Python (a fork copies only the calling thread), and CUDA initialized (a forked child
    cannot use it: "CUDA error: initialization error"). OpenBLAS's pool, started by importing
    numpy or torch, parks its threads around a fork and is not one."""
    out = []
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        out.append(f"{len(others)} thread(s) started from Python ({', '.join(others)})")
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():  # is_initialized() initializes nothing
        out.append("CUDA initialized")
    return out


def _warn_fork_hazards() -> None:
    """Said once, naming the modules preloaded: procs forked from here would otherwise fail
    far from the cause."""
    hazards = _fork_hazards()
    if hazards:
        names = os.environ.get("PODIUM_ZYGOTE_PRELOAD", "") or "(none named)"
        print(f"podium zygote: after preloading {names} (PODIUM_ZYGOTE_PRELOAD): "
              f"{'; '.join(hazards)}. A fork copies only the calling thread and cannot carry "
              f"CUDA, so procs forked from the zygote lack these and may fail where they use "
              f"them. Preload only modules that start no thread and touch no GPU when "
              f"imported, or set PODIUM_ZYGOTE=0.", file=sys.stderr, flush=True)


def main() -> int:
    _preload()
    _warn_fork_hazards()
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
