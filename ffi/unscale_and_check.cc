// CPU handler for the fused unscale-and-check custom call: one pass over
// every floating gradient leaf (read once, written once), one flag out.
//
// Large calls are split into chunks shared with XLA's intra-op thread pool
// (the pool XLA:CPU's own kernels use), so the pass runs on as many cores
// as a plain copy does.
//
// Two targets (targets.h), one pass:
//   jas_unscale_and_check_v1
//     operands: inv_scale (float32, one element), then the leaves.
//     results:  found_inf (bool, one element), then one unscaled leaf per
//               leaf operand, same dtype and element count.
//   jas_unscale_check_amax_v1: the same, with a second result after
//     found_inf: leaf_amax (float32, one element per leaf), each leaf's
//     largest finite |value| of the input, read in the same pass (the
//     statistic amax_scaler sets the next scale from).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "handler_common.h"
#include "unscale_and_check.h"
#include "xla/ffi/api/ffi.h"

namespace jas {
namespace {

bool IsLeafDtype(ffi::DataType dt) {
  return dt == ffi::DataType::F16 || dt == ffi::DataType::BF16 ||
         dt == ffi::DataType::F32 || dt == ffi::DataType::F64;
}

// Checks every buffer before anything is written.
ffi::Error CheckUnscaleCall(const ffi::AnyBuffer& inv_scale,
                            const ffi::RemainingArgs& leaves,
                            const ffi::AnyBuffer& found,
                            const ffi::AnyBuffer* amax,
                            const ffi::RemainingRets& outs) {
  if (inv_scale.element_type() != ffi::DataType::F32 ||
      inv_scale.element_count() != 1 || inv_scale.untyped_data() == nullptr) {
    return ffi::Error::InvalidArgument(std::string("inv_scale must be one float32 element, got ") +
                           DtypeName(inv_scale.element_type()));
  }
  if (found.element_type() != ffi::DataType::PRED || found.element_count() != 1 ||
      found.untyped_data() == nullptr) {
    return ffi::Error::InvalidArgument("found_inf must be one bool element");
  }
  if (amax != nullptr &&
      (amax->element_type() != ffi::DataType::F32 ||
       amax->element_count() != leaves.size() ||
       (leaves.size() > 0 && amax->untyped_data() == nullptr))) {
    return ffi::Error::InvalidArgument(
        "leaf_amax must be a float32 array of one element per gradient leaf");
  }
  if (leaves.size() != outs.size()) {
    return ffi::Error::InvalidArgument("the call must have as many unscaled results as gradient leaves");
  }
  for (size_t k = 0; k < leaves.size(); ++k) {
    ffi::ErrorOr<CheckedLeaf> leaf =
        CheckLeaf(leaves, outs, k, IsLeafDtype, "float16, bfloat16, float32 or float64");
    if (leaf.has_error()) return leaf.error();
  }
  return ffi::Error::Success();
}

// A slice of one leaf: the unit of work handed to a thread.
struct Chunk {
  ffi::DataType dtype;
  const void* in;
  void* out;
  int64_t begin;
  int64_t count;
  size_t leaf;
};

// `amax` null: no amax; else the chunk's largest finite magnitude
// goes there (unscale_and_check.h).
bool UnscaleChunk(const Chunk& c, InverseFactors inv, uint64_t* amax) {
  switch (c.dtype) {
    case ffi::DataType::F32:
      return UnscaleF32(static_cast<const float*>(c.in) + c.begin,
                        static_cast<float*>(c.out) + c.begin, c.count, inv.m, inv.post, amax);
    case ffi::DataType::F64:
      return UnscaleF64(static_cast<const double*>(c.in) + c.begin,
                        static_cast<double*>(c.out) + c.begin, c.count,
                        static_cast<double>(inv.m), static_cast<double>(inv.post), amax);
    case ffi::DataType::F16:
      return UnscaleF16(static_cast<const uint16_t*>(c.in) + c.begin,
                        static_cast<uint16_t*>(c.out) + c.begin, c.count, inv.m, inv.post,
                        amax);
    default:  // BF16: CheckUnscaleCall admitted nothing else
      return UnscaleBF16(static_cast<const uint16_t*>(c.in) + c.begin,
                         static_cast<uint16_t*>(c.out) + c.begin, c.count, inv.m, inv.post,
                         amax);
  }
}

// A leaf's largest finite magnitude (its own format's bits) as float32:
// exact for float16/bfloat16/float32, rounded for float64 as XLA:CPU's
// conversion rounds it (the caller holds the flush modes).
float AmaxToFloat(ffi::DataType dtype, uint64_t bits) {
  switch (dtype) {
    case ffi::DataType::F32:
      return F32FromBits(static_cast<uint32_t>(bits));
    case ffi::DataType::F64: {
      double d;
      std::memcpy(&d, &bits, sizeof(d));
      return static_cast<float>(d);
    }
    case ffi::DataType::F16:
      return HalfToFloat(static_cast<uint16_t>(bits));
    default:  // BF16
      return BFloat16ToFloat(static_cast<uint16_t>(bits));
  }
}

// Work shared by the calling thread and the pool tasks.  Owned through a
// shared_ptr: a task the pool starts late (after every chunk was taken)
// still finds it alive, claims nothing and leaves.
struct Work {
  std::vector<Chunk> chunks;
  InverseFactors inv{1.0f, 1.0f};
  // One per leaf when the call asks for the amax, else empty.
  std::unique_ptr<std::atomic<uint64_t>[]> amax;
  std::atomic<size_t> next{0};
  std::atomic<bool> bad{false};
  std::mutex mu;
  std::condition_variable all_done;
  size_t done = 0;  // guarded by mu
};

void RunChunks(Work& w) {
  ScopedFlushDenormals modes;  // per thread: pool threads have their own modes
  bool bad = false;
  size_t finished = 0;
  for (size_t i = w.next.fetch_add(1); i < w.chunks.size(); i = w.next.fetch_add(1)) {
    const Chunk& c = w.chunks[i];
    if (w.amax) {
      uint64_t top = 0;
      bad |= UnscaleChunk(c, w.inv, &top);
      std::atomic<uint64_t>& leaf = w.amax[c.leaf];
      uint64_t seen = leaf.load();
      while (top > seen && !leaf.compare_exchange_weak(seen, top)) {
      }
    } else {
      bad |= UnscaleChunk(c, w.inv, nullptr);
    }
    ++finished;
  }
  if (bad) w.bad.store(true);
  if (finished == 0) return;
  std::lock_guard<std::mutex> lock(w.mu);
  w.done += finished;
  if (w.done == w.chunks.size()) w.all_done.notify_all();
}

// Below this many elements in all the call is done on the calling thread:
// waking pool threads costs more than it saves.
constexpr int64_t kParallelMinElements = int64_t{1} << 16;
// Chunk size: large enough to stream, small enough to balance the threads.
constexpr int64_t kChunkElements = int64_t{1} << 18;

// The pass behind both targets; `amax` null for jas_unscale_and_check_v1.
ffi::Error UnscaleAndCheck(ffi::AnyBuffer inv_scale, ffi::RemainingArgs leaves,
                           ffi::AnyBuffer found, ffi::AnyBuffer* amax,
                           ffi::RemainingRets outs, ffi::ThreadPool pool) {
  ffi::Error checked = CheckUnscaleCall(inv_scale, leaves, found, amax, outs);
  if (checked.failure()) return checked;

  auto work = std::make_shared<Work>();
  if (amax != nullptr) {
    work->amax = std::make_unique<std::atomic<uint64_t>[]>(leaves.size());
    for (size_t k = 0; k < leaves.size(); ++k) work->amax[k].store(0);
  }
  // Split by bits: a subnormal inverse (a scale above 2**126) is lifted into
  // the normal range before any arithmetic reads it (unscale_and_check.h).
  work->inv = SplitInverse(*static_cast<const float*>(inv_scale.untyped_data()));
  int64_t total = 0;
  for (size_t k = 0; k < leaves.size(); ++k) {
    ffi::AnyBuffer in = *leaves.get<ffi::AnyBuffer>(k);
    ffi::AnyBuffer out = **outs.get<ffi::AnyBuffer>(k);
    const int64_t n = static_cast<int64_t>(in.element_count());
    for (int64_t b = 0; b < n; b += kChunkElements) {
      const int64_t count = n - b < kChunkElements ? n - b : kChunkElements;
      work->chunks.push_back(
          Chunk{in.element_type(), in.untyped_data(), out.untyped_data(), b, count, k});
    }
    total += n;
  }

  const int64_t threads = pool.num_threads();
  if (total >= kParallelMinElements && threads > 1 && work->chunks.size() > 1) {
    const int64_t helpers = std::min<int64_t>(
        threads - 1, static_cast<int64_t>(work->chunks.size()) - 1);
    for (int64_t t = 0; t < helpers; ++t) {
      pool.Schedule([work]() { RunChunks(*work); });
    }
  }
  RunChunks(*work);
  {
    // Every chunk was claimed once the caller's loop ended; wait for the
    // ones other threads are still writing.
    std::unique_lock<std::mutex> lock(work->mu);
    work->all_done.wait(lock, [&] { return work->done == work->chunks.size(); });
  }
  // PRED is one byte holding 0 or 1.
  *static_cast<uint8_t*>(found.untyped_data()) = work->bad.load() ? 1 : 0;
  if (amax != nullptr) {
    ScopedFlushDenormals modes;  // float64's rounding to float32, as XLA:CPU's
    float* dst = static_cast<float*>(amax->untyped_data());
    for (size_t k = 0; k < leaves.size(); ++k) {
      dst[k] = AmaxToFloat(leaves.get<ffi::AnyBuffer>(k)->element_type(), work->amax[k].load());
    }
  }
  return ffi::Error::Success();
}

ffi::Error UnscaleAndCheckCpu(ffi::AnyBuffer inv_scale, ffi::RemainingArgs leaves,
                              ffi::Result<ffi::AnyBuffer> found, ffi::RemainingRets outs,
                              ffi::ThreadPool pool) {
  return UnscaleAndCheck(inv_scale, leaves, *found, nullptr, outs, pool);
}

ffi::Error UnscaleCheckAmaxCpu(ffi::AnyBuffer inv_scale, ffi::RemainingArgs leaves,
                               ffi::Result<ffi::AnyBuffer> found,
                               ffi::Result<ffi::AnyBuffer> amax, ffi::RemainingRets outs,
                               ffi::ThreadPool pool) {
  return UnscaleAndCheck(inv_scale, leaves, *found, &*amax, outs, pool);
}

}  // namespace
}  // namespace jas

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUnscaleAndCheckCpu, jas::UnscaleAndCheckCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()  // inv_scale
                                  .RemainingArgs()             // gradient leaves
                                  .Ret<xla::ffi::AnyBuffer>()  // found_inf
                                  .RemainingRets()             // unscaled leaves
                                  .Ctx<xla::ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JasUnscaleCheckAmaxCpu, jas::UnscaleCheckAmaxCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()  // inv_scale
                                  .RemainingArgs()             // gradient leaves
                                  .Ret<xla::ffi::AnyBuffer>()  // found_inf
                                  .Ret<xla::ffi::AnyBuffer>()  // leaf_amax
                                  .RemainingRets()             // unscaled leaves
                                  .Ctx<xla::ffi::ThreadPool>());
