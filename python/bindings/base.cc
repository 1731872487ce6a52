// podium._core.base: message parts as Python buffers, and the error translation table.
// See common.h for the rules.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <mutex>
#include <string>
#include <vector>

#include "common.h"
#include "podium/ndslice/errc.h"
#include "podium/actor/ids.h"

namespace podium::python {
namespace {

// A Python buffer export that a zero-copy Buffer keeps alive.
struct PyExport {
  Py_buffer view;
};

std::mutex g_release_mu;               // guards g_release
std::vector<PyExport*> g_release;      // exports whose Buffers died, to release under the GIL

struct DeferredRelease {
  void operator()(PyExport* e) const {
    std::lock_guard lock(g_release_mu);
    g_release.push_back(e);
  }
};

// A read-only Python buffer over one received message part.
struct PartBuffer {
  Buffer buf;
};

const std::byte kEmpty{};

int part_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  auto* p = nb::inst_ptr<PartBuffer>(self);
  if (flags & PyBUF_WRITABLE) {
    PyErr_SetString(PyExc_BufferError, "podium message parts are read-only");
    view->obj = nullptr;
    return -1;
  }
  const void* data = p->buf.size() ? static_cast<const void*>(p->buf.data()) : &kEmpty;
  return PyBuffer_FillInfo(view, self, const_cast<void*>(data),
                           static_cast<Py_ssize_t>(p->buf.size()), 1, flags);
}

PyType_Slot g_part_slots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(part_getbuffer)},
                              {0, nullptr}};

PyObject* g_core_error = nullptr;  // podium._core.base.CoreError; lives as long as the process

}  // namespace

Buffer buffer_from_python(nb::handle obj) {
  auto* e = new PyExport();
  if (PyObject_GetBuffer(obj.ptr(), &e->view, PyBUF_C_CONTIGUOUS) != 0) {
    delete e;
    throw nb::python_error();
  }
  const auto* data = static_cast<const std::byte*>(e->view.buf);
  size_t size = static_cast<size_t>(e->view.len);
  if (size <= kCopyThreshold) {
    Buffer b = Buffer::copy_of(std::span<const std::byte>(data, size));
    PyBuffer_Release(&e->view);
    delete e;
    return b;
  }
  std::shared_ptr<PyExport> owner(e, DeferredRelease{});
  return Buffer(std::shared_ptr<const void>(std::move(owner), e), data, size);
}

std::vector<Buffer> buffers_from_python(nb::handle seq) {
  release_deferred();
  std::vector<Buffer> out;
  for (nb::handle item : seq) out.push_back(buffer_from_python(item));
  return out;
}

nb::object part_to_python(Buffer b) { return nb::cast(PartBuffer{std::move(b)}); }

nb::list parts_to_python(const std::vector<Buffer>& parts, size_t from) {
  nb::list out;
  for (size_t i = from; i < parts.size(); ++i) out.append(part_to_python(parts[i]));
  return out;
}

void release_deferred() {
  std::vector<PyExport*> done;
  {
    std::lock_guard lock(g_release_mu);
    if (g_release.empty()) return;
    done.swap(g_release);
  }
  for (auto* e : done) {
    PyBuffer_Release(&e->view);
    delete e;
  }
}

nb::tuple error_tuple(const Error& e) {
  return nb::make_tuple(static_cast<int>(e.subsystem), static_cast<int>(e.code), e.message);
}

void throw_error(const Error& e) {
  using ndslice::NdsliceErrc;
  PyObject* type = nullptr;
  if (e.is(NdsliceErrc::kUnknownLabel)) {
    type = PyExc_TypeError;
  } else if (e.is(NdsliceErrc::kOutOfRange)) {
    type = PyExc_IndexError;
  } else if (e.subsystem == Subsystem::kNdslice || e.is(BaseErrc::kInvalidArgument) ||
             e.is(actor::ActorErrc::kBadId)) {
    type = PyExc_ValueError;
  } else if (e.is(BaseErrc::kTimeout) || e.is(actor::ActorErrc::kTimeout)) {
    type = PyExc_TimeoutError;
  }
  if (type) {
    PyErr_SetString(type, e.message.c_str());
    throw nb::python_error();
  }
  nb::object exc = nb::borrow(g_core_error)(e.message);
  exc.attr("subsystem") = static_cast<int>(e.subsystem);
  exc.attr("code") = static_cast<int>(e.code);
  exc.attr("message") = e.message;
  PyErr_SetObject(g_core_error, exc.ptr());
  throw nb::python_error();
}

void bind_base(nb::module_& m) {
  // Daemon actor threads may hold podium objects when the interpreter exits.
  nb::set_leak_warnings(false);
  g_core_error = PyErr_NewExceptionWithDoc(
      "podium._core.base.CoreError",
      "An error of podium's C++ core: `subsystem` and `code` identify it, `message` says "
      "who failed and why.",
      PyExc_RuntimeError, nullptr);
  m.attr("CoreError") = nb::borrow(g_core_error);
  m.attr("COPY_THRESHOLD") = kCopyThreshold;

  nb::class_<PartBuffer>(m, "PartBuffer", nb::type_slots(g_part_slots),
                         "A read-only buffer over one message part (no copy).")
      .def("__len__", [](const PartBuffer& p) { return p.buf.size(); });

  m.def(
      "as_part",
      [](nb::handle obj) { return part_to_python(buffer_from_python(obj)); },
      "The message part podium would send for the buffer `obj` (copied when small, shared "
      "when large).");
  m.def("release_deferred", &release_deferred,
        "Releases the Python buffers of message parts that the core no longer needs.");
  m.def("deferred_count", [] {
    std::lock_guard lock(g_release_mu);
    return g_release.size();
  });
}

}  // namespace podium::python
