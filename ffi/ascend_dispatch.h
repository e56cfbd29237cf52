// The Ascend dispatch to aclnnAmpUpdateScale, written once against a loaded
// CANN function table.  The production XLA handler (bound to the device
// stream) and the CPU test handler (null stream, CANN test double) both call
// DispatchUpdateScale, so the tests exercise exactly the production code.
#ifndef JAX_AMP_SCALE_FFI_ASCEND_DISPATCH_H_
#define JAX_AMP_SCALE_FFI_ASCEND_DISPATCH_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cann_abi.h"
#include "update_scale.h"

namespace jas {

// Workspaces for the operator, cached per (device, stream).
//
// A kernel launched on a stream may still read its workspace after the
// launch returns.  Kernels on one stream run in order, so the next launch on
// the same stream may reuse the same buffer without a synchronisation; a
// different stream on the same device gets its own buffer.  When a call
// needs more than the cached buffer, a bigger one is allocated and the old
// one is retired, not freed (an earlier kernel may still use it); retired
// buffers are freed only by ReleaseAll.  Growth at least doubles, so the
// retired memory stays below the current buffer's size.
class WorkspaceCache {
 public:
  // Sets `*ptr` to a workspace of at least `size` bytes (nullptr when size
  // is 0).  Returns an empty string or the error.
  std::string Get(const cann::CannApi& api, int64_t device, void* stream,
                  uint64_t size, void** ptr);

  // Frees every cached and retired buffer.  Only safe when no launched
  // kernel can still be running (tests; teardown after a synchronisation).
  std::string ReleaseAll();

  struct Entry {
    int64_t device;
    void* stream;
    uint64_t size;
  };
  std::vector<Entry> Current();
  size_t RetiredCount();

 private:
  struct Buffer {
    void* ptr = nullptr;
    uint64_t size = 0;
    cann::aclrtFreeFn free_fn = nullptr;
  };
  std::mutex mu_;
  std::map<std::pair<int64_t, void*>, Buffer> current_;
  std::vector<Buffer> retired_;
};

WorkspaceCache& GlobalWorkspaceCache();

// One update-scale call (UpdateScaleCall, ffi/update_scale.h) on `count`
// independent states, in place.
//
// Buffers are device memory for the production handler (host memory for the
// test double).  `scale_out` must equal `scale` and `tracker_out` must equal
// `tracker` (XLA aliases them, as torch_npu calls the operator in place).
// The operator takes shape-[1] tensors, so a vmapped batch (count > 1) is
// dispatched as one operator call per element, each on its own descriptors.
// The operator computes CANN's published kernel (Rule::kCann without the
// library's guard, which the lowering applies after the call); a Rule::kTorch
// call is refused unless both factors are powers of two exact in float32
// (then the kernel's bits are torch's).
// Returns an empty string or the error (with aclnn status, its name and
// aclGetRecentErrMsg()).
std::string DispatchUpdateScale(const cann::CannApi& api, WorkspaceCache& cache,
                                int64_t device, cann::aclrtStream stream,
                                const UpdateScaleCall& call);

// One gradient leaf of the fused pass: float32/float16/bfloat16 device
// memory, unscaled in place.
struct UnscaleLeaf {
  ScaleDtype dtype;
  void* data;
  int64_t count;
};

// aclnnForeachNonFiniteCheckAndUnscale takes at most this many tensors
// (hicann/ops-nn foreach/foreach_non_finite_check_and_unscale/op_host/
// foreach_non_finite_check_and_unscale_tiling.h:30, checked at
// foreach_non_finite_check_and_unscale_tiling.cpp:88-91).
constexpr size_t kMaxTensorsPerLaunch = 256;

// The fused gradient pass on `leaves`, in place: one operator launch per
// dtype and per kMaxTensorsPerLaunch leaves (empty leaves are skipped; the
// tiling refuses them), each on its own tensor list, destroyed exactly once.
// `found` (float32 [1], device) must hold 0 before the call: the kernel only
// ever sets it to 1.0, so launches OR into it.  `inv_scale` is float32 [1].
// Returns an empty string or the error (status, name, CANN's message).
std::string DispatchUnscaleAndCheck(const cann::CannApi& api, WorkspaceCache& cache,
                                    int64_t device, cann::aclrtStream stream, void* inv_scale,
                                    void* found, const std::vector<UnscaleLeaf>& leaves);

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_ASCEND_DISPATCH_H_
