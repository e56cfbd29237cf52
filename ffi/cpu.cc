// CPU handler for the update-scale custom call: host memory, one loop over
// the (possibly vmapped) batch of independent states.
#include <cstdint>
#include <string>

#include "handler_common.h"
#include "update_scale.h"
#include "xla/ffi/api/ffi.h"

namespace jas {
namespace {

ffi::Error UpdateScaleCpu(ffi::AnyBuffer scale, ffi::AnyBuffer tracker,
                          ffi::AnyBuffer found_inf,
                          ffi::Result<ffi::AnyBuffer> scale_out,
                          ffi::Result<ffi::AnyBuffer> tracker_out,
                          double growth_factor, double backoff_factor,
                          int64_t growth_interval) {
  CheckedCall call{};
  std::string err = CheckCall(scale, tracker, found_inf, *scale_out,
                              *tracker_out, growth_factor, backoff_factor,
                              growth_interval, &call);
  if (!err.empty()) return ffi::Error::InvalidArgument(err);

  const Factor gf = SplitFactor(growth_factor);
  const Factor bf = SplitFactor(backoff_factor);
  const auto* tracker_in = static_cast<const int32_t*>(tracker.untyped_data());
  auto* tracker_res = static_cast<int32_t*>(tracker_out->untyped_data());
  for (int64_t i = 0; i < call.count; ++i) {
    UpdateElement(call.dtype, scale.untyped_data(), tracker_in,
                  found_inf.untyped_data(), scale_out->untyped_data(),
                  tracker_res, i, gf, bf, growth_interval);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jas

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUpdateScaleCpu, jas::UpdateScaleCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()  // current_scale
                                  .Arg<xla::ffi::AnyBuffer>()  // growth_tracker
                                  .Arg<xla::ffi::AnyBuffer>()  // found_inf
                                  .Ret<xla::ffi::AnyBuffer>()  // updated_scale
                                  .Ret<xla::ffi::AnyBuffer>()  // updated_tracker
                                  .Attr<double>("growth_factor")
                                  .Attr<double>("backoff_factor")
                                  .Attr<int64_t>("growth_interval"));
