#include "ascend_dispatch.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace jas {
namespace {

using cann::aclTensor;

cann::aclDataType AclScaleType(ScaleDtype dt) {
  switch (dt) {
    case ScaleDtype::kF32: return cann::ACL_FLOAT;
    case ScaleDtype::kF16: return cann::ACL_FLOAT16;
    case ScaleDtype::kBF16: return cann::ACL_BF16;
  }
  return cann::ACL_FLOAT;
}

int64_t ScaleItemSize(ScaleDtype dt) { return dt == ScaleDtype::kF32 ? 4 : 2; }

std::string RecentMessage(const cann::CannApi& api) {
  const char* msg = api.recent_err_msg != nullptr ? api.recent_err_msg() : nullptr;
  return (msg != nullptr && *msg != '\0') ? msg : "(aclGetRecentErrMsg: no message)";
}

std::string AclnnError(const cann::CannApi& api, const char* fn, cann::aclnnStatus s) {
  return std::string(fn) + " failed with status " + std::to_string(s) + " (" +
         cann::StatusName(s) + "): " + RecentMessage(api);
}

// The five descriptors of one call; destroyed on every path.
class Descriptors {
 public:
  explicit Descriptors(const cann::CannApi& api) : api_(api) {}
  ~Descriptors() {
    // The executor keeps what it needs: torch_npu also destroys the
    // descriptors right after the launch.  A failed destroy cannot be acted
    // on here, so its status is not reported.
    for (aclTensor* t : tensors_) {
      if (t != nullptr) api_.destroy_tensor(t);
    }
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

  // A contiguous ND tensor of shape [1] over `data`.
  aclTensor* Make(int i, cann::aclDataType dtype, void* data) {
    static constexpr int64_t kShape[1] = {1};
    static constexpr int64_t kStride[1] = {1};
    tensors_[i] = api_.create_tensor(kShape, 1, dtype, kStride, 0,
                                     cann::ACL_FORMAT_ND, kShape, 1, data);
    return tensors_[i];
  }

 private:
  const cann::CannApi& api_;
  std::array<aclTensor*, 5> tensors_{};
};

// CANN's per-thread huge-memory bracket around one aclnn call, as torch_npu's
// EXEC_NPU_CMD_V1 (Ascend/op-plugin op_plugin/utils/op_api_common.h:370-408):
// Init before the descriptors, UnInit when the call is over (every path).
class HugeMemScope {
 public:
  explicit HugeMemScope(const cann::CannApi& api) : api_(api) {
    if (api_.init_huge_mem != nullptr) api_.init_huge_mem(nullptr, false);
  }
  ~HugeMemScope() {
    if (api_.uninit_huge_mem != nullptr) api_.uninit_huge_mem(nullptr, false);
  }
  HugeMemScope(const HugeMemScope&) = delete;
  HugeMemScope& operator=(const HugeMemScope&) = delete;

