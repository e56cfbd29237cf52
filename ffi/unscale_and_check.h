// The fused gradient pass, written once: unscale every floating leaf by
// inv_scale and report whether any unscaled value is inf or NaN.
//
// Semantics (shared bit for bit with the pure-JAX path in
// jax_amp_scale/operators/unscale_and_check.py, as XLA:CPU runs it):
//
//   float16 / bfloat16 leaf: y = round_to_leaf(float32(x) * inv_scale)
//   float32 leaf:            y = x * inv_scale
//   float64 leaf:            y = x * double(inv_scale)
//   found |= !isfinite(y)    (the check reads the unscaled, rounded value)
//   amax = max |x| over finite x (optional; the scaled input, by its bits)
//
// inv_scale may be a float32 subnormal (torch's inverse of a scale above
// 2**126), which denormals-are-zero would read as 0.  SplitInverse turns it
// into two factors, m normal and post a power of two, and every loop
// computes (x * m) * post: the first product rounds exactly as x * inv_scale
// (m = inv_scale * 2**64 only moves the exponent) and the second is exact
// unless the result is below the normal range, where both flush to a signed
// zero.  For a normal inv_scale post is 1.0 and (x * m) * 1.0 == x * m, NaN
// payloads included.  The reference (jax_amp_scale/mechanisms/floats.py)
// splits it the same way.
//
// NaN results keep their sign; float16 and float32/64 keep the top payload
// bits (made quiet), bfloat16 gets the canonical quiet NaN, as XLA:CPU.
//
// XLA:CPU executes with denormals-are-zero and flush-to-zero set; the
// caller sets the same modes around these loops (ScopedFlushDenormals) so
// that subnormal inputs and products round exactly as the reference does.
// The float16 and bfloat16 conversions are float_formats.h's.
//
// No XLA dependency: the native tests include this header directly.
#ifndef JAX_AMP_SCALE_FFI_UNSCALE_AND_CHECK_H_
#define JAX_AMP_SCALE_FFI_UNSCALE_AND_CHECK_H_

#include <cstdint>
#include <cstring>

#include "float_formats.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <xmmintrin.h>
#define JAS_HAVE_F16C_PATH 1
#endif

namespace jas {

// Sets denormals-are-zero and flush-to-zero for the current thread and
// restores the previous modes on exit.
class ScopedFlushDenormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  // MXCSR: bit 15 = FTZ, bit 6 = DAZ.
  ScopedFlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~ScopedFlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned int saved_;
#elif defined(__aarch64__)
  // FPCR.FZ (bit 24) flushes subnormal inputs and results.
  ScopedFlushDenormals() : saved_(__builtin_aarch64_get_fpcr64()) {
    __builtin_aarch64_set_fpcr64(saved_ | (uint64_t{1} << 24));
  }
  ~ScopedFlushDenormals() { __builtin_aarch64_set_fpcr64(saved_); }

 private:
  uint64_t saved_;
#else
  // Other targets: the thread's own modes (documented in the README).
#endif
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;
};

// inv_scale as (m, post): inv_scale == m * post exactly, m never subnormal.
struct InverseFactors {
  float m;
  float post;
};

// The power of two a subnormal inverse is lifted by (mechanisms/floats.py's
// SUBNORMAL_SHIFT).
constexpr int kSubnormalShift = 64;

inline InverseFactors SplitInverse(float inv) {
  const uint32_t u = F32Bits(inv);
  const uint32_t mant = u & 0x7fffffu;
  if ((u & 0x7f800000u) != 0 || mant == 0) return {inv, 1.0f};
  // mant * 2^-149 * 2^64 = mant * 2^-85: exact, normal.
  const float lifted = static_cast<float>(mant) * 0x1p-85f;
  return {F32FromBits(F32Bits(lifted) | (u & 0x80000000u)), 0x1p-64f};
}

// Finite magnitudes, for the amax: a value's bits without the sign where it
// is finite, else 0.  For IEEE formats the order of these integers is the
// order of |x| (subnormals included, read by their bits, so flush-to-zero
// cannot touch them), and the largest one is the amax of the finite values.
// The amax reads the *scaled* input, the statistic a scaler sets the next
// scale from.
template <typename U, U kMagMask, U kInfBits>
struct FiniteMagnitude {
  U operator()(U bits) const {
    const U mag = bits & kMagMask;
    return mag < kInfBits ? mag : U{0};
  }
};

