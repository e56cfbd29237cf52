/* The operator libraries of the CANN test double: libopapi_math.so
 * (aclnnAmpUpdateScale), libopapi_nn.so (aclnnForeachNonFiniteCheckAndUnscale)
 * and libopapi.so (older CANN: both).  CD_LIBNAME names the file; CD_MATH and
 * CD_NN select the operators; with neither it exports no operator (to test
 * the search). */
#include <stdint.h>

#include "cann_double.h"

#define EXPORT __attribute__((visibility("default")))

#ifdef CD_MATH
EXPORT int32_t aclnnAmpUpdateScaleGetWorkspaceSize(const void* scale, const void* tracker,
                                                   const void* found, double gf, double bf,
                                                   int64_t gi, const void* scale_out,
                                                   const void* tracker_out, uint64_t* ws_size,
                                                   void** executor) {
  return cd_get_workspace_size(CD_LIBNAME, scale, tracker, found, gf, bf, gi, scale_out,
                               tracker_out, ws_size, (cd_executor**)executor);
}
EXPORT int32_t aclnnAmpUpdateScale(void* ws, uint64_t ws_size, void* executor, void* stream) {
  return cd_launch(CD_LIBNAME, ws, ws_size, executor, stream);
}
#endif
#ifdef CD_NN
EXPORT int32_t aclnnForeachNonFiniteCheckAndUnscaleGetWorkspaceSize(const void* grads,
                                                                    const void* found,
                                                                    const void* inv,
                                                                    uint64_t* ws_size,
                                                                    void** executor) {
  return cd_foreach_get_workspace_size(CD_LIBNAME, grads, found, inv, ws_size,
                                       (cd_executor**)executor);
}
EXPORT int32_t aclnnForeachNonFiniteCheckAndUnscale(void* ws, uint64_t ws_size, void* executor,
                                                    void* stream) {
  return cd_launch(CD_LIBNAME, ws, ws_size, executor, stream);
}
#endif
#if !defined(CD_MATH) && !defined(CD_NN)
EXPORT int cd_opapi_without_operator = 1;
#endif
