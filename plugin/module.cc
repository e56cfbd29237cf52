// nanobind module _native_plugin: the PJRT C API registrar for Python.  It
// exports the target names of ffi/targets.h like the capsule modules do.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "capsule_module.h"
#include "pjrt_register.h"

namespace nb = nanobind;

NB_MODULE(_native_plugin, m) {
  m.doc() = "jax_amp_scale: register XLA FFI handlers through the PJRT C API.";
  jas::AddTargetNames(m);
  m.def("api_from_library", &jas::ApiFromLibrary, nb::arg("path"));
  m.def("extensions", &jas::Extensions, nb::arg("api"));
  m.def(
      "register_handler",
      [](uintptr_t api, const std::string& target, nb::capsule handler,
         const std::string& platform) {
        return jas::RegisterHandler(api, target, handler.data(), platform);
      },
      nb::arg("api"), nb::arg("target"), nb::arg("handler"), nb::arg("platform"));
}
