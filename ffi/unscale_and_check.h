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
#include <xmmintrin.h>
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
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return F32FromBits(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return F32FromBits(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return F32FromBits(sign);
  int e = 113;  // normalise the subnormal: value = mant * 2^-24
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return F32FromBits(sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13));
}

// float32 -> float16: round to nearest even, overflow to inf, gradual
// underflow; NaN stays NaN with its sign and top payload bits, made quiet.
inline uint16_t FloatToHalf(float f) {
  const uint32_t u = F32Bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) {
    return static_cast<uint16_t>(sign | 0x7e00u | ((mag >> 13) & 0x3ffu));
  }
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (mag >= 0x38800000u) {  // float16 normal range
    const uint32_t rounded = mag + 0xfffu + ((mag >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (mag < 0x33000000u) return sign;  // at most half the smallest subnormal
  // Subnormal result: value = mant24 * 2^(e - 150), kept = value / 2^-24.
  const uint32_t e = mag >> 23;
  const uint32_t mant24 = (mag & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // in [14, 24]
  uint32_t kept = mant24 >> shift;
  const uint32_t rem = mant24 & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (kept & 1u) != 0)) ++kept;
  return static_cast<uint16_t>(sign | kept);
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

inline bool UnscaleF32(const float* in, float* out, int64_t n, float inv) {
  return UnscaleLoop(
      in, out, n, [inv](float x) { return x * inv; },
      [](float y) {
        return static_cast<uint32_t>((F32Bits(y) & 0x7f800000u) == 0x7f800000u);
      });
}

inline bool UnscaleF64(const double* in, double* out, int64_t n, double inv) {
  return UnscaleLoop(
      in, out, n, [inv](double x) { return x * inv; },
      [](double y) {
        uint64_t bits;
        std::memcpy(&bits, &y, sizeof(bits));
        const uint64_t exp_mask = uint64_t{0x7ff} << 52;
        return static_cast<uint32_t>((bits & exp_mask) == exp_mask);
      });
}

inline bool UnscaleF16(const uint16_t* in, uint16_t* out, int64_t n, float inv) {
  return UnscaleLoop(
      in, out, n, [inv](uint16_t x) { return FloatToHalf(HalfToFloat(x) * inv); },
      [](uint16_t y) { return static_cast<uint32_t>((y & 0x7c00u) == 0x7c00u); });
}

inline bool UnscaleBF16(const uint16_t* in, uint16_t* out, int64_t n, float inv) {
  return UnscaleLoop(
      in, out, n, [inv](uint16_t x) { return FloatToBFloat16(BFloat16ToFloat(x) * inv); },
      [](uint16_t y) { return static_cast<uint32_t>((y & 0x7f80u) == 0x7f80u); });
}

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_UNSCALE_AND_CHECK_H_