 private:
  const cann::CannApi& api_;
};

// The second phase: a workspace from the cache, then the launch, which
// consumes the executor.  When no workspace can be had the executor is not
// launched and not destroyed: aclDestroyAclOpExecutor is documented for
// executors made repeatable only, and torch_npu's EXEC_NPU_CMD also leaves an
// executor it cannot launch to CANN (a rare out-of-memory path).
std::string Launch(const cann::CannApi& api, WorkspaceCache& cache, int64_t device,
                   cann::aclrtStream stream, const char* name, cann::LaunchFn launch,
                   uint64_t ws_size, cann::aclOpExecutor* executor) {
  void* ws = nullptr;
  std::string err = cache.Get(api, device, stream, ws_size, &ws);
  if (!err.empty()) return std::string(name) + ": " + err;
  const cann::aclnnStatus s = launch(ws, ws_size, executor, stream);
  if (s != cann::kAclnnSuccess) return AclnnError(api, name, s);
  // op_api_common.h:396-399: ReleaseHugeMem after a successful launch.
  if (api.release_huge_mem != nullptr) api.release_huge_mem(nullptr, false);
  return std::string();
}

std::string DispatchOne(const cann::CannApi& api, WorkspaceCache& cache,
                        int64_t device, cann::aclrtStream stream,
                        const UpdateScaleCall& c, int64_t i) {
  const int64_t item = ScaleItemSize(c.dtype);
  auto* scale = static_cast<char*>(c.scale) + i * item;
  auto* found = const_cast<char*>(static_cast<const char*>(c.found_inf)) + i * item;
  auto* scale_out = static_cast<char*>(c.scale_out) + i * item;
  int32_t* tracker = c.tracker + i;
  int32_t* tracker_out = c.tracker_out + i;
  const cann::aclDataType st = AclScaleType(c.dtype);

  static const char* const kNames[5] = {"currentScale", "growthTracker", "foundInf",
                                        "updatedScale", "updatedGrowthTracker"};
  HugeMemScope huge_mem(api);  // outlives the descriptors
  Descriptors d(api);
  aclTensor* t[5] = {d.Make(0, st, scale), d.Make(1, cann::ACL_INT32, tracker),
                     d.Make(2, st, found), d.Make(3, st, scale_out),
                     d.Make(4, cann::ACL_INT32, tracker_out)};
  for (int k = 0; k < 5; ++k) {
    if (t[k] == nullptr) {
      return std::string("aclCreateTensor failed for ") + kNames[k] + ": " +
             RecentMessage(api);
    }
  }

  uint64_t ws_size = 0;
  cann::aclOpExecutor* executor = nullptr;
  cann::aclnnStatus s = api.get_workspace_size(t[0], t[1], t[2], c.growth_factor,
                                               c.backoff_factor, c.growth_interval,
                                               t[3], t[4], &ws_size, &executor);
  if (s != cann::kAclnnSuccess) return AclnnError(api, "aclnnAmpUpdateScaleGetWorkspaceSize", s);
  return Launch(api, cache, device, stream, "aclnnAmpUpdateScale", api.launch, ws_size,
                executor);
}

// One launch of the fused pass over `n` (1..kMaxTensorsPerLaunch) leaves of
// one dtype: a tensor list of 1-D contiguous tensors over the leaves (in
// place), foundInf and invScale as float32 [1] tensors.  The list owns its
// tensors once made: aclDestroyTensorList destroys them, exactly once.
std::string LaunchForeach(const cann::CannApi& api, WorkspaceCache& cache, int64_t device,
                          cann::aclrtStream stream, const UnscaleLeaf* leaves, size_t n,
                          void* found, void* inv_scale) {
  HugeMemScope huge_mem(api);  // outlives the descriptors and the list
  std::vector<aclTensor*> tensors(n, nullptr);
  auto destroy_tensors = [&]() {
    for (aclTensor* t : tensors) {
      if (t != nullptr) api.destroy_tensor(t);
    }
  };
  for (size_t k = 0; k < n; ++k) {
    const int64_t dims[1] = {leaves[k].count};
    static constexpr int64_t kStride[1] = {1};
    tensors[k] = api.create_tensor(dims, 1, AclScaleType(leaves[k].dtype), kStride, 0,
                                   cann::ACL_FORMAT_ND, dims, 1, leaves[k].data);
    if (tensors[k] == nullptr) {
      destroy_tensors();
      return "aclCreateTensor failed for scaledGrads[" + std::to_string(k) +
             "]: " + RecentMessage(api);
    }
  }
  cann::aclTensorList* list = api.create_tensor_list(tensors.data(), n);
  if (list == nullptr) {
    destroy_tensors();  // not owned by a list
    return "aclCreateTensorList failed for " + std::to_string(n) +
           " scaledGrads: " + RecentMessage(api);
  }
  // From here the list owns the tensors.
  struct ListGuard {
    const cann::CannApi& api;
    cann::aclTensorList* list;
    ~ListGuard() { api.destroy_tensor_list(list); }
  } list_guard{api, list};
  Descriptors d(api);
  aclTensor* found_t = d.Make(0, cann::ACL_FLOAT, found);
  aclTensor* inv_t = d.Make(1, cann::ACL_FLOAT, inv_scale);
  if (found_t == nullptr || inv_t == nullptr) {
    return std::string("aclCreateTensor failed for ") + (found_t == nullptr ? "foundInf" : "invScale") +
           ": " + RecentMessage(api);
  }
  uint64_t ws_size = 0;
  cann::aclOpExecutor* executor = nullptr;
  const cann::aclnnStatus s =
      api.foreach_get_workspace_size(list, found_t, inv_t, &ws_size, &executor);
  if (s != cann::kAclnnSuccess) {
    return AclnnError(api, "aclnnForeachNonFiniteCheckAndUnscaleGetWorkspaceSize", s);
  }
  return Launch(api, cache, device, stream, "aclnnForeachNonFiniteCheckAndUnscale",
                api.foreach_launch, ws_size, executor);
}

}  // namespace

std::string WorkspaceCache::Get(const cann::CannApi& api, int64_t device, void* stream,
                                uint64_t size, void** ptr) {
  *ptr = nullptr;
  if (size == 0) return std::string();
  std::lock_guard<std::mutex> lock(mu_);
  Buffer& cur = current_[{device, stream}];
  if (cur.ptr != nullptr && cur.size >= size) {
    *ptr = cur.ptr;
    return std::string();
  }
  uint64_t want = size;
  if (cur.size > 0 && want < 2 * cur.size) want = 2 * cur.size;
  void* fresh = nullptr;
  const cann::aclError e = api.rt_malloc(&fresh, static_cast<size_t>(want),
                                         cann::ACL_MEM_MALLOC_HUGE_FIRST);
  if (e != 0 || fresh == nullptr) {
    return "aclrtMalloc of a " + std::to_string(want) +
           "-byte workspace failed with error " +
           std::to_string(e) + ": " + RecentMessage(api);
  }
  if (cur.ptr != nullptr) retired_.push_back(cur);
  cur = Buffer{fresh, want, api.rt_free};
  *ptr = fresh;
  return std::string();
}

std::string WorkspaceCache::ReleaseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string err;
  auto release = [&err](const Buffer& b) {
    if (b.ptr != nullptr && b.free_fn(b.ptr) != 0) err = "aclrtFree failed";
  };
  for (const auto& kv : current_) release(kv.second);
  for (const Buffer& b : retired_) release(b);
  current_.clear();
  retired_.clear();
  return err;
}