// Applies `f` (value -> unscaled value) to `n` elements and ORs `bad`
// (unscaled value -> 1 if inf or NaN, else 0) over the results; with
// kAmax, also the largest `mag` (input bits -> finite magnitude) into
// *amax.  Written without early exits, branches on the data or stores other
// than `out`, so the compiler vectorises it.  `out` is either `in` itself
// (in place: XLA hands the handler aliased buffers) or a buffer that does
// not overlap it; the two cases get separate loops because the compiler's
// runtime overlap check would send exact aliasing to its scalar fallback.
template <bool kAmax, typename U, typename T, typename F, typename B, typename M>
inline bool UnscaleLoop(const T* in, T* out, int64_t n, F f, B bad, M mag, uint64_t* amax) {
  uint32_t any = 0;
  U top = 0;
  if (static_cast<const void*>(in) == static_cast<const void*>(out)) {
    for (int64_t i = 0; i < n; ++i) {
      const T x = out[i];
      const T y = f(x);
      out[i] = y;
      any |= bad(y);
      if constexpr (kAmax) {
        U u;
        std::memcpy(&u, &x, sizeof(u));
        const U m = mag(u);
        top = m > top ? m : top;
      }
    }
  } else {
    const T* __restrict src = in;
    T* __restrict dst = out;
    for (int64_t i = 0; i < n; ++i) {
      const T x = src[i];
      const T y = f(x);
      dst[i] = y;
      any |= bad(y);
      if constexpr (kAmax) {
        U u;
        std::memcpy(&u, &x, sizeof(u));
        const U m = mag(u);
        top = m > top ? m : top;
      }
    }
  }
  if constexpr (kAmax) {
    if (static_cast<uint64_t>(top) > *amax) *amax = top;
  }
  return any != 0;
}

using F32Magnitude = FiniteMagnitude<uint32_t, 0x7fffffffu, 0x7f800000u>;
using F64Magnitude =
    FiniteMagnitude<uint64_t, (uint64_t{1} << 63) - 1, uint64_t{0x7ff} << 52>;
using F16Magnitude = FiniteMagnitude<uint16_t, 0x7fffu, 0x7c00u>;
using BF16Magnitude = FiniteMagnitude<uint16_t, 0x7fffu, 0x7f80u>;

template <bool kAmax>
inline bool UnscaleF32Portable(const float* in, float* out, int64_t n, float inv,
                               float post, uint64_t* amax) {
  return UnscaleLoop<kAmax, uint32_t>(
      in, out, n, [inv, post](float x) { return (x * inv) * post; },
      [](float y) {
        return static_cast<uint32_t>((F32Bits(y) & 0x7f800000u) == 0x7f800000u);
      },
      F32Magnitude{}, amax);
}

template <bool kAmax>
inline bool UnscaleF64Impl(const double* in, double* out, int64_t n, double inv, double post,
                           uint64_t* amax) {
  return UnscaleLoop<kAmax, uint64_t>(
      in, out, n, [inv, post](double x) { return (x * inv) * post; },
      [](double y) {
        uint64_t bits;
        std::memcpy(&bits, &y, sizeof(bits));
        const uint64_t exp_mask = uint64_t{0x7ff} << 52;
        return static_cast<uint32_t>((bits & exp_mask) == exp_mask);
      },
      F64Magnitude{}, amax);
}

// The portable float16 loop (float_formats.h's conversions, vectorised with
// SSE2: about 2 ns an element, compute-bound).
template <bool kAmax>
inline bool UnscaleF16Portable(const uint16_t* in, uint16_t* out, int64_t n, float inv,
                               float post, uint64_t* amax) {
  return UnscaleLoop<kAmax, uint16_t>(
      in, out, n,
      [inv, post](uint16_t x) { return FloatToHalf((HalfToFloat(x) * inv) * post); },
      [](uint16_t y) { return static_cast<uint32_t>((y & 0x7c00u) == 0x7c00u); },
      F16Magnitude{}, amax);
}

// bfloat16 NaN results get the canonical quiet NaN, as XLA:CPU's conversion.
template <bool kAmax>
inline bool UnscaleBF16Portable(const uint16_t* in, uint16_t* out, int64_t n, float inv,
                                float post, uint64_t* amax) {
  return UnscaleLoop<kAmax, uint16_t>(
      in, out, n,
      [inv, post](uint16_t x) {
        return FloatToBFloat16((BFloat16ToFloat(x) * inv) * post, BF16Nan::kCanonical);
      },
      [](uint16_t y) { return static_cast<uint32_t>((y & 0x7f80u) == 0x7f80u); },
      BF16Magnitude{}, amax);
}

