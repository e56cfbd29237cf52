// Buffer and attribute checks shared by the XLA FFI handlers (CPU, CUDA,
// Ascend).  Every handler validates what XLA hands it before touching
// memory and reports problems as ffi::Error, never by crashing.
#ifndef JAX_AMP_SCALE_FFI_HANDLER_COMMON_H_
#define JAX_AMP_SCALE_FFI_HANDLER_COMMON_H_

#include <cstdint>
#include <string>

#include "update_scale.h"
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

inline bool ToScaleDtype(ffi::DataType dt, ScaleDtype* out) {
  switch (dt) {
    case ffi::DataType::F32: *out = ScaleDtype::kF32; return true;
    case ffi::DataType::F16: *out = ScaleDtype::kF16; return true;
    case ffi::DataType::BF16: *out = ScaleDtype::kBF16; return true;
    default: return false;
  }
}

// The validated view of one call: dtype, element count and attributes.
struct CheckedCall {
  ScaleDtype dtype;
  int64_t count;
};

// Checks the five buffers and three attributes of an update-scale call.
// On success fills `call` and returns an empty string; otherwise the message.
inline std::string CheckCall(const ffi::AnyBuffer& scale,
                             const ffi::AnyBuffer& tracker,
                             const ffi::AnyBuffer& found_inf,
                             const ffi::AnyBuffer& scale_out,
                             const ffi::AnyBuffer& tracker_out,
                             double growth_factor, double backoff_factor,
                             int64_t growth_interval, CheckedCall* call) {
  if (const char* err =
          CheckAttributes(growth_factor, backoff_factor, growth_interval)) {
    return err;
  }
  if (!ToScaleDtype(scale.element_type(), &call->dtype)) {
    return std::string("current_scale must be float32, float16 or bfloat16, got ") +
           DtypeName(scale.element_type());
  }
  if (found_inf.element_type() != scale.element_type()) {
    return std::string("found_inf must have the dtype of current_scale (") +
           DtypeName(scale.element_type()) + "), got " +
           DtypeName(found_inf.element_type());
  }
  if (scale_out.element_type() != scale.element_type()) {
    return "updated_scale must have the dtype of current_scale";
  }
  if (tracker.element_type() != ffi::DataType::S32 ||
      tracker_out.element_type() != ffi::DataType::S32) {
    return std::string("growth_tracker must be int32, got ") +
           DtypeName(tracker.element_type());
  }
  const size_t n = scale.element_count();
  if (tracker.element_count() != n || found_inf.element_count() != n ||
      scale_out.element_count() != n || tracker_out.element_count() != n) {
    return "current_scale, growth_tracker, found_inf and both outputs must "
           "have the same number of elements";
  }
  if (n > 0 && (scale.untyped_data() == nullptr ||
                tracker.untyped_data() == nullptr ||
                found_inf.untyped_data() == nullptr ||
                scale_out.untyped_data() == nullptr ||
                tracker_out.untyped_data() == nullptr)) {
    return "a buffer with elements has a null data pointer";
  }
  call->count = static_cast<int64_t>(n);
  return std::string();
}

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_HANDLER_COMMON_H_
