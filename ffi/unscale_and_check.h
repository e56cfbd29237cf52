// The fused gradient pass, written once: unscale every floating leaf by
// inv_scale and report whether any unscaled value is inf or NaN.
//
// Semantics (shared bit for bit with the pure-JAX path in
// jax_amp_scale/_scaling.py, as XLA:CPU runs it):
//
//   float16 / bfloat16 leaf: y = round_to_leaf(float32(x) * inv_scale)
//   float32 leaf:            y = x * inv_scale
//   float64 leaf:            y = x * double(inv_scale)
//   found |= !isfinite(y)    (the check reads the unscaled, rounded value)
//
// inv_scale may be a float32 subnormal (torch's inverse of a scale above
// 2**126), which denormals-are-zero would read as 0.  SplitInverse turns it
// into two factors, m normal and post a power of two, and every loop
// computes (x * m) * post: the first product rounds exactly as x * inv_scale
// (m = inv_scale * 2**64 only moves the exponent) and the second is exact
// unless the result is below the normal range, where both flush to a signed
// zero.  For a normal inv_scale post is 1.0 and (x * m) * 1.0 == x * m, NaN
// payloads included.  The reference (jax_amp_scale/reference/inverse.py)
// splits it the same way.
//
// NaN results keep their sign; float16 and float32/64 keep the top payload
// bits (made quiet), bfloat16 gets the canonical quiet NaN, as XLA:CPU.
//
// XLA:CPU executes with denormals-are-zero and flush-to-zero set; the
// caller sets the same modes around these loops (ScopedFlushDenormals) so
// that subnormal inputs and products round exactly as the reference does.
// The float16 and bfloat16 conversions are written out in integer
// arithmetic: the hardware conversion is not available on every target and
// its NaN handling differs between instruction sets.
//
// No XLA dependency: the native tests include this header directly.
#ifndef JAX_AMP_SCALE_FFI_UNSCALE_AND_CHECK_H_
#define JAX_AMP_SCALE_FFI_UNSCALE_AND_CHECK_H_

#include <cstdint>
#include <cstring>

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

// cond ? a : b as bit arithmetic: a select the vectoriser cannot turn back
// into a branch (GCC leaves `?:` over float arithmetic as control flow).
inline uint32_t Select(bool cond, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

inline uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float F32FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// float16 -> float32, exact (float16 subnormals become float32 normals).
// Branch-free (selects only) so that the unscale loops vectorise: a
// subnormal's value mant * 2^-24 is computed in float32, where it is a normal
// number (or zero), so it is exact and no flush mode touches it.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  const uint32_t normal = ((exp + 112u) << 23) | (mant << 13);
  const uint32_t special = 0x7f800000u | (mant << 13);  // inf, NaN (payload kept)
  const uint32_t sub = F32Bits(static_cast<float>(static_cast<int32_t>(mant)) * 0x1p-24f);
  const uint32_t mag = Select(exp == 0, sub, Select(exp == 0x1fu, special, normal));
  return F32FromBits(sign | mag);
}

// float32 -> float16: round to nearest even, overflow to inf, gradual
// underflow; NaN stays NaN with its sign and top payload bits, made quiet.
// Branch-free (every case computed, one selected) so that the loops
// vectorise.  A subnormal result is rounded by a float32 addition of 0.5,
// whose ulp is 2^-24, the float16 subnormal step: round to nearest even in
// hardware, and the sum is a normal number, so flush-to-zero cannot touch it
// (a float32 subnormal input is read as zero under denormals-are-zero, and
// rounds to zero either way).
inline uint16_t FloatToHalf(float f) {
  const uint32_t u = F32Bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t mag = u & 0x7fffffffu;
  const uint32_t nan = 0x7e00u | ((mag >> 13) & 0x3ffu);
  // float16 normal range: drop 13 bits, rounding to nearest even.
  const uint32_t normal = (mag + 0xfffu + ((mag >> 13) & 1u) - 0x38000000u) >> 13;
  const uint32_t sub = F32Bits(F32FromBits(mag) + 0.5f) - 0x3f000000u;
  uint32_t out = Select(mag >= 0x38800000u, normal, sub);
  out = Select(mag >= 0x477ff000u, 0x7c00u, out);  // rounds to inf
  out = Select(mag > 0x7f800000u, nan, out);
  return static_cast<uint16_t>(sign | out);
}