#ifdef JAS_HAVE_F16C_PATH
// ---- x86: the same loops with AVX2 / F16C, one 64-byte line an iteration.
//
// Why: the SSE2 float32 loop GCC emits without -mavx2 moved about half of
// what NumPy's in-place negation moves per second on one core, and the
// portable float16 conversions are compute-bound.  Each vector loop is bit
// for bit its portable loop under the handler's flush modes (every float16
// and bfloat16 pattern, a sweep of float32 ones: tests/native/f16_test.cc).
//
// How far ahead of the loads they prefetch: on a 64 MiB buffer (one thread)
// the hardware prefetcher alone kept the float32 loop at 9.0 GB/s and the
// float16 loop at 6.0 GB/s; 2 KiB ahead they ran 11.8 and 9.9 GB/s (1 KiB:
// 10.7 and 8.9, 4 KiB: 11.2).
constexpr int64_t kPrefetchBytes = 2048;

// Runs `line(in + i, out + i)` over the whole 64-byte lines of the n
// elements, prefetching kPrefetchBytes ahead only while that address lies
// inside the buffer; returns how many elements it did.  Always inlined into
// the x86 loops below, whose instruction set then lets `line` inline too.
template <typename T, typename Line>
__attribute__((always_inline)) inline int64_t ForEachLine(const T* in, T* out, int64_t n,
                                                          Line& line) {
  constexpr int64_t per_line = 64 / static_cast<int64_t>(sizeof(T));
  constexpr int64_t ahead = kPrefetchBytes / static_cast<int64_t>(sizeof(T));
  int64_t i = 0;
  for (; i + per_line + ahead <= n; i += per_line) {
    _mm_prefetch(reinterpret_cast<const char*>(in + i + ahead), _MM_HINT_T0);
    line(in + i, out + i);
  }
  for (; i + per_line <= n; i += per_line) line(in + i, out + i);
  return i;
}

// The largest of the unsigned 32-bit (16-bit) lanes of `v`.
__attribute__((target("avx2"))) inline uint64_t MaxLane32(__m256i v) {
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  uint32_t top = 0;
  for (uint32_t x : lanes) top = x > top ? x : top;
  return top;
}

__attribute__((target("avx2"))) inline uint64_t MaxLane16(__m256i v) {
  alignas(32) uint16_t lanes[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  uint16_t top = 0;
  for (uint16_t x : lanes) top = x > top ? x : top;
  return top;
}

// 16 float32 elements: unscale, store, OR the check into `any`; with
// kAmax the finite magnitudes of the input into `amax`.
template <bool kAmax>
struct F32Line {
  __m256 inv, post;
  __m256i any;
  __m256i amax;
  __attribute__((target("avx2"))) void operator()(const float* in, float* out) {
    const __m256 xa = _mm256_loadu_ps(in);
    const __m256 xb = _mm256_loadu_ps(in + 8);
    const __m256 a = _mm256_mul_ps(_mm256_mul_ps(xa, inv), post);
    const __m256 b = _mm256_mul_ps(_mm256_mul_ps(xb, inv), post);
    _mm256_storeu_ps(out, a);
    _mm256_storeu_ps(out + 8, b);
    const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
    const __m256i ea = _mm256_and_si256(_mm256_castps_si256(a), exp_mask);
    const __m256i eb = _mm256_and_si256(_mm256_castps_si256(b), exp_mask);
    any = _mm256_or_si256(any, _mm256_or_si256(_mm256_cmpeq_epi32(ea, exp_mask),
                                               _mm256_cmpeq_epi32(eb, exp_mask)));
    if constexpr (kAmax) {
      // |x| bits below inf's: finite.  Both sides are below 2^31, so the
      // signed compare is right.
      const __m256i mag = _mm256_set1_epi32(0x7fffffff);
      const __m256i ma = _mm256_and_si256(_mm256_castps_si256(xa), mag);
      const __m256i mb = _mm256_and_si256(_mm256_castps_si256(xb), mag);
      const __m256i fa = _mm256_and_si256(ma, _mm256_cmpgt_epi32(exp_mask, ma));
      const __m256i fb = _mm256_and_si256(mb, _mm256_cmpgt_epi32(exp_mask, mb));
      amax = _mm256_max_epu32(amax, _mm256_max_epu32(fa, fb));
    }
  }
  __attribute__((target("avx2"))) uint64_t Amax() const { return MaxLane32(amax); }
};

// 32 float16 elements, 8 per conversion.  vcvtph2ps is exact, subnormals
// included, and quiets a signalling NaN, which the multiply would quiet
// anyway with the same payload; vcvtps2ph with _MM_FROUND_TO_NEAREST_INT
// rounds to nearest even with gradual underflow and overflow to inf,
// ignores flush-to-zero, and keeps a NaN's sign and top payload bits, made
// quiet: FloatToHalf.
template <bool kAmax>
struct F16Line {
  __m256 inv, post;
  __m128i any;
  __m128i amax;
  __attribute__((target("avx,f16c"))) void operator()(const uint16_t* in, uint16_t* out) {
    const __m128i exp_mask = _mm_set1_epi16(0x7c00);
    for (int k = 0; k < 32; k += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + k));
      const __m256 y = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(h), inv), post);
      const __m128i r = _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), r);
      any = _mm_or_si128(any, _mm_cmpeq_epi16(_mm_and_si128(r, exp_mask), exp_mask));
      if constexpr (kAmax) {
        const __m128i m = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
        amax = _mm_max_epu16(amax, _mm_and_si128(m, _mm_cmpgt_epi16(exp_mask, m)));
      }
    }
  }
  __attribute__((target("avx,f16c"))) uint64_t Amax() const {
    alignas(16) uint16_t lanes[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes), amax);
    uint16_t top = 0;
    for (uint16_t x : lanes) top = x > top ? x : top;
    return top;
  }
};

