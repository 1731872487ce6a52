"""podium.config: runtime settings by Monarch's key names, as ``monarch.config``
(the same functions as ``podium.actor.config``; see podium._src.config)."""

from podium._src.config import (
    clear_runtime_config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
)

__all__ = [
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
]
