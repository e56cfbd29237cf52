// The Ascend update-scale handler's platform part, for the handlers that
// bind it: JasUpdateScaleAscend (ffi/ascend.cc, the device stream) and the
// CPU test binding built only for the tests
// (tests/native/ascend_testing_module.cc, a null stream against the CANN
// test double).  Both reach it through update_scale_ffi.h's UpdateScaleFfi, so
// the tests run the production checks and dispatch.
#ifndef JAX_AMP_SCALE_FFI_ASCEND_H_
#define JAX_AMP_SCALE_FFI_ASCEND_H_

#include <cstdint>
#include <utility>

#include "cann_abi.h"
#include "update_scale_ffi.h"

namespace jas {

// Loads CANN (ascend_loader.h) and dispatches the checked, non-empty `call`
// to aclnnAmpUpdateScale on `stream` (ascend_dispatch.h), with the process's
// workspace cache.  FailedPrecondition when CANN cannot be loaded, Internal
// when an ACL/aclnn call fails.
ffi::Error UpdateScaleOnAscend(cann::aclrtStream stream, int64_t device,
                               const UpdateScaleCall& call);

// The fused gradient pass on Ascend (aclnnForeachNonFiniteCheckAndUnscale):
// checks the buffers, then dispatches (ascend_dispatch.h).  Operands:
// inv_scale (float32 [1]), found_init (float32 [1], 0: the kernel only sets
// it), the leaves (float32/float16/bfloat16; the lowering keeps float64 and
// empty leaves out); results: found (float32 [1], aliases found_init), then
// one unscaled leaf per leaf (aliases it: in place).
ffi::Error UnscaleAndCheckOnAscend(cann::aclrtStream stream, int64_t device,
                                   ffi::AnyBuffer inv_scale, ffi::AnyBuffer found_init,
                                   ffi::RemainingArgs leaves, ffi::Result<ffi::AnyBuffer> found,
                                   ffi::RemainingRets outs);

// The binding of UnscaleAndCheckOnAscend after the platform's contexts.
template <typename... Ctx>
auto UnscaleAndCheckAscendBinding() {
  auto operands = [](auto&& b) {
    return std::move(b)
        .template Arg<ffi::AnyBuffer>()  // inv_scale
        .template Arg<ffi::AnyBuffer>()  // found_init
        .RemainingArgs()                 // gradient leaves
        .template Ret<ffi::AnyBuffer>()  // found (aliases found_init)
        .RemainingRets();                // unscaled leaves (alias the leaves)
  };
  return operands(internal::WithContexts<Ctx...>(ffi::Ffi::Bind()));
}

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_ASCEND_H_
