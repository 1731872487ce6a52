"""Job tooling, as Monarch's ``monarch.tools``: ``podium.tools.config.Workspace``."""
