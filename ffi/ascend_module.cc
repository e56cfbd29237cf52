// nanobind module _native_ascend: capsules for the Ascend handlers and the
// few controls jax_amp_scale._ascend needs (load CANN early for a Python
// error, inspect and release the workspace cache in tests).  No CANN header
// or library is needed to build or import it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <stdexcept>
#include <string>

#include "ascend_dispatch.h"
#include "ascend_loader.h"
#include "capsule_module.h"
#include "targets.h"
#include "xla/ffi/api/c_api.h"

extern "C" XLA_FFI_Error* JasUpdateScaleAscend(XLA_FFI_CallFrame*);
extern "C" XLA_FFI_Error* JasUpdateScaleAscendTest(XLA_FFI_CallFrame*);

namespace nb = nanobind;

NB_MODULE(_native_ascend, m) {
  jas::DefineCapsuleModule(m, "jax_amp_scale Ascend (aclnnAmpUpdateScale) XLA FFI handlers.",
                           {{jas::kUpdateScaleTarget, &JasUpdateScaleAscend}});
  m.def("test_registrations", []() {
    nb::dict d;
    d["jas_update_scale_ascend_test"] =
        nb::capsule(reinterpret_cast<void*>(&JasUpdateScaleAscendTest));
    return d;
  });
  m.def("load_cann", []() {
    std::string err;
    const jas::LoadedCann* c = jas::GetCann(&err);
    if (c == nullptr) throw std::runtime_error(err);
    nb::dict d;
    d["opapi"] = c->opapi_path;
    d["nnopbase"] = c->nnopbase_path;
    d["ascendcl"] = c->ascendcl_path;
    return d;
  });
  m.def("forget_cann_for_tests", []() { jas::ForgetCannForTests(); });
  m.def("workspaces", []() {
    nb::list out;
    for (const auto& e : jas::GlobalWorkspaceCache().Current()) {
      out.append(nb::make_tuple(e.device, reinterpret_cast<uintptr_t>(e.stream), e.size));
    }
    return out;
  });
  m.def("retired_workspaces", []() { return jas::GlobalWorkspaceCache().RetiredCount(); });
  m.def("release_workspaces", []() {
    std::string err = jas::GlobalWorkspaceCache().ReleaseAll();
    if (!err.empty()) throw std::runtime_error(err);
  });
}
