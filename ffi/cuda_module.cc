// nanobind module _native_cuda (optional: built only where CMake finds a
// working CUDA compiler).  Capsules only; jax_amp_scale/mechanisms/handlers.py
// registers them on "CUDA".
#include <nanobind/nanobind.h>

#include "capsule_module.h"
#include "targets.h"
#include "xla/ffi/api/c_api.h"

extern "C" XLA_FFI_Error* JasUpdateScaleCuda(XLA_FFI_CallFrame*);

NB_MODULE(_native_cuda, m) {
  jas::DefineCapsuleModule(m, "jax_amp_scale CUDA XLA FFI handlers (capsules only).",
                           {{jas::kUpdateScaleTarget, &JasUpdateScaleCuda}});
}
