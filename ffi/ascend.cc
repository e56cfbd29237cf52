// XLA FFI handler for the Ascend operator aclnnAmpUpdateScale.
//
// JasUpdateScaleAscend binds the device stream
// (PlatformStream<aclrtStream>) and the device ordinal, and is registered
// for the PJRT plugin platform (jax_amp_scale.plugin.register).  Checks and
// binding are handler_common.h's; this file only loads CANN and dispatches.
#include "ascend.h"

#include <cstdint>
#include <string>
#include <vector>

#include "ascend_dispatch.h"
#include "ascend_loader.h"
#include "handler_common.h"
#include "xla/ffi/api/ffi.h"

namespace jas {

ffi::Error UpdateScaleOnAscend(cann::aclrtStream stream, int64_t device,
                               const UpdateScaleCall& call) {
  std::string err;
  const LoadedCann* cann = GetCann(&err);
  if (cann == nullptr) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, err);
  err = DispatchUpdateScale(cann->api, GlobalWorkspaceCache(), device, stream, call);
  if (!err.empty()) return ffi::Error(ffi::ErrorCode::kInternal, err);
  return ffi::Error::Success();
}

ffi::Error UnscaleAndCheckOnAscend(cann::aclrtStream stream, int64_t device,
                                   ffi::AnyBuffer inv_scale, ffi::AnyBuffer found_init,
                                   ffi::RemainingArgs leaves, ffi::Result<ffi::AnyBuffer> found,
                                   ffi::RemainingRets outs) {
  auto f32_one = [](const ffi::AnyBuffer& b) {
    return b.element_type() == ffi::DataType::F32 && b.element_count() == 1 &&
           b.untyped_data() != nullptr;
  };
  if (!f32_one(inv_scale)) return ffi::Error::InvalidArgument("inv_scale must be one float32");
  if (!f32_one(found_init) || !f32_one(*found)) {
    return ffi::Error::InvalidArgument("found_inf must be one float32");
  }
  if (found->untyped_data() != found_init.untyped_data()) {
    return ffi::Error::InvalidArgument(
        "found_inf must alias its zero-initialised operand (input_output_aliases {1: 0})");
  }
  if (leaves.size() != outs.size()) {
    return ffi::Error::InvalidArgument(
        "the call must have as many unscaled results as gradient leaves");
  }
  std::vector<UnscaleLeaf> work;
  auto operator_dtype = [](ffi::DataType dt) { return !ToScaleDtype(dt).has_error(); };
  for (size_t k = 0; k < leaves.size(); ++k) {
    ffi::ErrorOr<CheckedLeaf> leaf =
        CheckLeaf(leaves, outs, k, operator_dtype, "float32, float16 or bfloat16");
    if (leaf.has_error()) return leaf.error();
    if (leaf->out.untyped_data() != leaf->in.untyped_data()) {
      return ffi::Error::InvalidArgument(
          "aclnnForeachNonFiniteCheckAndUnscale works in place: unscaled leaf " +
          std::to_string(k) + " must alias its leaf");
    }
    work.push_back(UnscaleLeaf{*ToScaleDtype(leaf->in.element_type()), leaf->in.untyped_data(),
                               static_cast<int64_t>(leaf->in.element_count())});
  }
  std::string err;
  const LoadedCann* cann = GetCann(&err);
  if (cann == nullptr) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, err);
  if (!cann->foreach_error.empty()) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jax_amp_scale: the fused gradient pass needs "
                      "aclnnForeachNonFiniteCheckAndUnscale: " + cann->foreach_error);
  }
  err = DispatchUnscaleAndCheck(cann->api, GlobalWorkspaceCache(), device, stream,
                                inv_scale.untyped_data(), found->untyped_data(), work);
  if (!err.empty()) return ffi::Error(ffi::ErrorCode::kInternal, err);
  return ffi::Error::Success();
}

namespace {
using AscendStream = ffi::PlatformStream<cann::aclrtStream>;
using Ascend = UpdateScaleFfi<AscendStream, ffi::DeviceOrdinal>;
}  // namespace

}  // namespace jas

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JasUnscaleAndCheckAscend, jas::UnscaleAndCheckOnAscend,
    (jas::UnscaleAndCheckAscendBinding<jas::AscendStream, jas::ffi::DeviceOrdinal>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUpdateScaleAscend,
                              jas::Ascend::Impl(jas::UpdateScaleOnAscend),
                              jas::Ascend::Bind());
