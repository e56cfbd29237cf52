/* libopapi_math.so / libopapi.so of the CANN test double (CD_LIBNAME says
 * which); built with CD_NO_OP it lacks the operator, to test the search. */
#include <stdint.h>

#include "cann_double.h"

#define EXPORT __attribute__((visibility("default")))

#ifndef CD_NO_OP
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
#else
EXPORT int cd_opapi_without_operator = 1;
#endif
