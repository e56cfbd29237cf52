// CUDA handler for the update-scale custom call: one kernel on the XLA
// stream, one thread per (possibly vmapped) state, in place (XLA aliases the
// outputs to the inputs).  The rule is ffi/update_scale.h, shared with the
// CPU handler, so both give the same bits.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "handler_common.h"
#include "update_scale.h"
#include "xla/ffi/api/ffi.h"

namespace jas {
namespace {

__global__ void UpdateScaleKernel(ScaleDtype dtype, const void* scale,
                                  const int32_t* tracker, const void* found_inf,
                                  void* scale_out, int32_t* tracker_out,
                                  int64_t count, Factor growth_factor,
                                  Factor backoff_factor, int64_t growth_interval) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) {
    UpdateElement(dtype, scale, tracker, found_inf, scale_out, tracker_out, i,
                  growth_factor, backoff_factor, growth_interval);
  }
}

ffi::Error UpdateScaleCuda(cudaStream_t stream, ffi::AnyBuffer scale,
                           ffi::AnyBuffer tracker, ffi::AnyBuffer found_inf,
                           ffi::Result<ffi::AnyBuffer> scale_out,
                           ffi::Result<ffi::AnyBuffer> tracker_out,
                           double growth_factor, double backoff_factor,
                           int64_t growth_interval) {
  CheckedCall call{};
  std::string err = CheckCall(scale, tracker, found_inf, *scale_out, *tracker_out,
                              growth_factor, backoff_factor, growth_interval, &call);
  if (!err.empty()) return ffi::Error::InvalidArgument(err);
  if (call.count == 0) return ffi::Error::Success();

  constexpr int kThreads = 128;
  const int64_t blocks = (call.count + kThreads - 1) / kThreads;
  if (blocks > 2147483647) return ffi::Error::InvalidArgument("batch too large");
  UpdateScaleKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
      call.dtype, scale.untyped_data(),
      static_cast<const int32_t*>(tracker.untyped_data()), found_inf.untyped_data(),
      scale_out->untyped_data(), static_cast<int32_t*>(tracker_out->untyped_data()),
      call.count, SplitFactor(growth_factor), SplitFactor(backoff_factor), growth_interval);
  const cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      std::string("update-scale kernel launch failed: ") +
                          cudaGetErrorString(launch));
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jas

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUpdateScaleCuda, jas::UpdateScaleCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()  // current_scale
                                  .Arg<xla::ffi::AnyBuffer>()  // growth_tracker
                                  .Arg<xla::ffi::AnyBuffer>()  // found_inf
                                  .Ret<xla::ffi::AnyBuffer>()  // updated_scale
                                  .Ret<xla::ffi::AnyBuffer>()  // updated_tracker
                                  .Attr<double>("growth_factor")
                                  .Attr<double>("backoff_factor")
                                  .Attr<int64_t>("growth_interval"));
