"""As Monarch's ``monarch.tools.config``: ``Workspace``, the directories that
``HostMesh.sync_workspace`` copies to the hosts (docs/interactive.md)."""

from podium._src.workspace import Workspace

__all__ = ["Workspace"]
