"""podium: a distributed actor framework with a C++ core and a Monarch-compatible API.

`Shape`, `Slice` and `Selection` are the C++ ndslice types (podium._core.ndslice), as Monarch
exposes them from `monarch._rust_bindings.monarch_hyperactor.shape` / `.selection`."""

import ctypes as _ctypes
from importlib.metadata import PackageNotFoundError, version as _dist_version

# libstdc++ joins the global symbol scope before podium._core loads it as the dependency of an
# extension (which Python opens RTLD_LOCAL). Without this, a C++ library imported afterwards
# can abort the process: PyTorch's CUDA build (2.11+cu130) did, at `import torch` in any
# process that had imported podium first ("free(): invalid pointer"), procs included.
# Importing NumPy first had the same effect, which is why the CPU tests never saw it. Only
# where the library has another name (not glibc's Linux) is there nothing to load.
try:
    _ctypes.CDLL("libstdc++.so.6", mode=_ctypes.RTLD_GLOBAL)
except OSError:
    pass

try:
    __version__ = _dist_version("podium")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

from podium._core.ndslice import Selection, Shape, Slice
from podium._src import errors as _errors  # noqa: F401  installs the one error table into _core

for _cls in (Selection, Shape, Slice):
    _cls.__module__ = "podium"
del _cls

# podium.debug(): the job's debugger prompt in this controller process (a terminal or a
# notebook), as `podium debug` (docs/interactive.md).
from podium.debugger.cli import debug  # noqa: E402

# podium.dashboard(): the job's web dashboard, served by this controller process, as
# `podium dashboard` (docs/interactive.md).
from podium._src.dashboard import dashboard  # noqa: E402

__all__ = ["__version__", "Selection", "Shape", "Slice", "dashboard", "debug"]
