// Helpers shared by the binding files of podium._core (defined in base.cc).
//
// Buffers. A message part sent from Python is a Python buffer object (bytes, memoryview,
// PickleBuffer). Parts up to kCopyThreshold bytes are copied into a C++ allocation (a copy of
// a few hundred bytes costs less than keeping a Python object alive across threads); larger
// ones are wrapped without a copy: the Buffer holds the Python buffer export, and when the last
// reference to the Buffer drops — often on an I/O thread, which must never touch Python — the
// export is queued and released later by a thread that holds the GIL (release_deferred(), run
// at every binding entry that sends or waits). A part received by Python is a PartBuffer: a
// read-only Python buffer over the C++ Buffer, so pickle.loads(buffers=...) reads the bytes
// in place.
//
// Errors. throw_error() raises, for a podium::Error raised synchronously by the bindings, the
// exception that podium._src.errors.from_core() makes of it: the one table from C++ error
// codes to Python exceptions (docs/python.md, "Errors"), installed with
// _core.base.set_error_translator() when podium is imported. Before that, it raises
// podium._core.base.CoreError with `subsystem`, `code` and `message` attributes. Errors that
// arrive as replies are handed to Python as values (error_tuple) and go through the same table.
//
// Threads: every function here requires the GIL, except that a Buffer made by
// buffer_from_python() may be copied and dropped on any thread.
#pragma once

#include <nanobind/nanobind.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "podium/actor/mesh_failure.h"
#include "podium/base/buffer.h"
#include "podium/base/error.h"
#include "podium/ndslice/region.h"

namespace podium::python {

namespace nb = nanobind;

inline constexpr size_t kCopyThreshold = 32 * 1024;

// The longest wait a binding takes from Python ("without a timeout": about 31 years).
inline constexpr double kForeverS = 1e9;
// `s` seconds from Python as a duration: negative and NaN are 0, more than kForeverS is
// kForeverS. Never a cast of a double past int64's range (a timeout of 1e12 s, or inf, would
// otherwise come out negative and expire at once).
inline std::chrono::nanoseconds seconds_to_ns(double s) {
  if (!(s > 0)) return std::chrono::nanoseconds(0);
  if (s > kForeverS) s = kForeverS;
  return std::chrono::nanoseconds(static_cast<int64_t>(s * 1e9));
}

// `obj` must export a C-contiguous buffer; raises BufferError/TypeError otherwise.
Buffer buffer_from_python(nb::handle obj);
// `obj`'s C-contiguous buffer, never copied: the Buffer holds the export (released later
// under the GIL, as above) while any copy of it lives. `writable`: the export must be
// writable (a destination of one-sided reads); raises BufferError otherwise.
Buffer pin_python_buffer(nb::handle obj, bool writable);
// A Buffer over `size` bytes at `addr` that the caller vouches for (device memory, such as a
// CUDA tensor's storage, which no Python buffer can export), holding a reference to `owner`
// released later under the GIL, as pin_python_buffer's export is. The bytes are not touched.
Buffer pin_foreign_memory(nb::handle owner, uintptr_t addr, size_t size, bool writable);
// Every item of the sequence `seq`, in order.
std::vector<Buffer> buffers_from_python(nb::handle seq);
// A PartBuffer owning a reference to `b`.
nb::object part_to_python(Buffer b);
// PartBuffers for parts[from..].
nb::list parts_to_python(const std::vector<Buffer>& parts, size_t from = 0);
// Releases the Python exports of zero-copy Buffers that died since the last call.
void release_deferred();

[[noreturn]] void throw_error(const Error& e);
// (subsystem, code, message) of an error that Python translates itself.
nb::tuple error_tuple(const Error& e);

// A MeshFailure as the dict podium._src.supervision turns into a MeshFailure (defined in
// actor.cc).
nb::dict failure_to_python(const actor::MeshFailure& f);

// (labels, offset, sizes, strides): what a Region is made of, so that meshes and ValueMeshes
// of a sliced mesh can be pickled and rebuilt in another process (defined in ndslice.cc).
using RegionState =
    std::tuple<std::vector<std::string>, size_t, std::vector<size_t>, std::vector<size_t>>;
RegionState region_state(const ndslice::Region& r);
// Raises ValueError when the state does not describe a valid Region.
ndslice::Region region_from_state(const RegionState& st);

template <class T>
T unwrap(Result<T> r) {
  if (!r) throw_error(r.error());
  return std::move(*r);
}
inline void unwrap(Status s) {
  if (!s) throw_error(s.error());
}

}  // namespace podium::python