inline float BFloat16ToFloat(uint16_t b) { return F32FromBits(static_cast<uint32_t>(b) << 16); }

// float32 -> bfloat16: round to nearest even; NaN becomes the canonical
// quiet NaN with its sign (XLA:CPU's conversion drops the payload).
inline uint16_t FloatToBFloat16(float f) {
  const uint32_t u = F32Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7fc0u);
  }
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// inv_scale as (m, post): inv_scale == m * post exactly, m never subnormal.
struct InverseFactors {
  float m;
  float post;
};

// The power of two a subnormal inverse is lifted by (reference/inverse.py's
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

// Applies `f` (value -> unscaled value) to `n` elements and ORs `bad`
// (unscaled value -> 1 if inf or NaN, else 0) over the results.  Written
// without early exits, branches on the data or stores other than `out`, so
// the compiler vectorises it.  `out` is either `in` itself (in place: XLA
// hands the handler aliased buffers) or a buffer that does not overlap it;
// the two cases get separate loops because the compiler's runtime overlap
// check would send exact aliasing to its scalar fallback.
template <typename T, typename F, typename B>
inline bool UnscaleLoop(const T* in, T* out, int64_t n, F f, B bad) {
  uint32_t any = 0;
  if (static_cast<const void*>(in) == static_cast<const void*>(out)) {
    for (int64_t i = 0; i < n; ++i) {
      const T y = f(out[i]);
      out[i] = y;
      any |= bad(y);
    }
  } else {
    const T* __restrict src = in;
    T* __restrict dst = out;
    for (int64_t i = 0; i < n; ++i) {
      const T y = f(src[i]);
      dst[i] = y;
      any |= bad(y);
    }
  }
  return any != 0;
}

inline bool UnscaleF32Portable(const float* in, float* out, int64_t n, float inv,
                               float post) {
  return UnscaleLoop(
      in, out, n, [inv, post](float x) { return (x * inv) * post; },
      [](float y) {
        return static_cast<uint32_t>((F32Bits(y) & 0x7f800000u) == 0x7f800000u);
      });
}

#ifdef JAS_HAVE_F16C_PATH
// How far ahead of the loads the x86 loops below prefetch.  On a 64 MiB
// buffer (one thread, this project's Sapphire Rapids VM) the hardware
// prefetcher alone kept the float32 loop at 9.0 GB/s and the float16 loop
// at 6.0 GB/s; 2 KiB ahead they ran 11.8 and 9.9 GB/s (1 KiB: 10.7 and 8.9,
// 4 KiB: 11.2).  Only addresses inside the buffer are prefetched: the last
// kPrefetchBytes run the same loop without it.
constexpr int64_t kPrefetchBytes = 2048;

// 16 float32 elements (one 64-byte line): unscale, store, OR the check in.
__attribute__((target("avx2"))) inline void UnscaleF32Line(const float* in, float* out,
                                                           __m256 vinv, __m256 vpost,
                                                           __m256i& any) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  const __m256 a = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(in), vinv), vpost);
  const __m256 b = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(in + 8), vinv), vpost);
  _mm256_storeu_ps(out, a);
  _mm256_storeu_ps(out + 8, b);
  const __m256i ea = _mm256_and_si256(_mm256_castps_si256(a), exp_mask);
  const __m256i eb = _mm256_and_si256(_mm256_castps_si256(b), exp_mask);
  any = _mm256_or_si256(
      any, _mm256_or_si256(_mm256_cmpeq_epi32(ea, exp_mask), _mm256_cmpeq_epi32(eb, exp_mask)));
}

