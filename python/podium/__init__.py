"""podium: a distributed actor framework with a C++ core and a Monarch-compatible API.

`Shape`, `Slice` and `Selection` are the C++ ndslice types (podium._core.ndslice), as Monarch
exposes them from `monarch._rust_bindings.monarch_hyperactor.shape` / `.selection`."""

from importlib.metadata import PackageNotFoundError, version as _dist_version

try:
    __version__ = _dist_version("podium")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

from podium._core.ndslice import Selection, Shape, Slice
from podium._src import errors as _errors  # noqa: F401  installs the one error table into _core

for _cls in (Selection, Shape, Slice):
    _cls.__module__ = "podium"
del _cls

__all__ = ["__version__", "Selection", "Shape", "Slice"]
