// nanobind module _native_cuda (optional: built only where CMake finds a
// working CUDA compiler).  Capsules only; _ffi registers them on "CUDA".
#include <nanobind/nanobind.h>

#include "xla/ffi/api/c_api.h"

extern "C" XLA_FFI_Error* JasUpdateScaleCuda(XLA_FFI_CallFrame*);

namespace nb = nanobind;

NB_MODULE(_native_cuda, m) {
  m.doc() = "jax_amp_scale CUDA XLA FFI handlers (capsules only).";
  m.def("registrations", []() {
    nb::dict d;
    d["jas_update_scale"] = nb::capsule(reinterpret_cast<void*>(&JasUpdateScaleCuda));
    return d;
  });
}
