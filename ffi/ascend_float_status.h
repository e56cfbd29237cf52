// The Ascend float status register (the hardware's overflow flag), for a
// device in saturation mode, where a float16 overflow stores +-65504 and NaN
// stores 0 so that no check by value can see it (hiascend Pytorch/600
// Envvariables Envir_004).  Two custom calls, each ordered by data alone
// (XLA orders nothing else):
//
//   clear: (x, order...) -> x (aliased).  Resets the current device's flag
//          on the stream (aclrtResetOverflowStatus), then hands x on: what
//          consumes x runs after the reset, what x depends on before it.
//   read:  (order...) -> status (uint8[64]).  aclrtGetOverflowStatus into
//          the result, on the stream: nonzero means an overflow since the
//          last reset.  The operands only order it after what made them.
//
// Both are bound by JasFloatStatus{Clear,Read}Ascend (ffi/
// ascend_float_status.cc, the device stream) and by the CPU test bindings
// (tests/native/ascend_testing_module.cc, a null stream, the CANN double).
#ifndef JAX_AMP_SCALE_FFI_ASCEND_FLOAT_STATUS_H_
#define JAX_AMP_SCALE_FFI_ASCEND_FLOAT_STATUS_H_

#include <utility>

#include "cann_abi.h"
#include "handler_common.h"

namespace jas {

ffi::Error ClearFloatStatusOnAscend(cann::aclrtStream stream, ffi::RemainingArgs operands,
                                    ffi::Result<ffi::AnyBuffer> out);

ffi::Error ReadFloatStatusOnAscend(cann::aclrtStream stream, ffi::RemainingArgs operands,
                                   ffi::Result<ffi::AnyBuffer> status);

// The binding of either call after the platform's contexts.
template <typename... Ctx>
auto FloatStatusBinding() {
  return internal::WithContexts<Ctx...>(ffi::Ffi::Bind())
      .RemainingArgs()                  // x and the operands that order the call
      .template Ret<ffi::AnyBuffer>();  // x (clear) or the status (read)
}

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_ASCEND_FLOAT_STATUS_H_
