// Finds and loads the CANN libraries at run time (dlopen), so that neither
// building nor importing jax_amp_scale needs CANN.
//
// Search order:
//   operator (aclnnAmpUpdateScale*): $JAX_AMP_SCALE_CANN_OPAPI when set (a
//     path; nothing else is tried), else libopapi_math.so (recent CANN) then
//     libopapi.so (older CANN), each under $ASCEND_HOME_PATH/lib64,
//     $ASCEND_TOOLKIT_HOME/lib64 and finally the dynamic loader's path;
//   libnnopbase.so (aclCreateTensor, aclDestroyTensor, tensor lists) and
//     libascendcl.so (aclrtMalloc, aclrtFree, aclGetRecentErrMsg): through
//     the operator library's own handle (dlsym reaches the libraries it was
//     linked against, as torch_npu resolves them), else the same directories
//     then the loader's path.  A second copy of either (another one under
//     $ASCEND_HOME_PATH/$ASCEND_TOOLKIT_HOME, or one already loaded in the
//     process) is refused: a mixed installation;
//   fused pass (aclnnForeachNonFiniteCheckAndUnscale*, optional):
//     $JAX_AMP_SCALE_CANN_OPAPI when set, then libopapi_nn.so (recent CANN)
//     and libopapi.so (older), in the directories above; it must use the
//     same libnnopbase.so as the update-scale operator.
#ifndef JAX_AMP_SCALE_FFI_ASCEND_LOADER_H_
#define JAX_AMP_SCALE_FFI_ASCEND_LOADER_H_

#include <string>

#include "cann_abi.h"

namespace jas {

struct LoadedCann {
  cann::CannApi api;
  std::string opapi_path;
  std::string nnopbase_path;
  std::string ascendcl_path;
  std::string opapi_nn_path;  // the fused-pass operator's library, or ""
  std::string foreach_error;  // why the fused pass is unavailable, or ""
  // Learnt at load: aclrtGetSocName() ("" when CANN lacks it or it fails)
  // and the current device's aclrtGetDeviceSatMode(): "saturation",
  // "inf_nan", "undef", or "unknown" (CANN lacks it, or it failed).
  std::string soc;
  std::string overflow_mode;
};

// The loaded table, loading it on first use.  Returns nullptr and sets
// `error` (every path tried and why it failed) when a library or symbol is
// missing; a failure is not cached, so fixing the environment is enough.
// Thread-safe.  The returned table lives until the process ends.
const LoadedCann* GetCann(std::string* error);

#ifdef JAS_TESTING_BUILD
// Tests only (compiled into the test extension _ascend_testing alone, never
// into the shipped _native_ascend): forget the loaded table so the next
// GetCann searches again (e.g. after changing the environment).  Libraries
// stay open and tables stay valid: a handler running concurrently keeps
// working.
void ForgetCannForTests();
#endif

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_ASCEND_LOADER_H_