// The float32 loop with 256-bit AVX2, 16 elements an iteration: the SSE2
// loop GCC emits without -mavx2 moved about half of what NumPy's in-place
// negation moves per second on one core.  Same multiply (the thread's flush
// modes apply to mulps and vmulps alike), same check on the result's bits.
__attribute__((target("avx2"))) inline bool UnscaleF32Avx2(const float* in, float* out,
                                                          int64_t n, float inv, float post) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 vpost = _mm256_set1_ps(post);
  __m256i any = _mm256_setzero_si256();
  constexpr int64_t ahead = kPrefetchBytes / sizeof(float);
  int64_t i = 0;
  for (; i + 16 + ahead <= n; i += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(in + i + ahead), _MM_HINT_T0);
    UnscaleF32Line(in + i, out + i, vinv, vpost, any);
  }
  for (; i + 16 <= n; i += 16) UnscaleF32Line(in + i, out + i, vinv, vpost, any);
  bool bad = _mm256_movemask_epi8(any) != 0;
  if (i < n) bad |= UnscaleF32Portable(in + i, out + i, n - i, inv, post);
  return bad;
}

inline bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}
#endif

inline bool UnscaleF32(const float* in, float* out, int64_t n, float inv, float post) {
#ifdef JAS_HAVE_F16C_PATH
  if (HaveAvx2()) return UnscaleF32Avx2(in, out, n, inv, post);
#endif
  return UnscaleF32Portable(in, out, n, inv, post);
}

inline bool UnscaleF64(const double* in, double* out, int64_t n, double inv, double post) {
  return UnscaleLoop(
      in, out, n, [inv, post](double x) { return (x * inv) * post; },
      [](double y) {
        uint64_t bits;
        std::memcpy(&bits, &y, sizeof(bits));
        const uint64_t exp_mask = uint64_t{0x7ff} << 52;
        return static_cast<uint32_t>((bits & exp_mask) == exp_mask);
      });
}

// The portable float16 loop (the conversions above, vectorised with SSE2:
// about 2 ns an element, compute-bound).
inline bool UnscaleF16Portable(const uint16_t* in, uint16_t* out, int64_t n, float inv,
                               float post) {
  return UnscaleLoop(
      in, out, n,
      [inv, post](uint16_t x) { return FloatToHalf((HalfToFloat(x) * inv) * post); },
      [](uint16_t y) { return static_cast<uint32_t>((y & 0x7c00u) == 0x7c00u); });
}

#ifdef JAS_HAVE_F16C_PATH
// 32 float16 elements (one 64-byte line), 8 per conversion.
__attribute__((target("avx,f16c"))) inline void UnscaleF16Line(const uint16_t* in,
                                                               uint16_t* out, __m256 vinv,
                                                               __m256 vpost, __m128i& any) {
  const __m128i exp_mask = _mm_set1_epi16(0x7c00);
  for (int k = 0; k < 32; k += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + k));
    const __m256 y = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(h), vinv), vpost);
    const __m128i r = _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), r);
    any = _mm_or_si128(any, _mm_cmpeq_epi16(_mm_and_si128(r, exp_mask), exp_mask));
  }
}

// The same loop with x86's F16C conversions, a 64-byte line an iteration,
// prefetched as the float32 loop.  Bit for bit the portable conversions
// under the handler's modes (checked over every float16 and every float32
// pattern by tests/native/f16_test.cc): vcvtph2ps is exact, subnormals
// included, and quiets a signalling NaN, which the multiply would quiet
// anyway with the same payload; vcvtps2ph with _MM_FROUND_TO_NEAREST_INT
// rounds to nearest even with gradual underflow and overflow to inf, ignores
// flush-to-zero, and keeps a NaN's sign and top payload bits, made quiet.
__attribute__((target("avx,f16c"))) inline bool UnscaleF16F16c(const uint16_t* in,
                                                              uint16_t* out, int64_t n,
                                                              float inv, float post) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 vpost = _mm256_set1_ps(post);
  __m128i any = _mm_setzero_si128();
  constexpr int64_t ahead = kPrefetchBytes / sizeof(uint16_t);
  int64_t i = 0;
  for (; i + 32 + ahead <= n; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(in + i + ahead), _MM_HINT_T0);
    UnscaleF16Line(in + i, out + i, vinv, vpost, any);
  }
  for (; i + 32 <= n; i += 32) UnscaleF16Line(in + i, out + i, vinv, vpost, any);
  if (i < n) {
    // The last 1-31 elements through the same conversions, on a copy padded
    // with repeats of the first of them (so the padding adds no flag).  The
    // portable loop's software conversions made 12- to 31-element tails on
    // 10,000 leaves of 13,400 elements 8-10% slower (one thread).
    uint16_t line[32];
    for (int64_t k = 0; k < 32; ++k) line[k] = in[i + (i + k < n ? k : 0)];
    UnscaleF16Line(line, line, vinv, vpost, any);
    std::memcpy(out + i, line, static_cast<size_t>(n - i) * sizeof(uint16_t));
  }
  return _mm_movemask_epi8(any) != 0;
}

