// nanobind module _ascend_testing: test-only controls of the Ascend handler,
// built by the tests (tests/native/build.py, CMake option JAS_TESTING) from
// the same ffi/ sources as _native_ascend, and never installed.
//
// JasUpdateScaleAscendTest binds the production checks and dispatch
// (handler_common.h, ffi/ascend.h) on CPU with a null stream: pointed at the
// CANN test double (tests/cann_double) it runs under jax.jit without an NPU.
// The float status bindings (ffi/ascend_float_status.h) do the same for the
// overflow flag, after setting the double's current device to the call's
// (the plugin's context on an NPU); the saturate binding plays a
// saturation-mode float16 backward for the tests.  The other functions reach
// this module's own CANN loader and workspace cache (each extension has its
// own copy of that state).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "ascend.h"
#include "ascend_dispatch.h"
#include "ascend_float_status.h"
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

inline constexpr char kClearTestTarget[] = "jas_float_status_clear_ascend_test";
inline constexpr char kReadTestTarget[] = "jas_float_status_read_ascend_test";
inline constexpr char kSaturateTestTarget[] = "jas_saturate_ascend_test";

// A function of the loaded CANN's libascendcl.so (the double's), or nullptr.
void* AscendclSymbol(const char* name) {
  std::string err;
  const LoadedCann* cann = GetCann(&err);
  if (cann == nullptr) return nullptr;
  void* h = dlopen(cann->ascendcl_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  return h != nullptr ? dlsym(h, name) : nullptr;
}

// The plugin's context on an NPU: the current device is the call's.  On CPU
// the test binding sets it in the double (aclrtSetDevice), per thread.
ffi::Error SetDevice(int64_t device) {
  using SetDeviceFn = int (*)(int32_t);
  auto set = reinterpret_cast<SetDeviceFn>(AscendclSymbol("aclrtSetDevice"));
  if (set == nullptr || set(static_cast<int32_t>(device)) != 0) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, "aclrtSetDevice failed");
  }
  return ffi::Error::Success();
}

ffi::Error ClearOnNullStream(int64_t device, ffi::RemainingArgs args,
                             ffi::Result<ffi::AnyBuffer> out) {
  ffi::Error e = SetDevice(device);
  if (e.failure()) return e;
  return ClearFloatStatusOnAscend(/*stream=*/nullptr, args, out);
}

ffi::Error ReadOnNullStream(int64_t device, ffi::RemainingArgs args,
                            ffi::Result<ffi::AnyBuffer> out) {
  ffi::Error e = SetDevice(device);
  if (e.failure()) return e;
  return ReadFloatStatusOnAscend(/*stream=*/nullptr, args, out);
}

// What a saturation-mode NPU does to a float16 backward, for the tests: each
// float16 inf becomes +-65504 and each NaN 0, in place, and any such entry
// sets this device's float status register (the double's test control
// cd_raise_float_status).  Other dtypes pass unchanged.
ffi::Error SaturateOnCpu(int64_t device, ffi::RemainingArgs leaves, ffi::RemainingRets outs) {
  ffi::Error e = SetDevice(device);
  if (e.failure()) return e;
  bool overflow = false;
  for (size_t k = 0; k < leaves.size(); ++k) {
    ffi::ErrorOr<ffi::AnyBuffer> in = leaves.get<ffi::AnyBuffer>(k);
    ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> out = outs.get<ffi::AnyBuffer>(k);
    if (in.has_error()) return in.error();
    if (out.has_error()) return out.error();
    auto* src = static_cast<const uint16_t*>(in->untyped_data());
    auto* dst = static_cast<uint16_t*>((*out)->untyped_data());
    if (src != static_cast<const void*>(dst)) {
      std::memcpy(dst, src, in->size_bytes());
    }
    if (in->element_type() != ffi::DataType::F16) continue;
    for (size_t i = 0; i < in->element_count(); ++i) {
      const uint16_t h = dst[i];
      if ((h & 0x7C00u) != 0x7C00u) continue;  // finite
      overflow = true;
      dst[i] = (h & 0x03FFu) != 0 ? 0 : static_cast<uint16_t>((h & 0x8000u) | 0x7BFFu);
    }
  }
  if (overflow) {
    using RaiseFn = void (*)(int32_t);
    auto raise = reinterpret_cast<RaiseFn>(AscendclSymbol("cd_raise_float_status"));
    if (raise == nullptr) {
      return ffi::Error(ffi::ErrorCode::kFailedPrecondition, "not the CANN double");
    }
    raise(-1);  // the current device
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jas

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasFloatStatusClearAscendTest, jas::ClearOnNullStream,
                              (jas::FloatStatusBinding<jas::ffi::DeviceOrdinal>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JasFloatStatusReadAscendTest, jas::ReadOnNullStream,
                              (jas::FloatStatusBinding<jas::ffi::DeviceOrdinal>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JasSaturateAscendTest, jas::SaturateOnCpu,
                              (jas::ffi::Ffi::Bind()
                                   .Ctx<jas::ffi::DeviceOrdinal>()
                                   .RemainingArgs()
                                   .RemainingRets()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUnscaleAndCheckAscendTest, jas::UnscaleOnNullStream,
                              (jas::UnscaleAndCheckAscendBinding<jas::ffi::DeviceOrdinal>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUpdateScaleAscendTest,
                              jas::AscendOnCpu::Impl(jas::UpdateScaleOnNullStream),
                              jas::AscendOnCpu::Bind());

NB_MODULE(_ascend_testing, m) {
  jas::DefineCapsuleModule(
      m, "jax_amp_scale tests: the Ascend dispatch on CPU (CANN test double).",
      {{jas::kAscendTestTarget, &JasUpdateScaleAscendTest},
       {jas::kAscendUnscaleTestTarget, &JasUnscaleAndCheckAscendTest},
       {jas::kClearTestTarget, &JasFloatStatusClearAscendTest},
       {jas::kReadTestTarget, &JasFloatStatusReadAscendTest},
       {jas::kSaturateTestTarget, &JasSaturateAscendTest}});
  m.attr("TEST_TARGET") = jas::kAscendTestTarget;
  m.attr("UNSCALE_TEST_TARGET") = jas::kAscendUnscaleTestTarget;
  m.attr("CLEAR_TEST_TARGET") = jas::kClearTestTarget;
  m.attr("READ_TEST_TARGET") = jas::kReadTestTarget;
  m.attr("SATURATE_TEST_TARGET") = jas::kSaturateTestTarget;
  // This module's own loader state: what _native_ascend.load_cann reports.
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
