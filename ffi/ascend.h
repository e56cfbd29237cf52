// The Ascend update-scale handler's platform part, for the handlers that
// bind it: JasUpdateScaleAscend (ffi/ascend.cc, the device stream) and the
// CPU test binding built only for the tests
// (tests/native/ascend_testing_module.cc, a null stream against the CANN
// test double).  Both reach it through handler_common.h's UpdateScaleFfi, so
// the tests run the production checks and dispatch.
#ifndef JAX_AMP_SCALE_FFI_ASCEND_H_
#define JAX_AMP_SCALE_FFI_ASCEND_H_

#include <cstdint>

#include "cann_abi.h"
#include "handler_common.h"
#include "update_scale.h"

namespace jas {

// Loads CANN (ascend_loader.h) and dispatches the checked, non-empty `call`
// to aclnnAmpUpdateScale on `stream` (ascend_dispatch.h), with the process's
// workspace cache.  FailedPrecondition when CANN cannot be loaded, Internal
// when an ACL/aclnn call fails.
ffi::Error UpdateScaleOnAscend(cann::aclrtStream stream, int64_t device,
                               const UpdateScaleCall& call);

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_ASCEND_H_
