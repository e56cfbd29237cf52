// XLA FFI handler for the Ascend operator aclnnAmpUpdateScale.
//
// JasUpdateScaleAscend binds the device stream
// (PlatformStream<aclrtStream>) and the device ordinal, and is registered
// for the PJRT plugin platform (jax_amp_scale.plugin.register).  Checks and
// binding are handler_common.h's; this file only loads CANN and dispatches.
#include "ascend.h"

#include <cstdint>
#include <string>

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

namespace {
using AscendStream = ffi::PlatformStream<cann::aclrtStream>;
using Ascend = UpdateScaleFfi<AscendStream, ffi::DeviceOrdinal>;
}  // namespace

}  // namespace jas

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUpdateScaleAscend,
                              jas::Ascend::Impl(jas::UpdateScaleOnAscend),
                              jas::Ascend::Bind());
