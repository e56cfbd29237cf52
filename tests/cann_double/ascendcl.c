/* libascendcl.so of the CANN test double: runtime memory and messages, the
 * device (SoC name, overflow mode, current device) and its float status. */
#include <stddef.h>
#include <stdint.h>

#include "cann_double.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT int aclrtMalloc(void** dev_ptr, size_t size, int32_t policy) {
  return cd_malloc(dev_ptr, size, policy);
}
EXPORT int aclrtFree(void* dev_ptr) { return cd_free(dev_ptr); }
EXPORT const char* aclGetRecentErrMsg(void) { return cd_recent_err_msg(); }
EXPORT const char* aclrtGetSocName(void) { return cd_get_soc_name(); }
EXPORT int aclrtGetDeviceSatMode(int32_t* mode) { return cd_get_sat_mode(mode); }
EXPORT int aclrtSetDevice(int32_t device) { return cd_set_device(device); }
EXPORT int aclrtGetOverflowStatus(void* out, size_t size, void* stream) {
  return cd_get_overflow_status(out, size, stream);
}
EXPORT int aclrtResetOverflowStatus(void* stream) { return cd_reset_overflow_status(stream); }
