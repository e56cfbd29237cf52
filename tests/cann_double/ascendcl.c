/* libascendcl.so of the CANN test double: runtime memory and messages. */
#include <stddef.h>
#include <stdint.h>

#include "cann_double.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT int aclrtMalloc(void** dev_ptr, size_t size, int32_t policy) {
  return cd_malloc(dev_ptr, size, policy);
}
EXPORT int aclrtFree(void* dev_ptr) { return cd_free(dev_ptr); }
EXPORT const char* aclGetRecentErrMsg(void) { return cd_recent_err_msg(); }
