// nanobind module _ascend_testing: test-only controls of the Ascend handler,
// built by the tests (tests/native/build.py, CMake option JAS_TESTING) from
// the same ffi/ sources as _native_ascend, and never installed.
//
// JasUpdateScaleAscendTest binds the production checks and dispatch
// (handler_common.h, ffi/ascend.h) on CPU with a null stream: pointed at the
// CANN test double (tests/cann_double) it runs under jax.jit without an NPU.
// The other functions reach this module's own CANN loader and workspace
// cache (each extension has its own copy of that state).
#include <nanobind/nanobind.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ascend.h"
#include "ascend_dispatch.h"
#include "ascend_loader.h"
#include "capsule_module.h"
#include "handler_common.h"
#include "xla/ffi/api/ffi.h"

namespace jas {
namespace {

inline constexpr char kAscendTestTarget[] = "jas_update_scale_ascend_test";
inline constexpr char kAscendUnscaleTestTarget[] = "jas_unscale_and_check_ascend_test";

using AscendOnCpu = UpdateScaleFfi<ffi::DeviceOrdinal>;

ffi::Error UpdateScaleOnNullStream(int64_t device, const UpdateScaleCall& call) {
  return UpdateScaleOnAscend(/*stream=*/nullptr, device, call);
}

ffi::Error UnscaleOnNullStream(int64_t device, ffi::AnyBuffer inv, ffi::AnyBuffer found_init,
                               ffi::RemainingArgs leaves, ffi::Result<ffi::AnyBuffer> found,
                               ffi::RemainingRets outs) {
  return UnscaleAndCheckOnAscend(/*stream=*/nullptr, device, inv, found_init, leaves, found,
                                 outs);
}

}  // namespace
}  // namespace jas

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUnscaleAndCheckAscendTest, jas::UnscaleOnNullStream,
                              (jas::UnscaleAndCheckAscendBinding<jas::ffi::DeviceOrdinal>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUpdateScaleAscendTest,
                              jas::AscendOnCpu::Impl(jas::UpdateScaleOnNullStream),
                              jas::AscendOnCpu::Bind());

NB_MODULE(_ascend_testing, m) {
  jas::DefineCapsuleModule(
      m, "jax_amp_scale tests: the Ascend dispatch on CPU (CANN test double).",
      {{jas::kAscendTestTarget, &JasUpdateScaleAscendTest},
       {jas::kAscendUnscaleTestTarget, &JasUnscaleAndCheckAscendTest}});
  m.attr("TEST_TARGET") = jas::kAscendTestTarget;
  m.attr("UNSCALE_TEST_TARGET") = jas::kAscendUnscaleTestTarget;
  m.def("forget_cann", []() { jas::ForgetCannForTests(); });
  m.def("workspaces", []() {
    nanobind::list out;
    for (const auto& e : jas::GlobalWorkspaceCache().Current()) {
      out.append(nanobind::make_tuple(e.device, reinterpret_cast<uintptr_t>(e.stream), e.size));
    }
    return out;
  });
  m.def("retired_workspaces", []() { return jas::GlobalWorkspaceCache().RetiredCount(); });
  m.def("release_workspaces", []() {
    std::string err = jas::GlobalWorkspaceCache().ReleaseAll();
    if (!err.empty()) throw std::runtime_error(err);
  });
}