// 8 float32 products -> bfloat16 bits in the low half of each 32-bit lane:
// FloatToBFloat16(y, BF16Nan::kCanonical), lane by lane.
__attribute__((target("avx2"))) inline __m256i RoundToBFloat16(__m256 y) {
  const __m256i u = _mm256_castps_si256(y);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                       _mm256_and_si256(high, _mm256_set1_epi32(1))),
      16);
  const __m256i nan = _mm256_or_si256(_mm256_and_si256(high, _mm256_set1_epi32(0x8000)),
                                      _mm256_set1_epi32(0x7fc0));
  // |u| > inf's bits: a signed compare is right, both sides are below 2^31.
  const __m256i is_nan = _mm256_cmpgt_epi32(
      _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, nan, is_nan);
}

// 32 bfloat16 elements.  Widening is a 16-bit shift: unpacking with zeros
// within each 128-bit lane, and packing back the same way, keeps the
// elements in order.
template <bool kAmax>
struct BF16Line {
  __m256 inv, post;
  __m256i any;
  __m256i amax;
  __attribute__((target("avx2"))) void operator()(const uint16_t* in, uint16_t* out) {
    const __m256i zero = _mm256_setzero_si256();
    const __m256i exp_mask = _mm256_set1_epi16(0x7f80);
    for (int k = 0; k < 32; k += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + k));
      const __m256 lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, h));
      const __m256 hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, h));
      // Values fit in 16 bits, so the saturating pack is exact.
      const __m256i r =
          _mm256_packus_epi32(RoundToBFloat16(_mm256_mul_ps(_mm256_mul_ps(lo, inv), post)),
                              RoundToBFloat16(_mm256_mul_ps(_mm256_mul_ps(hi, inv), post)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), r);
      any = _mm256_or_si256(any, _mm256_cmpeq_epi16(_mm256_and_si256(r, exp_mask), exp_mask));
      if constexpr (kAmax) {
        const __m256i m = _mm256_and_si256(h, _mm256_set1_epi16(0x7fff));
        amax = _mm256_max_epu16(amax, _mm256_and_si256(m, _mm256_cmpgt_epi16(exp_mask, m)));
      }
    }
  }
  __attribute__((target("avx2"))) uint64_t Amax() const { return MaxLane16(amax); }
};

// The AVX2 loop of Line (F32Line, BF16Line), then `tail` (the portable
// loop) on the last 1-15 (1-31) elements.
template <typename Line, bool kAmax, typename T, typename Tail>
__attribute__((target("avx2"))) inline bool UnscaleAvx2(const T* in, T* out, int64_t n,
                                                       float inv, float post, Tail tail,
                                                       uint64_t* amax) {
  Line line{_mm256_set1_ps(inv), _mm256_set1_ps(post), _mm256_setzero_si256(),
            _mm256_setzero_si256()};
  const int64_t i = ForEachLine(in, out, n, line);
  const bool tail_bad = i < n && tail(in + i, out + i, n - i, inv, post, amax);
  if constexpr (kAmax) {
    const uint64_t top = line.Amax();
    if (top > *amax) *amax = top;
  }
  return tail_bad || _mm256_movemask_epi8(line.any) != 0;
}

template <bool kAmax>
__attribute__((target("avx2"))) inline bool UnscaleF32Avx2(const float* in, float* out,
                                                          int64_t n, float inv, float post,
                                                          uint64_t* amax) {
  return UnscaleAvx2<F32Line<kAmax>, kAmax>(in, out, n, inv, post,
                                            UnscaleF32Portable<kAmax>, amax);
}