std::vector<WorkspaceCache::Entry> WorkspaceCache::Current() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> out;
  for (const auto& kv : current_) {
    if (kv.second.ptr != nullptr) out.push_back({kv.first.first, kv.first.second, kv.second.size});
  }
  return out;
}

size_t WorkspaceCache::RetiredCount() {
  std::lock_guard<std::mutex> lock(mu_);
  return retired_.size();
}

WorkspaceCache& GlobalWorkspaceCache() {
  // Never destroyed: freeing device memory after the runtime shut down at
  // exit would be an error; the process exit releases it.
  static auto* cache = new WorkspaceCache();
  return *cache;
}

std::string DispatchUpdateScale(const cann::CannApi& api, WorkspaceCache& cache,
                                int64_t device, cann::aclrtStream stream,
                                const UpdateScaleCall& call) {
  // aclnnAmpUpdateScale computes CANN's rule (cann_rule.h, Rule::kCann
  // without the guard, which the lowering adds after the call:
  // jax_amp_scale/operators/update_scale.py).  Under Rule::kTorch that is
  // torch's rule only when both factors are powers of two exact in float32;
  // operators/update_scale.py plans the reference for any other torch state.
  if (call.rule == Rule::kTorch && !(IsExactInFloat32PowerOfTwo(call.growth_factor) &&
                                     IsExactInFloat32PowerOfTwo(call.backoff_factor))) {
    return "rule 'torch' with growth_factor=" + std::to_string(call.growth_factor) +
           " and backoff_factor=" + std::to_string(call.backoff_factor) +
           " cannot run on aclnnAmpUpdateScale bit-exactly (it multiplies in "
           "float32; torch's rule is exact there only for power-of-two factors): "
           "use backend='auto' or 'reference', or rule='cann'";
  }
  if (call.scale_out != call.scale || call.tracker_out != call.tracker) {
    return "aclnnAmpUpdateScale is called in place: the outputs must alias the "
           "inputs (input_output_aliases={0: 0, 1: 1})";
  }
  for (int64_t i = 0; i < call.count; ++i) {
    std::string err = DispatchOne(api, cache, device, stream, call, i);
    if (!err.empty()) {
      if (call.count > 1) err = "batch element " + std::to_string(i) + ": " + err;
      return err;
    }
  }
  return std::string();
}

}  // namespace jas

namespace jas {

std::string DispatchUnscaleAndCheck(const cann::CannApi& api, WorkspaceCache& cache,
                                    int64_t device, cann::aclrtStream stream, void* inv_scale,
                                    void* found, const std::vector<UnscaleLeaf>& leaves) {
  if (api.foreach_launch == nullptr) {
    return "aclnnForeachNonFiniteCheckAndUnscale is not available";
  }
  // One dtype per list (the tiling refuses mixed lists): group, keeping order.
  for (ScaleDtype dt : {ScaleDtype::kF32, ScaleDtype::kF16, ScaleDtype::kBF16}) {
    std::vector<UnscaleLeaf> group;
    for (const UnscaleLeaf& l : leaves) {
      if (l.dtype == dt && l.count > 0) group.push_back(l);
    }
    for (size_t start = 0; start < group.size(); start += kMaxTensorsPerLaunch) {
      const size_t n = std::min(kMaxTensorsPerLaunch, group.size() - start);
      std::string err = LaunchForeach(api, cache, device, stream, group.data() + start, n,
                                      found, inv_scale);
      if (!err.empty()) return err;
    }
  }
  return std::string();
}

}  // namespace jas
