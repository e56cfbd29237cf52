// The update-scale custom call's XLA FFI binding, which every platform's
// handler shares: the attribute and buffer checks and one binding builder.
// A platform's update-scale handler is then only what is platform-specific:
// its execution contexts (a stream, a device ordinal) and a function that
// runs one checked, non-empty UpdateScaleCall:
//
//   using Cuda = jas::UpdateScaleFfi<ffi::PlatformStream<cudaStream_t>>;
//   ffi::Error Launch(cudaStream_t stream, const jas::UpdateScaleCall& call);
//   XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUpdateScaleCuda, Cuda::Impl(Launch),
//                                 Cuda::Bind());
#ifndef JAX_AMP_SCALE_FFI_UPDATE_SCALE_FFI_H_
#define JAX_AMP_SCALE_FFI_UPDATE_SCALE_FFI_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "handler_common.h"
#include "update_scale.h"
#include "xla/ffi/api/ffi.h"

namespace jas {

// The "rule" attribute ("torch" or "cann") as a Rule.
inline ffi::ErrorOr<Rule> ToRule(std::string_view rule) {
  if (rule == "torch") return Rule::kTorch;
  if (rule == "cann") return Rule::kCann;
  return InvalidArgument("rule must be 'torch' or 'cann', got '" + std::string(rule) + "'");
}

// Checks the five buffers and four attributes of an update-scale call and
// returns the call they describe, or the InvalidArgument error naming what is
// wrong.  Nothing is read or written through the buffers.
inline ffi::ErrorOr<UpdateScaleCall> CheckUpdateScale(
    const ffi::AnyBuffer& scale, const ffi::AnyBuffer& tracker,
    const ffi::AnyBuffer& found_inf, const ffi::AnyBuffer& scale_out,
    const ffi::AnyBuffer& tracker_out, double growth_factor,
    double backoff_factor, int64_t growth_interval, std::string_view rule_name) {
  ffi::ErrorOr<Rule> rule = ToRule(rule_name);
  if (rule.has_error()) return ffi::Unexpected<ffi::Error>(rule.error());
  if (const char* err =
          CheckAttributes(growth_factor, backoff_factor, growth_interval, *rule)) {
    return InvalidArgument(err);
  }
  ffi::ErrorOr<ScaleDtype> dtype = ToScaleDtype(scale.element_type());
  if (dtype.has_error()) return ffi::Unexpected<ffi::Error>(dtype.error());
  if (found_inf.element_type() != scale.element_type()) {
    return InvalidArgument(std::string("found_inf must have the dtype of current_scale (") +
                           DtypeName(scale.element_type()) + "), got " +
                           DtypeName(found_inf.element_type()));
  }
  if (scale_out.element_type() != scale.element_type()) {
    return InvalidArgument("updated_scale must have the dtype of current_scale");
  }
  if (tracker.element_type() != ffi::DataType::S32 ||
      tracker_out.element_type() != ffi::DataType::S32) {
    return InvalidArgument(std::string("growth_tracker must be int32, got ") +
                           DtypeName(tracker.element_type()));
  }
  const size_t n = scale.element_count();
  if (tracker.element_count() != n || found_inf.element_count() != n ||
      scale_out.element_count() != n || tracker_out.element_count() != n) {
    return InvalidArgument(
        "current_scale, growth_tracker, found_inf and both outputs must have "
        "the same number of elements");
  }
  if (n > 0 && (scale.untyped_data() == nullptr || tracker.untyped_data() == nullptr ||
                found_inf.untyped_data() == nullptr ||
                scale_out.untyped_data() == nullptr ||
                tracker_out.untyped_data() == nullptr)) {
    return InvalidArgument("a buffer with elements has a null data pointer");
  }
  return UpdateScaleCall{*dtype,
                         scale.untyped_data(),
                         static_cast<int32_t*>(tracker.untyped_data()),
                         found_inf.untyped_data(),
                         scale_out.untyped_data(),
                         static_cast<int32_t*>(tracker_out.untyped_data()),
                         static_cast<int64_t>(n),
                         growth_factor,
                         backoff_factor,
                         growth_interval,
                         *rule};
}

namespace internal {

// `binding` with the update-scale operands and attributes appended
// (targets.h kUpdateScaleTarget).
template <typename Binding>
auto WithUpdateScaleOperands(Binding&& binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // current_scale
      .template Arg<ffi::AnyBuffer>()  // growth_tracker
      .template Arg<ffi::AnyBuffer>()  // found_inf
      .template Ret<ffi::AnyBuffer>()  // updated_scale (aliases current_scale)
      .template Ret<ffi::AnyBuffer>()  // updated_tracker (aliases growth_tracker)
      .template Attr<double>("growth_factor")
      .template Attr<double>("backoff_factor")
      .template Attr<int64_t>("growth_interval")
      .template Attr<std::string_view>("rule");
}

}  // namespace internal

// The update-scale custom call for a platform whose handler takes the
// execution contexts `Ctx...` (e.g. ffi::PlatformStream<cudaStream_t>,
// ffi::DeviceOrdinal), in that order, before the operands every platform
// shares.
template <typename... Ctx>
struct UpdateScaleFfi {
  // The binding: the platform's contexts, then the common operands and
  // attributes (the Python side's jax.ffi.ffi_call passes them in this order).
  static auto Bind() {
    if constexpr (sizeof...(Ctx) == 0) {
      return internal::WithUpdateScaleOperands(ffi::Ffi::Bind());
    } else {
      return internal::WithUpdateScaleOperands(internal::WithContexts<Ctx...>(ffi::Ffi::Bind()));
    }
  }

  // The handler for Bind(): checks every buffer and attribute, returns at
  // once for an empty batch, else `run(ctx..., call)` (an ffi::Error) does
  // the platform's work on the checked call.
  template <typename Run>
  static auto Impl(Run run) {
    return [run](typename ffi::CtxDecoding<Ctx>::Type... ctx, ffi::AnyBuffer scale,
                 ffi::AnyBuffer tracker, ffi::AnyBuffer found_inf,
                 ffi::Result<ffi::AnyBuffer> scale_out,
                 ffi::Result<ffi::AnyBuffer> tracker_out, double growth_factor,
                 double backoff_factor, int64_t growth_interval,
                 std::string_view rule) -> ffi::Error {
      ffi::ErrorOr<UpdateScaleCall> call =
          CheckUpdateScale(scale, tracker, found_inf, *scale_out, *tracker_out,
                           growth_factor, backoff_factor, growth_interval, rule);
      if (call.has_error()) return call.error();
      if (call->count == 0) return ffi::Error::Success();
      return run(ctx..., *call);
    };
  }
};

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_UPDATE_SCALE_FFI_H_
