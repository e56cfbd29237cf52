// What every XLA FFI handler of jax_amp_scale shares: buffer and attribute
// checks that return ffi::Error (or an ffi::ErrorOr of the checked call) and
// the contexts a binding starts with.  Each operator's own binding is in its
// header's FFI companion (update_scale_ffi.h).
//
// Every handler validates what XLA hands it before touching memory and
// reports problems as ffi::Error, never by crashing.
#ifndef JAX_AMP_SCALE_FFI_HANDLER_COMMON_H_
#define JAX_AMP_SCALE_FFI_HANDLER_COMMON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "float_formats.h"
#include "xla/ffi/api/ffi.h"

namespace jas {

namespace ffi = ::xla::ffi;

inline const char* DtypeName(ffi::DataType dt) {
  switch (dt) {
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::PRED: return "bool";
    default: return "another dtype";
  }
}

// The InvalidArgument error, as an ErrorOr<T> of any T accepts it.
inline ffi::Unexpected<ffi::Error> InvalidArgument(std::string message) {
  return ffi::Unexpected<ffi::Error>(ffi::Error::InvalidArgument(std::move(message)));
}

inline ffi::ErrorOr<ScaleDtype> ToScaleDtype(ffi::DataType dt) {
  switch (dt) {
    case ffi::DataType::F32: return ScaleDtype::kF32;
    case ffi::DataType::F16: return ScaleDtype::kF16;
    case ffi::DataType::BF16: return ScaleDtype::kBF16;
    default:
      return InvalidArgument(
          std::string("current_scale must be float32, float16 or bfloat16, got ") +
          DtypeName(dt));
  }
}

// The k-th gradient leaf of a fused-pass call and its unscaled result,
// checked: both array buffers, the leaf's dtype one `allowed` accepts
// (`allowed_names` spells them for the message), the result of the leaf's
// dtype and element count, data where there are elements.
struct CheckedLeaf {
  ffi::AnyBuffer in;
  ffi::AnyBuffer out;
};

template <typename Allowed>
ffi::ErrorOr<CheckedLeaf> CheckLeaf(const ffi::RemainingArgs& leaves,
                                    const ffi::RemainingRets& outs, size_t k,
                                    Allowed allowed, const char* allowed_names) {
  auto in = leaves.get<ffi::AnyBuffer>(k);
  auto out = outs.get<ffi::AnyBuffer>(k);
  const std::string leaf = "leaf " + std::to_string(k);
  if (!in.has_value() || !out.has_value()) return InvalidArgument(leaf + " is not an array buffer");
  const ffi::DataType dt = in->element_type();
  if (!allowed(dt)) {
    return InvalidArgument(leaf + " must be " + allowed_names + ", got " + DtypeName(dt));
  }
  if ((*out)->element_type() != dt || (*out)->element_count() != in->element_count()) {
    return InvalidArgument("unscaled " + leaf +
                           " must have the dtype and element count of its gradient leaf");
  }
  if (in->element_count() > 0 &&
      (in->untyped_data() == nullptr || (*out)->untyped_data() == nullptr)) {
    return InvalidArgument(leaf + " has elements but a null data pointer");
  }
  return CheckedLeaf{*in, **out};
}

namespace internal {
// XLA's Binding can be neither copied nor moved by others: every step below
// returns the prvalue of a Binding method, which C++17 never copies.

// `binding` with the contexts First, Rest... appended in order.
template <typename First, typename... Rest, typename Binding>
auto WithContexts(Binding&& binding) {
  if constexpr (sizeof...(Rest) == 0) {
    return std::move(binding).template Ctx<First>();
  } else {
    return WithContexts<Rest...>(std::move(binding).template Ctx<First>());
  }
}

}  // namespace internal

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_HANDLER_COMMON_H_
