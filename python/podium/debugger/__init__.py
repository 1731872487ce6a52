"""podium's mesh debugger: ``breakpoint()`` in any actor endpoint stops that actor and opens
a pdb session that the job's debug controller lists and drives (docs/interactive.md).

- remote.py, session.py: the proc side (the breakpoint hook, post-mortem, pdb over messages)
- controller.py: the DebugController actor and its prompt (``podium_dbg>``)
- commands.py: the prompt's commands and rank specs
- server.py: the TCP debug server that ``podium debug`` connects to
- cli.py: ``podium debug`` and ``podium.debug()``

Only remote.py is imported by every proc; the rest loads on first use.
"""

from typing import Any

__all__ = ["DebugController", "debug", "debug_controller"]


def __getattr__(name: str) -> Any:
    if name in ("DebugController", "debug_controller"):
        from podium.debugger import controller

        return getattr(controller, name)
    if name == "debug":
        from podium.debugger.cli import debug

        return debug
    raise AttributeError(f"module 'podium.debugger' has no attribute {name!r}")
