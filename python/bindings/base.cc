// podium._core.base: message parts as Python buffers, the C++ error enums as Python IntEnums
// and the hook through which podium._src.errors (the one translation table) turns a C++ Error
// into a Python exception. See common.h for the rules.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common.h"
#include "podium/actor/ids.h"
#include "podium/base/edit_distance.h"
#include "podium/channel/net.h"
#include "podium/data/errc.h"
#include "podium/host/error.h"
#include "podium/mesh/errc.h"
#include "podium/ndslice/errc.h"
#include "podium/wire/frame.h"

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

// A Python buffer over one received message part: writable when this PartBuffer holds the
// only reference to memory the receiver allocated for the part (BU-1: a tensor or array
// unpickled from it becomes writable without a copy), read-only otherwise (a part shared with
// another receiver, or the sender's own memory in an in-process delivery).
struct PartBuffer {
  Buffer buf;
};

const std::byte kEmpty{};

int part_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  auto* p = nb::inst_ptr<PartBuffer>(self);
  bool writable = p->buf.size() > 0 && p->buf.sole_writer();
  if ((flags & PyBUF_WRITABLE) && !writable) {
    PyErr_SetString(PyExc_BufferError,
                    "this podium message part is read-only (shared with another receiver, or "
                    "the sender's own memory)");
    view->obj = nullptr;
    return -1;
  }
  const void* data = p->buf.size() ? static_cast<const void*>(p->buf.data()) : &kEmpty;
  return PyBuffer_FillInfo(view, self, const_cast<void*>(data),
                           static_cast<Py_ssize_t>(p->buf.size()), writable ? 0 : 1, flags);
}

PyType_Slot g_part_slots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(part_getbuffer)},
                              {0, nullptr}};

PyObject* g_core_error = nullptr;  // podium._core.base.CoreError; lives as long as the process
// podium._src.errors.from_core, installed by set_error_translator; a strong reference kept
// for the life of the process (never released: it may be needed during interpreter exit).
PyObject* g_translator = nullptr;

// --- the error enums, read from the C++ enums themselves ---------------------------------
//
// A Python enum is built from the enumerators the compiler knows, not from a copied list:
// __PRETTY_FUNCTION__ of a function templated on an enum value spells a named enumerator
// ("... V = podium::actor::ActorErrc::kTimeout; ...") and an unnamed value as a cast
// ("(podium::actor::ActorErrc)115"), in GCC and Clang alike. Scanning 0..kMaxCode finds every
// enumerator; codes must stay below kMaxCode (base/error.h: shared codes < 100, a subsystem's
// codes from 100).
constexpr size_t kMaxCode = 256;

template <auto V>
constexpr std::string_view pretty_name() {
  return __PRETTY_FUNCTION__;
}

// "kTimeout" when V names an enumerator, "" when it is an unnamed value of its enum.
template <auto V>
constexpr std::string_view enumerator_name() {
  std::string_view s = pretty_name<V>();
  size_t start = s.find("V = ");
  if (start == std::string_view::npos) return {};
  start += 4;
  size_t end = s.find_first_of(";]", start);
  s = s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
  if (s.empty() || s.front() == '(' || (s.front() >= '0' && s.front() <= '9')) return {};
  size_t colon = s.rfind("::");
  return colon == std::string_view::npos ? s : s.substr(colon + 2);
}

template <class E, size_t... I>
std::vector<std::pair<std::string_view, int>> enumerators(std::index_sequence<I...>) {
  std::vector<std::pair<std::string_view, int>> out;
  (
      [&] {
        constexpr std::string_view name = enumerator_name<static_cast<E>(I)>();
        if constexpr (!name.empty()) out.emplace_back(name, static_cast<int>(I));
      }(),
      ...);
  return out;
}

// "kNoSuchActor" -> "NO_SUCH_ACTOR": Python's spelling of an enumerator.
std::string python_member_name(std::string_view cpp) {
  if (cpp.size() > 1 && cpp[0] == 'k' && cpp[1] >= 'A' && cpp[1] <= 'Z') cpp.remove_prefix(1);
  std::string out;
  for (size_t i = 0; i < cpp.size(); ++i) {
    char c = cpp[i];
    if (c >= 'A' && c <= 'Z') {
      if (i > 0) out += '_';
      out += c;
    } else {
      out += static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
    }
  }
  return out;
}

// enum.<kind> `name` (IntEnum or Enum) with every enumerator of E, as m.<name>.
template <class E>
nb::object bind_enum(nb::module_& m, const char* name, const char* kind) {
  nb::list members;
  for (auto [cpp, value] : enumerators<E>(std::make_index_sequence<kMaxCode>{}))
    members.append(nb::make_tuple(python_member_name(cpp), value));
  nb::object enum_class = nb::module_::import_("enum").attr(kind);
  nb::object e = enum_class(name, members, nb::arg("module") = "podium._core.base",
                            nb::arg("qualname") = name);
  m.attr(name) = e;
  return e;
}

