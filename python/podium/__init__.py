"""podium: a distributed actor framework with a C++ core and a Monarch-compatible API.

`Shape`, `Slice` and `Selection` are the C++ ndslice types (podium._core.ndslice), as Monarch
exposes them from `monarch._rust_bindings.monarch_hyperactor.shape` / `.selection`."""

import ctypes as _ctypes
import os as _os
from importlib.metadata import PackageNotFoundError, version as _dist_version

# DA-25: UCX's own log goes to stderr, not stdout (UCX's default), so that a program's stdout
# stays its own (`podium bench ... --json` prints one JSON object there). UCX reads this once,
# when its library loads with podium._core, below; procs inherit it. An explicit UCX_LOG_FILE
# wins.
_os.environ.setdefault("UCX_LOG_FILE", "stderr")
# UCX installs its own handlers for SIGSEGV, SIGBUS, SIGILL and SIGFPE when its library loads
# (UCX_HANDLE_ERRORS=bt): they print a C backtrace with no Python frame, and they replaced
# Python's faulthandler in every process that imported podium (`python -X faulthandler` lost
# its traceback). podium's procs enable faulthandler themselves (proc.py), which names the
# endpoint that crashed; the controller keeps whatever its program chose. An explicit
# UCX_HANDLE_ERRORS wins.
_os.environ.setdefault("UCX_HANDLE_ERRORS", "none")

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

# The tensor engine's names (Monarch's top-level ``monarch`` names), imported on first use:
# ``import podium`` must not import torch.
_TENSOR_NAMES = frozenset({
    "RemoteException", "Stream", "Tensor", "coalescing", "fetch_shard", "get_active_mesh",
    "get_active_stream", "grad_generator", "inspect", "no_mesh", "reduce", "reduce_", "remote",
    "show", "slice_mesh", "to_mesh",
})


def __getattr__(name: str):
    if name in _TENSOR_NAMES:
        from podium import tensor as _tensor
        return getattr(_tensor, name)
    if name == "debug":  # the job's debugger prompt in this process, as `podium debug`
        from podium.debugger.cli import debug  # (docs/interactive.md)
        return debug
    if name == "dashboard":  # the job's web dashboard, as `podium dashboard`
        from podium._src.dashboard import dashboard  # (docs/interactive.md)
        return dashboard
    raise AttributeError(f"module 'podium' has no attribute {name!r}")


__all__ = ["__version__", "Selection", "Shape", "Slice", "dashboard", "debug", *sorted(_TENSOR_NAMES)]
