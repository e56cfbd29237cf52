/* libnnopbase.so of the CANN test double: tensor descriptors, executors. */
#include <stdbool.h>
#include <stdint.h>

#include "cann_double.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT void* aclCreateTensor(const int64_t* view_dims, uint64_t view_dims_num, int32_t dtype,
                             const int64_t* stride, int64_t offset, int32_t format,
                             const int64_t* storage_dims, uint64_t storage_dims_num,
                             void* data) {
  return cd_create_tensor(view_dims, view_dims_num, dtype, stride, offset, format, storage_dims,
                          storage_dims_num, data);
}
EXPORT int32_t aclDestroyTensor(const void* t) { return cd_destroy_tensor(t); }
EXPORT int32_t aclDestroyAclOpExecutor(void* e) { return cd_destroy_executor(e); }
EXPORT void* aclCreateTensorList(void* const* value, uint64_t size) {
  return cd_create_tensor_list((cd_tensor* const*)value, size);
}
EXPORT int32_t aclDestroyTensorList(const void* l) { return cd_destroy_tensor_list(l); }
/* The per-thread huge-memory bracket torch_npu calls around aclnn calls. */
EXPORT int InitHugeMemThreadLocal(void* arg, bool sync) { return cd_huge_mem(0, arg, sync); }
EXPORT void UnInitHugeMemThreadLocal(void* arg, bool sync) { cd_huge_mem(1, arg, sync); }
EXPORT void ReleaseHugeMem(void* arg, bool sync) { cd_huge_mem(2, arg, sync); }
