"""podium's mesh debugger: ``breakpoint()`` in any actor endpoint stops that actor and opens
a pdb session that the job's debug controller lists and drives (docs/interactive.md).

- remote.py, session.py: the proc side (the breakpoint hook, post-mortem, pdb over messages)
- controller.py: the DebugController actor and its prompt (``podium_dbg>``)
- commands.py: the prompt's commands and rank specs
- prompt_io.py: where the prompt reads and writes (the exchange calls of a client)
- endpoint.py: the controller's debug address (a channel listener of its proc, DB-8) and how
  ``podium debug`` / ``exec`` / ``logs`` / ``dashboard`` attach to it
- cli.py: ``podium debug`` and ``podium.debug()``
"""

from podium.debugger.cli import debug
from podium.debugger.controller import DebugController, debug_controller

__all__ = ["DebugController", "debug", "debug_controller"]
