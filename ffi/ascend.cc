// XLA FFI handlers for the Ascend operator aclnnAmpUpdateScale.
//
// JasUpdateScaleAscend is the production handler: it binds the device
// stream (PlatformStream<aclrtStream>) and is registered for the PJRT plugin
// platform (jax_amp_scale.plugin.register).  JasUpdateScaleAscendTest is a
// test-only binding registered on CPU under its own target name: it passes a
// null stream and runs the same validation and the same dispatch against the
// CANN test double (tests/cann_double), under jax.jit on CPU.
#include <cstdint>
#include <string>

#include "ascend_dispatch.h"
#include "ascend_loader.h"
#include "handler_common.h"
#include "xla/ffi/api/ffi.h"

namespace jas {
namespace {

ffi::Error UpdateScaleAscend(cann::aclrtStream stream, int64_t device,
                             ffi::AnyBuffer scale, ffi::AnyBuffer tracker,
                             ffi::AnyBuffer found_inf,
                             ffi::Result<ffi::AnyBuffer> scale_out,
                             ffi::Result<ffi::AnyBuffer> tracker_out,
                             double growth_factor, double backoff_factor,
                             int64_t growth_interval) {
  CheckedCall checked{};
  std::string err = CheckCall(scale, tracker, found_inf, *scale_out, *tracker_out,
                              growth_factor, backoff_factor, growth_interval, &checked);
  if (!err.empty()) return ffi::Error::InvalidArgument(err);
  if (checked.count == 0) return ffi::Error::Success();

  const LoadedCann* cann = GetCann(&err);
  if (cann == nullptr) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, err);

  UpdateScaleCall call{checked.dtype,
                       scale.untyped_data(),
                       static_cast<int32_t*>(tracker.untyped_data()),
                       found_inf.untyped_data(),
                       scale_out->untyped_data(),
                       static_cast<int32_t*>(tracker_out->untyped_data()),
                       checked.count,
                       growth_factor,
                       backoff_factor,
                       growth_interval};
  err = DispatchUpdateScale(cann->api, GlobalWorkspaceCache(), device, stream, call);
  if (!err.empty()) return ffi::Error(ffi::ErrorCode::kInternal, err);
  return ffi::Error::Success();
}

ffi::Error UpdateScaleAscendTest(int64_t device, ffi::AnyBuffer scale,
                                 ffi::AnyBuffer tracker, ffi::AnyBuffer found_inf,
                                 ffi::Result<ffi::AnyBuffer> scale_out,
                                 ffi::Result<ffi::AnyBuffer> tracker_out,
                                 double growth_factor, double backoff_factor,
                                 int64_t growth_interval) {
  return UpdateScaleAscend(/*stream=*/nullptr, device, scale, tracker, found_inf,
                           scale_out, tracker_out, growth_factor, backoff_factor,
                           growth_interval);
}

}  // namespace
}  // namespace jas

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JasUpdateScaleAscend, jas::UpdateScaleAscend,
    xla::ffi::Ffi::Bind()
        .Ctx<xla::ffi::PlatformStream<jas::cann::aclrtStream>>()
        .Ctx<xla::ffi::DeviceOrdinal>()
        .Arg<xla::ffi::AnyBuffer>()  // current_scale
        .Arg<xla::ffi::AnyBuffer>()  // growth_tracker
        .Arg<xla::ffi::AnyBuffer>()  // found_inf
        .Ret<xla::ffi::AnyBuffer>()  // updated_scale (aliases current_scale)
        .Ret<xla::ffi::AnyBuffer>()  // updated_tracker (aliases growth_tracker)
        .Attr<double>("growth_factor")
        .Attr<double>("backoff_factor")
        .Attr<int64_t>("growth_interval"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUpdateScaleAscendTest, jas::UpdateScaleAscendTest,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<double>("growth_factor")
                                  .Attr<double>("backoff_factor")
                                  .Attr<int64_t>("growth_interval"));
