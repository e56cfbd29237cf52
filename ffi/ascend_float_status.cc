// XLA FFI handlers for the Ascend float status register: clear and read
// (ascend_float_status.h), through the runtime's aclrtResetOverflowStatus
// and aclrtGetOverflowStatus (acl/acl_rt.h; loaded by ascend_loader.cc).
//
// Why the runtime calls and not torch_npu's NPUClearFloatStatusV2 /
// NPUGetFloatStatusV2: those are ACL single operators (op-plugin
// aclops/FloatStatusKernelNpu.cpp), with no aclnn form, while the runtime
// pair is a documented C call on the stream that lists the 910 as supported
// (hiascend runtimeapi aclcppdevg_03_0054).  torch_npu avoids the runtime
// pair in saturation mode for a "high false positive rate" (op-plugin
// opapi/AmpForeachNonFiniteCheckAndUnscaleKernelNpuOpApi.cpp): a false
// positive skips a step that was fine; docs/ascend.md says so.
#include "ascend_float_status.h"

#include <cstdint>
#include <string>

#include "ascend_loader.h"
#include "xla/ffi/api/ffi.h"

namespace jas {
namespace {

// The loaded CANN in `*out` when it has the runtime call (`clear`: the
// reset, else the read).
ffi::Error FlagApi(bool clear, const LoadedCann** out) {
  std::string err;
  const LoadedCann* cann = GetCann(&err);
  if (cann == nullptr) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, err);
  const bool have = clear ? cann->api.reset_overflow_status != nullptr
                          : cann->api.get_overflow_status != nullptr;
  if (!have) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      std::string("jax_amp_scale: the overflow flag needs ") +
                          (clear ? "aclrtResetOverflowStatus" : "aclrtGetOverflowStatus") +
                          ", which " + cann->ascendcl_path + " does not export");
  }
  *out = cann;
  return ffi::Error::Success();
}

std::string RuntimeError(const LoadedCann* cann, const char* fn, cann::aclError e) {
  const char* msg = cann->api.recent_err_msg != nullptr ? cann->api.recent_err_msg() : nullptr;
  return std::string(fn) + " failed with error " + std::to_string(e) + ": " +
         ((msg != nullptr && *msg != '\0') ? msg : "(aclGetRecentErrMsg: no message)");
}

}  // namespace

ffi::Error ClearFloatStatusOnAscend(cann::aclrtStream stream, ffi::RemainingArgs operands,
                                    ffi::Result<ffi::AnyBuffer> out) {
  if (operands.size() == 0) return ffi::Error::InvalidArgument("clear takes x first");
  ffi::ErrorOr<ffi::AnyBuffer> x = operands.get<ffi::AnyBuffer>(0);
  if (x.has_error()) return x.error();
  if (out->untyped_data() != x->untyped_data() || out->size_bytes() != x->size_bytes()) {
    return ffi::Error::InvalidArgument(
        "the float status clear passes x through: its result must alias operand 0");
  }
  const LoadedCann* cann = nullptr;
  ffi::Error loaded = FlagApi(/*clear=*/true, &cann);
  if (loaded.failure()) return loaded;
  const cann::aclError e = cann->api.reset_overflow_status(stream);
  if (e != 0) {
    return ffi::Error(ffi::ErrorCode::kInternal, RuntimeError(cann, "aclrtResetOverflowStatus", e));
  }
  return ffi::Error::Success();
}

ffi::Error ReadFloatStatusOnAscend(cann::aclrtStream stream, ffi::RemainingArgs operands,
                                   ffi::Result<ffi::AnyBuffer> status) {
  if (status->element_type() != ffi::DataType::U8 ||
      status->size_bytes() != cann::kOverflowStatusBytes) {
    return ffi::Error::InvalidArgument("the float status must be uint8[64]");
  }
  const LoadedCann* cann = nullptr;
  ffi::Error loaded = FlagApi(/*clear=*/false, &cann);
  if (loaded.failure()) return loaded;
  const cann::aclError e =
      cann->api.get_overflow_status(status->untyped_data(), cann::kOverflowStatusBytes, stream);
  if (e != 0) {
    return ffi::Error(ffi::ErrorCode::kInternal, RuntimeError(cann, "aclrtGetOverflowStatus", e));
  }
  return ffi::Error::Success();
}

namespace {
using AscendStream = ffi::PlatformStream<cann::aclrtStream>;
}  // namespace

}  // namespace jas

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasFloatStatusClearAscend, jas::ClearFloatStatusOnAscend,
                              (jas::FloatStatusBinding<jas::AscendStream>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JasFloatStatusReadAscend, jas::ReadFloatStatusOnAscend,
                              (jas::FloatStatusBinding<jas::AscendStream>()));
