// XLA FFI handlers for the Ascend operator aclnnAmpUpdateScale.
//
// JasUpdateScaleAscend is the production handler: it binds the device
// stream (PlatformStream<aclrtStream>) and is registered for the PJRT plugin
// platform (jax_amp_scale.plugin.register).  JasUpdateScaleAscendTest is a
// test-only binding registered on CPU under its own target name: it passes a
// null stream and runs the same validation and the same dispatch against the
// CANN test double (tests/cann_double), under jax.jit on CPU.  Checks and
// binding are handler_common.h's; this file only loads CANN and dispatches.
#include <cstdint>
#include <string>

#include "ascend_dispatch.h"
#include "ascend_loader.h"
#include "handler_common.h"
#include "xla/ffi/api/ffi.h"

namespace jas {
namespace {

ffi::Error UpdateScaleOnAscend(cann::aclrtStream stream, int64_t device,
                               const UpdateScaleCall& call) {
  std::string err;
  const LoadedCann* cann = GetCann(&err);
  if (cann == nullptr) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, err);
  err = DispatchUpdateScale(cann->api, GlobalWorkspaceCache(), device, stream, call);
  if (!err.empty()) return ffi::Error(ffi::ErrorCode::kInternal, err);
  return ffi::Error::Success();
}

ffi::Error UpdateScaleOnNullStream(int64_t device, const UpdateScaleCall& call) {
  return UpdateScaleOnAscend(/*stream=*/nullptr, device, call);
}

using AscendStream = ffi::PlatformStream<cann::aclrtStream>;
using Ascend = UpdateScaleFfi<AscendStream, ffi::DeviceOrdinal>;
using AscendOnCpu = UpdateScaleFfi<ffi::DeviceOrdinal>;

}  // namespace
}  // namespace jas

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUpdateScaleAscend,
                              jas::Ascend::Impl(jas::UpdateScaleOnAscend),
                              jas::Ascend::Bind());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUpdateScaleAscendTest,
                              jas::AscendOnCpu::Impl(jas::UpdateScaleOnNullStream),
                              jas::AscendOnCpu::Bind());
