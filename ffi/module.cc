// nanobind module _native_cpu: capsules for the CPU handlers (the Python
// side, jax_amp_scale/mechanisms/handlers.py, registers them with XLA) and the
// XLA FFI API version they were compiled against.
#include <nanobind/nanobind.h>

#include "capsule_module.h"
#include "targets.h"
#include "xla/ffi/api/c_api.h"

extern "C" XLA_FFI_Error* JasUpdateScaleCpu(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* JasUnscaleAndCheckCpu(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* JasUnscaleCheckAmaxCpu(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* JasHostReportCpu(XLA_FFI_CallFrame*);

NB_MODULE(_native_cpu, m) {
  jas::DefineCapsuleModule(m, "jax_amp_scale CPU XLA FFI handlers (capsules only).",
                           {{jas::kUpdateScaleTarget, &JasUpdateScaleCpu},
                            {jas::kUnscaleAndCheckTarget, &JasUnscaleAndCheckCpu},
                            {jas::kUnscaleCheckAmaxTarget, &JasUnscaleCheckAmaxCpu},
                            {jas::kHostReportTarget, &JasHostReportCpu}});
  // Only this module serves the host report (ffi/host_report.cc).
  m.attr("HOST_REPORT_TARGET") = jas::kHostReportTarget;
  // Only this module serves the pass with the amax (ffi/unscale_and_check.cc).
  m.attr("UNSCALE_CHECK_AMAX_TARGET") = jas::kUnscaleCheckAmaxTarget;
  m.def("ffi_api_version", []() {
    return nanobind::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  });
}
