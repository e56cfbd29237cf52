// CUDA handler for the update-scale custom call: one kernel on the XLA
// stream, one thread per (possibly vmapped) state, in place (XLA aliases the
// outputs to the inputs).  Checks and binding are handler_common.h's; the
// rule is ffi/update_scale.h, shared with the CPU handler, so both give the
// same bits.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "update_scale_ffi.h"
#include "xla/ffi/api/ffi.h"

namespace jas {
namespace {

using Cuda = UpdateScaleFfi<ffi::PlatformStream<cudaStream_t>>;

__global__ void UpdateScaleKernel(UpdateScaleCall call, Factor growth_factor,
                                  Factor backoff_factor) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < call.count) {
    UpdateElement(call.dtype, call.scale, call.tracker, call.found_inf,
                  call.scale_out, call.tracker_out, i, growth_factor,
                  backoff_factor, call.growth_interval, call.rule);
  }
}

ffi::Error LaunchOnStream(cudaStream_t stream, const UpdateScaleCall& call) {
  constexpr int kThreads = 128;
  const int64_t blocks = (call.count + kThreads - 1) / kThreads;
  if (blocks > 2147483647) return ffi::Error::InvalidArgument("batch too large");
  UpdateScaleKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
      call, FactorFor(call.rule, call.growth_factor),
      FactorFor(call.rule, call.backoff_factor));
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUpdateScaleCuda, jas::Cuda::Impl(jas::LaunchOnStream),
                              jas::Cuda::Bind());
