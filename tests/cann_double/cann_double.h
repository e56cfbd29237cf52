/* Internal interface of the CANN test double: the core library
 * (libcann_double.so) holds all state; the libraries with CANN's sonames
 * (libascendcl.so, libnnopbase.so, libopapi_math.so, libopapi.so) forward
 * CANN's C ABI to it.  Host memory stands in for device memory. */
#ifndef CANN_DOUBLE_H_
#define CANN_DOUBLE_H_
#include <stddef.h>
#include <stdint.h>

typedef struct cd_tensor cd_tensor;
typedef struct cd_executor cd_executor;
typedef struct cd_tensor_list cd_tensor_list;

cd_tensor* cd_create_tensor(const int64_t* view_dims, uint64_t view_dims_num, int32_t dtype,
                            const int64_t* stride, int64_t offset, int32_t format,
                            const int64_t* storage_dims, uint64_t storage_dims_num, void* data);
int32_t cd_destroy_tensor(const cd_tensor* t);
int32_t cd_destroy_executor(cd_executor* e);
int32_t cd_get_workspace_size(const char* lib, const cd_tensor* scale, const cd_tensor* tracker,
                              const cd_tensor* found, double gf, double bf, int64_t gi,
                              const cd_tensor* scale_out, const cd_tensor* tracker_out,
                              uint64_t* ws_size, cd_executor** executor);
int32_t cd_launch(const char* lib, void* ws, uint64_t ws_size, cd_executor* e, void* stream);
cd_tensor_list* cd_create_tensor_list(cd_tensor* const* value, uint64_t size);
int32_t cd_destroy_tensor_list(const cd_tensor_list* l);
int32_t cd_foreach_get_workspace_size(const char* lib, const cd_tensor_list* l,
                                      const cd_tensor* found, const cd_tensor* inv,
                                      uint64_t* ws_size, cd_executor** executor);
int cd_huge_mem(int what, void* arg, int sync); /* 0 init, 1 uninit, 2 release */
int cd_malloc(void** ptr, size_t size, int32_t policy);
int cd_free(void* ptr);
const char* cd_recent_err_msg(void);
const char* cd_get_soc_name(void);
int cd_get_sat_mode(int32_t* mode);
int cd_set_device(int32_t device);
int cd_get_overflow_status(void* out, size_t size, void* stream);
int cd_reset_overflow_status(void* stream);

#endif