template <bool kAmax>
__attribute__((target("avx2"))) inline bool UnscaleBF16Avx2(const uint16_t* in, uint16_t* out,
                                                           int64_t n, float inv, float post,
                                                           uint64_t* amax) {
  return UnscaleAvx2<BF16Line<kAmax>, kAmax>(in, out, n, inv, post,
                                             UnscaleBF16Portable<kAmax>, amax);
}

// The float16 loop runs the last 1-31 elements through the same
// conversions, on a copy padded with repeats of the first of them (so the
// padding adds no flag and no larger amax): the portable loop's software
// conversions made 12- to 31-element tails on 10,000 leaves of 13,400
// elements 8-10% slower (one thread).
template <bool kAmax>
__attribute__((target("avx,f16c"))) inline bool UnscaleF16F16c(const uint16_t* in,
                                                              uint16_t* out, int64_t n,
                                                              float inv, float post,
                                                              uint64_t* amax) {
  F16Line<kAmax> line{_mm256_set1_ps(inv), _mm256_set1_ps(post), _mm_setzero_si128(),
                      _mm_setzero_si128()};
  const int64_t i = ForEachLine(in, out, n, line);
  if (i < n) {
    uint16_t padded[32];
    for (int64_t k = 0; k < 32; ++k) padded[k] = in[i + (i + k < n ? k : 0)];
    line(padded, padded);
    std::memcpy(out + i, padded, static_cast<size_t>(n - i) * sizeof(uint16_t));
  }
  if constexpr (kAmax) {
    const uint64_t top = line.Amax();
    if (top > *amax) *amax = top;
  }
  return _mm_movemask_epi8(line.any) != 0;
}

inline bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

inline bool HaveF16c() {
  static const bool have = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return have;
}
#endif  // JAS_HAVE_F16C_PATH

// The loops a handler calls: the x86 vector loop where the CPU has it.
// `amax`, when not null, receives the largest finite magnitude of the input
// (`FiniteMagnitude`, in the leaf's own format's bits) if it is larger than
// what it holds.
template <bool kAmax>
inline bool UnscaleF32Impl(const float* in, float* out, int64_t n, float inv, float post,
                           uint64_t* amax) {
#ifdef JAS_HAVE_F16C_PATH
  if (HaveAvx2()) return UnscaleF32Avx2<kAmax>(in, out, n, inv, post, amax);
#endif
  return UnscaleF32Portable<kAmax>(in, out, n, inv, post, amax);
}

template <bool kAmax>
inline bool UnscaleF16Impl(const uint16_t* in, uint16_t* out, int64_t n, float inv,
                           float post, uint64_t* amax) {
#ifdef JAS_HAVE_F16C_PATH
  if (HaveF16c()) return UnscaleF16F16c<kAmax>(in, out, n, inv, post, amax);
#endif
  return UnscaleF16Portable<kAmax>(in, out, n, inv, post, amax);
}

template <bool kAmax>
inline bool UnscaleBF16Impl(const uint16_t* in, uint16_t* out, int64_t n, float inv,
                            float post, uint64_t* amax) {
#ifdef JAS_HAVE_F16C_PATH
  if (HaveAvx2()) return UnscaleBF16Avx2<kAmax>(in, out, n, inv, post, amax);
#endif
  return UnscaleBF16Portable<kAmax>(in, out, n, inv, post, amax);
}

inline bool UnscaleF32(const float* in, float* out, int64_t n, float inv, float post,
                       uint64_t* amax = nullptr) {
  return amax ? UnscaleF32Impl<true>(in, out, n, inv, post, amax)
              : UnscaleF32Impl<false>(in, out, n, inv, post, nullptr);
}

inline bool UnscaleF64(const double* in, double* out, int64_t n, double inv, double post,
                       uint64_t* amax = nullptr) {
  return amax ? UnscaleF64Impl<true>(in, out, n, inv, post, amax)
              : UnscaleF64Impl<false>(in, out, n, inv, post, nullptr);
}

inline bool UnscaleF16(const uint16_t* in, uint16_t* out, int64_t n, float inv, float post,
                       uint64_t* amax = nullptr) {
  return amax ? UnscaleF16Impl<true>(in, out, n, inv, post, amax)
              : UnscaleF16Impl<false>(in, out, n, inv, post, nullptr);
}

inline bool UnscaleBF16(const uint16_t* in, uint16_t* out, int64_t n, float inv, float post,
                        uint64_t* amax = nullptr) {
  return amax ? UnscaleBF16Impl<true>(in, out, n, inv, post, amax)
              : UnscaleBF16Impl<false>(in, out, n, inv, post, nullptr);
}

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_UNSCALE_AND_CHECK_H_
