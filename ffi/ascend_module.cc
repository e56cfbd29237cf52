// nanobind module _native_ascend: the capsule of the Ascend handler and
// load_cann(), which loads CANN early for a Python error.  No CANN header or
// library is needed to build or import it.  Test-only controls (the CPU test
// binding, forgetting CANN, inspecting workspaces) live in the test
// extension _ascend_testing (tests/native/ascend_testing_module.cc), never
// in the wheel.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <stdexcept>
#include <string>

#include "ascend_loader.h"
#include "capsule_module.h"
#include "targets.h"
#include "xla/ffi/api/c_api.h"

extern "C" XLA_FFI_Error* JasUpdateScaleAscend(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* JasUnscaleAndCheckAscend(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* JasFloatStatusClearAscend(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* JasFloatStatusReadAscend(XLA_FFI_CallFrame*);

NB_MODULE(_native_ascend, m) {
  jas::DefineCapsuleModule(m, "jax_amp_scale Ascend (aclnnAmpUpdateScale) XLA FFI handlers.",
                           {{jas::kUpdateScaleTarget, &JasUpdateScaleAscend},
                            {jas::kUnscaleAndCheckTarget, &JasUnscaleAndCheckAscend},
                            {jas::kFloatStatusClearTarget, &JasFloatStatusClearAscend},
                            {jas::kFloatStatusReadTarget, &JasFloatStatusReadAscend}});
  m.attr("FLOAT_STATUS_CLEAR_TARGET") = jas::kFloatStatusClearTarget;
  m.attr("FLOAT_STATUS_READ_TARGET") = jas::kFloatStatusReadTarget;
  m.def("load_cann", []() {
    std::string err;
    const jas::LoadedCann* c = jas::GetCann(&err);
    if (c == nullptr) throw std::runtime_error(err);
    nanobind::dict d;
    d["opapi"] = c->opapi_path;
    d["nnopbase"] = c->nnopbase_path;
    d["ascendcl"] = c->ascendcl_path;
    d["opapi_nn"] = c->opapi_nn_path;
    d["fused_pass_error"] = c->foreach_error;
    d["soc"] = c->soc;
    d["overflow_mode"] = c->overflow_mode;
    return d;
  });
}
