// podium._core: the one Python extension module of podium.
//
// Each C++ layer's bindings live in python/bindings/<layer>.cc and define
// `void podium::python::bind_<layer>(nanobind::module_&)`; python/bindings/CMakeLists.txt lists
// them (podium_binding(...)) and generates podium_bindings.inc, so this file never changes when
// a binding file is added. Each layer gets its own submodule, podium._core.<layer>.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

namespace nb = nanobind;

namespace podium::python {
#define PODIUM_BINDING(layer) void bind_##layer(nb::module_& m);
#include "podium_bindings.inc"
#undef PODIUM_BINDING

namespace {

// Names of the layers that have a binding file, in registration order.
std::vector<std::string> binding_layers() {
  return {
#define PODIUM_BINDING(layer) #layer,
#include "podium_bindings.inc"
#undef PODIUM_BINDING
  };
}

// File names of the executables installed into podium/_bin/ (podium_runtime_binary()).
std::vector<std::string> runtime_binaries() {
  return {
#include "podium_runtime_binaries.inc"
  };
}

nb::dict build_info() {
  nb::dict info;
  info["version"] = PODIUM_VERSION;
  info["compiler"] = PODIUM_COMPILER;
  info["build_type"] = PODIUM_BUILD_TYPE;
  info["cxx_standard"] = static_cast<long>(__cplusplus);
  info["bindings"] = binding_layers();
  info["runtime_binaries"] = runtime_binaries();
  return info;
}

}  // namespace
}  // namespace podium::python

NB_MODULE(_core, m) {
  m.doc() = "podium's C++ core (nanobind extension)";
  m.def("build_info", &podium::python::build_info,
        "Version, compiler, build type, binding layers and runtime binaries of this build.");
#define PODIUM_BINDING(layer)                                                 \
  {                                                                             \
    nb::module_ sub = m.def_submodule(#layer, "podium C++ layer " #layer);      \
    podium::python::bind_##layer(sub);                                          \
  }
#include "podium_bindings.inc"
#undef PODIUM_BINDING
}
