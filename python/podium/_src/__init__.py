"""Private implementation of podium. Nothing here is public API."""

from __future__ import annotations

import os
from pathlib import Path

# Executables that CMake's podium_runtime_binary() installs next to the package.
_BIN_DIR_ENV = "PODIUM_BIN_DIR"


def bin_dir() -> Path:
    """The folder holding podium's runtime executables (benchmarks, proc worker, examples).

    That is ``<package>/_bin`` of the installed package; the environment variable
    ``PODIUM_BIN_DIR`` overrides it (for example to run binaries straight from a build tree).
    """
    override = os.environ.get(_BIN_DIR_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "_bin"


def find_binary(name: str) -> Path | None:
    """Path of the runtime executable ``name`` in bin_dir(), or None if it is not there."""
    path = bin_dir() / name
    if path.is_file() and os.access(path, os.X_OK):
        return path
    return None


def list_binaries(prefix: str = "") -> list[str]:
    """Sorted names of the runtime executables in bin_dir() that start with ``prefix``."""
    folder = bin_dir()
    if not folder.is_dir():
        return []
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.name.startswith(prefix) and p.is_file() and os.access(p, os.X_OK)
    )
