// The part of the CANN C ABI that the Ascend handler relies on, declared
// here from the documented headers (acl/acl_base.h, acl/acl_rt.h,
// acl/acl_base_rt.h,
// aclnn/acl_meta.h, aclnnop/aclnn_amp_update_scale.h) so that building and
// importing jax_amp_scale needs no CANN installation: the libraries are
// dlopen'ed at run time (ascend_loader.cc) and called through CannApi.
#ifndef JAX_AMP_SCALE_FFI_CANN_ABI_H_
#define JAX_AMP_SCALE_FFI_CANN_ABI_H_

#include <cstddef>
#include <cstdint>

namespace jas {
namespace cann {

// Opaque handles; only ever used through pointers.
struct aclTensor;
struct aclTensorList;
struct aclOpExecutor;
using aclrtStream = void*;
using aclnnStatus = int32_t;  // 0 = success
using aclError = int;         // ACL_SUCCESS = 0

// aclDataType values used here (acl/acl_base.h).
enum aclDataType : int32_t {
  ACL_FLOAT = 0,
  ACL_FLOAT16 = 1,
  ACL_INT32 = 3,
  ACL_BF16 = 27,
};

// aclFormat: the operator takes ND tensors.
enum aclFormat : int32_t { ACL_FORMAT_ND = 2 };

// aclrtMemMallocPolicy: huge pages first, as torch_npu allocates workspaces.
enum aclrtMemMallocPolicy : int32_t { ACL_MEM_MALLOC_HUGE_FIRST = 0 };

// aclnn status codes (aclnn/aclnn_base.h).
constexpr aclnnStatus kAclnnSuccess = 0;
constexpr aclnnStatus kAclnnErrParamNullptr = 161001;
constexpr aclnnStatus kAclnnErrParamInvalid = 161002;
constexpr aclnnStatus kAclnnErrRuntimeError = 361001;
constexpr aclnnStatus kAclnnErrInnerBase = 561000;
constexpr aclnnStatus kAclnnErrInnerTiling = 561002;

// The name of an aclnn status for error messages.
inline const char* StatusName(aclnnStatus s) {
  switch (s) {
    case kAclnnSuccess: return "ACLNN_SUCCESS";
    case kAclnnErrParamNullptr: return "ACLNN_ERR_PARAM_NULLPTR";
    case kAclnnErrParamInvalid: return "ACLNN_ERR_PARAM_INVALID";
    case kAclnnErrRuntimeError: return "ACLNN_ERR_RUNTIME_ERROR";
    case kAclnnErrInnerTiling: return "ACLNN_ERR_INNER_TILING_ERROR";
    default: break;
  }
  if (s >= kAclnnErrInnerBase && s < kAclnnErrInnerBase + 1000) {
    return "ACLNN_ERR_INNER (inner error)";
  }
  return "unknown aclnn status";
}

// Function types, as in the CANN headers.
using aclCreateTensorFn = aclTensor* (*)(const int64_t* view_dims,
                                         uint64_t view_dims_num,
                                         aclDataType data_type,
                                         const int64_t* stride, int64_t offset,
                                         aclFormat format,
                                         const int64_t* storage_dims,
                                         uint64_t storage_dims_num,
                                         void* tensor_data);
using aclDestroyTensorFn = aclnnStatus (*)(const aclTensor* tensor);
// aclnn/acl_meta.h (libnnopbase.so): a list owns its tensors; destroying
// the list destroys them.
using aclCreateTensorListFn = aclTensorList* (*)(const aclTensor* const* value,
                                                 uint64_t size);
using aclDestroyTensorListFn = aclnnStatus (*)(const aclTensorList* array);
// aclnnop/aclnn_foreach_non_finite_check_and_unscale.h (libopapi_nn.so in
// recent CANN, libopapi.so in older).
using ForeachGetWorkspaceSizeFn = aclnnStatus (*)(const aclTensorList* scaled_grads,
                                                  const aclTensor* found_inf,
                                                  const aclTensor* inv_scale,
                                                  uint64_t* workspace_size,
                                                  aclOpExecutor** executor);
using GetWorkspaceSizeFn = aclnnStatus (*)(
    const aclTensor* current_scale, const aclTensor* growth_tracker,
    const aclTensor* found_inf, double growth_factor, double backoff_factor,
    int64_t growth_interval, const aclTensor* updated_scale_out,
    const aclTensor* updated_growth_tracker_out, uint64_t* workspace_size,
    aclOpExecutor** executor);
using LaunchFn = aclnnStatus (*)(void* workspace, uint64_t workspace_size,
                                 aclOpExecutor* executor, aclrtStream stream);
using aclrtMallocFn = aclError (*)(void** dev_ptr, size_t size,
                                   aclrtMemMallocPolicy policy);
using aclrtFreeFn = aclError (*)(void* dev_ptr);
using aclGetRecentErrMsgFn = const char* (*)();

// The device and its overflow mode (acl/acl_rt.h;
// hicann/runtime/docs/03_api_ref/25-02_Enumerations.md and 04_Device管理.md):
// the SoC name (NULL on failure) and the current device's float overflow mode.  In
// SATURATION mode a float16 overflow stores +-65504 and NaN stores 0, so a
// check by value never fires; the hardware flags the overflow instead.
enum aclrtFloatOverflowMode : int32_t {
  ACL_RT_OVERFLOW_MODE_SATURATION = 0,
  ACL_RT_OVERFLOW_MODE_INFNAN = 1,
  ACL_RT_OVERFLOW_MODE_UNDEF = 2,
};
using aclrtGetSocNameFn = const char* (*)();
using aclrtGetDeviceSatModeFn = aclError (*)(aclrtFloatOverflowMode* mode);
// The overflow flag through the runtime (acl/acl_rt.h; hiascend
// canncommercial runtimeapi aclcppdevg_03_0054): both are asynchronous on
// `stream`; Get writes the device's status (64 bytes) to device memory,
// Reset clears it.  They cover every stream of the current device.
using aclrtGetOverflowStatusFn = aclError (*)(void* output_addr, size_t output_size,
                                              aclrtStream stream);
using aclrtResetOverflowStatusFn = aclError (*)(aclrtStream stream);
// The size aclrtGetOverflowStatus writes (the runtime page above).
constexpr size_t kOverflowStatusBytes = 64;

// Optional: CANN's per-thread "huge memory" bracket, which torch_npu's
// EXEC_NPU_CMD calls around every aclnn call (Ascend/op-plugin
// op_plugin/utils/op_api_common.h:136-140 types, :343-409 use): Init before
// the descriptors and GetWorkspaceSize, Release after a successful launch,
// UnInit at the end, each with (nullptr, false).
using InitHugeMemThreadLocalFn = int (*)(void*, bool);
using UnInitHugeMemThreadLocalFn = void (*)(void*, bool);
using ReleaseHugeMemFn = void (*)(void*, bool);

// The loaded function table.  Everything but the huge-memory bracket and the
// fused-pass entries (foreach_*, tensor lists: empty when the installation
// lacks the operator, see foreach_error) is required.
struct CannApi {
  InitHugeMemThreadLocalFn init_huge_mem = nullptr;      // optional
  UnInitHugeMemThreadLocalFn uninit_huge_mem = nullptr;  // optional
  ReleaseHugeMemFn release_huge_mem = nullptr;           // optional
  aclCreateTensorListFn create_tensor_list = nullptr;
  aclDestroyTensorListFn destroy_tensor_list = nullptr;
  ForeachGetWorkspaceSizeFn foreach_get_workspace_size = nullptr;
  LaunchFn foreach_launch = nullptr;
  aclCreateTensorFn create_tensor = nullptr;
  aclDestroyTensorFn destroy_tensor = nullptr;
  GetWorkspaceSizeFn get_workspace_size = nullptr;
  LaunchFn launch = nullptr;
  aclrtMallocFn rt_malloc = nullptr;
  aclrtFreeFn rt_free = nullptr;
  aclGetRecentErrMsgFn recent_err_msg = nullptr;
  // Optional (libascendcl.so; older CANN may lack them): the device and the
  // overflow flag.
  aclrtGetSocNameFn get_soc_name = nullptr;
  aclrtGetDeviceSatModeFn get_sat_mode = nullptr;
  aclrtGetOverflowStatusFn get_overflow_status = nullptr;
  aclrtResetOverflowStatusFn reset_overflow_status = nullptr;
};

}  // namespace cann
}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_CANN_ABI_H_
