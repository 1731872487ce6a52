"""podium's C++ core (nanobind extension)"""

from podium._core import (
    actor as actor,
    base as base,
    data as data,
    host as host,
    mesh as mesh,
    ndslice as ndslice
)


def build_info() -> dict:
    """
    Version, compiler, build type, binding layers and runtime binaries of this build.
    """
