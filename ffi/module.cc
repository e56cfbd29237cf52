// nanobind module for the CPU handlers: it only hands out capsules; the
// Python side (jax_amp_scale/_ffi.py) registers them with XLA.
#include <nanobind/nanobind.h>

#include "xla/ffi/api/c_api.h"

extern "C" XLA_FFI_Error* JasUpdateScaleCpu(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* JasUnscaleAndCheckCpu(XLA_FFI_CallFrame*);

namespace nb = nanobind;

NB_MODULE(_native_cpu, m) {
  m.doc() = "jax_amp_scale CPU XLA FFI handlers (capsules only).";
  m.def("registrations", []() {
    nb::dict d;
    d["jas_update_scale"] =
        nb::capsule(reinterpret_cast<void*>(&JasUpdateScaleCpu));
    d["jas_unscale_and_check"] =
        nb::capsule(reinterpret_cast<void*>(&JasUnscaleAndCheckCpu));
    return d;
  });
  m.def("ffi_api_version", []() {
    return nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  });
}