// An error enum of one subsystem: m.<name>, and ERRC[Subsystem(subsystem_of(E))] = it.
// Adding a subsystem's enum to Python is one call of this in bind_base. A plain Enum, not an
// IntEnum: codes of different subsystems share numbers (ActorErrc 102 is not NdsliceErrc 102),
// so members must not compare equal to ints or to each other.
template <class E>
void bind_errc(nb::module_& m, nb::dict& errc, const char* name) {
  nb::object e = bind_enum<E>(m, name, "Enum");
  errc[m.attr("Subsystem")(static_cast<int>(subsystem_of(E{})))] = e;
}

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

Buffer pin_python_buffer(nb::handle obj, bool writable) {
  auto* e = new PyExport();
  int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &e->view, flags) != 0) {
    delete e;
    throw nb::python_error();
  }
  const auto* data = static_cast<const std::byte*>(e->view.buf);
  size_t size = static_cast<size_t>(e->view.len);
  std::shared_ptr<PyExport> owner(e, DeferredRelease{});
  return Buffer(std::shared_ptr<const void>(std::move(owner), e), data, size);
}

Buffer pin_foreign_memory(nb::handle owner, uintptr_t addr, size_t size, bool writable) {
  auto* e = new PyExport();
  // Fills the view without reading it; the view holds a reference to `owner`.
  if (PyBuffer_FillInfo(&e->view, owner.ptr(), reinterpret_cast<void*>(addr),
                        static_cast<Py_ssize_t>(size), writable ? 0 : 1, PyBUF_SIMPLE) != 0) {
    delete e;
    throw nb::python_error();
  }
  std::shared_ptr<PyExport> keep(e, DeferredRelease{});
  return Buffer(std::shared_ptr<const void>(std::move(keep), e),
                reinterpret_cast<const std::byte*>(addr), size);
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
  if (g_translator != nullptr) {
    // The one table (podium._src.errors): the same exception as a reply carrying this error.
    nb::object exc = nb::borrow(g_translator)(static_cast<int>(e.subsystem),
                                              static_cast<int>(e.code), e.message);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    throw nb::python_error();
  }
  // Before podium._src.errors is imported (importing `podium` imports it): the raw error.
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

  // The C++ error enums (docs/python.md, "Errors"). ERRC maps each Subsystem that has an enum
  // to it; podium._src.errors keeps the one table from these codes to Python exceptions, and
  // tests/python/test_errors.py checks that every enumerator has its row.
  bind_enum<Subsystem>(m, "Subsystem", "IntEnum");
  nb::dict errc;
  bind_errc<BaseErrc>(m, errc, "BaseErrc");
  bind_errc<ndslice::NdsliceErrc>(m, errc, "NdsliceErrc");
  bind_errc<wire::WireErrc>(m, errc, "WireErrc");
  bind_errc<channel::ChannelErrc>(m, errc, "ChannelErrc");
  bind_errc<actor::ActorErrc>(m, errc, "ActorErrc");
  bind_errc<host::HostErrc>(m, errc, "HostErrc");
  bind_errc<mesh::MeshErrc>(m, errc, "MeshErrc");
  bind_errc<data::DataErrc>(m, errc, "DataErrc");
  m.attr("ERRC") = errc;
  m.def(
      "set_error_translator",
      [](nb::object fn) {
        if (!PyCallable_Check(fn.ptr())) throw nb::type_error("set_error_translator: not callable");
        PyObject* old = g_translator;
        g_translator = fn.release().ptr();
        Py_XDECREF(old);
      },
      nb::arg("fn"),
      "Installs fn(subsystem, code, message) -> exception: the exception every binding raises "
      "for a C++ Error (podium._src.errors.from_core installs itself on import).");

  nb::class_<PartBuffer>(m, "PartBuffer", nb::type_slots(g_part_slots),
                         "A buffer over one message part (no copy); writable when it alone holds received "
                         "memory.")
      .def("__len__", [](const PartBuffer& p) { return p.buf.size(); });

  m.def(
      "as_part",
      [](nb::handle obj) { return part_to_python(buffer_from_python(obj)); },
      "The message part podium would send for the buffer `obj` (copied when small, shared "
      "when large).");
  m.def(
      "edit_distance_below",
      [](std::string_view a, std::string_view b, size_t limit) {
        return base::edit_distance_below(a, b, limit);
      },
      nb::arg("a"), nb::arg("b"), nb::arg("limit"),
      "The Levenshtein distance of a and b, in code points, if it is below limit; else None "
      "(ED-1). The log aggregator's similarity test (podium._src.log_aggregate).");
  m.def("release_deferred", &release_deferred,
        "Releases the Python buffers of message parts that the core no longer needs.");
  m.def("deferred_count", [] {
    std::lock_guard lock(g_release_mu);
    return g_release.size();
  });
}

}  // namespace podium::python