inline bool HaveF16c() {
  static const bool have = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return have;
}
#endif

inline bool UnscaleF16(const uint16_t* in, uint16_t* out, int64_t n, float inv, float post) {
#ifdef JAS_HAVE_F16C_PATH
  if (HaveF16c()) return UnscaleF16F16c(in, out, n, inv, post);
#endif
  return UnscaleF16Portable(in, out, n, inv, post);
}

inline bool UnscaleBF16Portable(const uint16_t* in, uint16_t* out, int64_t n, float inv,
                                float post) {
  return UnscaleLoop(
      in, out, n,
      [inv, post](uint16_t x) { return FloatToBFloat16((BFloat16ToFloat(x) * inv) * post); },
      [](uint16_t y) { return static_cast<uint32_t>((y & 0x7f80u) == 0x7f80u); });
}

#ifdef JAS_HAVE_F16C_PATH
// 8 float32 products -> bfloat16 bits in the low half of each 32-bit lane:
// FloatToBFloat16, lane by lane.
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

// 32 bfloat16 elements (one 64-byte line).  Widening is a 16-bit shift:
// unpacking with zeros within each 128-bit lane, and packing back the same
// way, keeps the elements in order.
__attribute__((target("avx2"))) inline void UnscaleBF16Line(const uint16_t* in, uint16_t* out,
                                                            __m256 vinv, __m256 vpost,
                                                            __m256i& any) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i exp_mask = _mm256_set1_epi16(0x7f80);
  for (int k = 0; k < 32; k += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + k));
    const __m256 lo = _mm256_mul_ps(
        _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, h)), vinv), vpost);
    const __m256 hi = _mm256_mul_ps(
        _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, h)), vinv), vpost);
    // Values fit in 16 bits, so the saturating pack is exact.
    const __m256i r = _mm256_packus_epi32(RoundToBFloat16(lo), RoundToBFloat16(hi));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), r);
    any = _mm256_or_si256(any, _mm256_cmpeq_epi16(_mm256_and_si256(r, exp_mask), exp_mask));
  }
}

// The bfloat16 loop with AVX2, prefetched as the float32 loop.  Bit for bit
// the portable loop (every bfloat16 pattern: tests/native/f16_test.cc);
// the multiply runs under the same flush modes.
__attribute__((target("avx2"))) inline bool UnscaleBF16Avx2(const uint16_t* in, uint16_t* out,
                                                           int64_t n, float inv, float post) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 vpost = _mm256_set1_ps(post);
  __m256i any = _mm256_setzero_si256();
  constexpr int64_t ahead = kPrefetchBytes / sizeof(uint16_t);
  int64_t i = 0;
  for (; i + 32 + ahead <= n; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(in + i + ahead), _MM_HINT_T0);
    UnscaleBF16Line(in + i, out + i, vinv, vpost, any);
  }
  for (; i + 32 <= n; i += 32) UnscaleBF16Line(in + i, out + i, vinv, vpost, any);
  bool bad = _mm256_movemask_epi8(any) != 0;
  if (i < n) bad |= UnscaleBF16Portable(in + i, out + i, n - i, inv, post);
  return bad;
}
#endif

inline bool UnscaleBF16(const uint16_t* in, uint16_t* out, int64_t n, float inv, float post) {
#ifdef JAS_HAVE_F16C_PATH
  if (HaveAvx2()) return UnscaleBF16Avx2(in, out, n, inv, post);
#endif
  return UnscaleBF16Portable(in, out, n, inv, post);
}

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_UNSCALE_AND_CHECK_H_
