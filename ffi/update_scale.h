// The dynamic loss-scale update rule, written once for every handler.
//
// Semantics are those of Ascend's aclnnAmpUpdateScale and torch's
// _amp_update_scale_ (see shared spec / README):
//
//   if found_inf != 0 (NaN counts):  scale *= backoff_factor; tracker = 0
//   elif tracker + 1 == interval:    grown = scale * growth_factor
//                                    scale = grown if finite(grown) else scale
//                                    tracker = 0
//   else:                            tracker += 1 (int32, wrapping)
//
// Arithmetic contract (shared bit for bit with the pure-JAX reference in
// jax_amp_scale/_product.py): scale * factor is rounded as torch rounds it,
// first to float64, then to the scale's dtype (MulByFactor).  This header
// has no XLA or CUDA dependency so that CPU, CUDA and test code can all
// include it.
#ifndef JAX_AMP_SCALE_FFI_UPDATE_SCALE_H_
#define JAX_AMP_SCALE_FFI_UPDATE_SCALE_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__CUDACC__)
#define JAS_HD __host__ __device__
#else
#define JAS_HD
#endif

namespace jas {

enum class ScaleDtype { kF32, kF16, kBF16 };

// Bit casts through memcpy: the only portable, UB-free way in C++17.
JAS_HD inline uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}
JAS_HD inline float BitsToFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// Storage formats of the scale.  p = significand bits (with the implicit
// one), emin = smallest normal exponent, bias = exponent bias.
struct Format {
  int exp_bits;
  int p;
  int bias;
  uint32_t sign_bit;
  uint32_t inf_bits;   // +inf
  uint32_t quiet_bit;  // top significand bit (quiet NaN)
};

JAS_HD inline Format FormatOf(ScaleDtype dt) {
  switch (dt) {
    case ScaleDtype::kF16:
      return Format{5, 11, 15, 0x8000u, 0x7C00u, 0x0200u};
    case ScaleDtype::kBF16:
      return Format{8, 8, 127, 0x8000u, 0x7F80u, 0x0040u};
    case ScaleDtype::kF32:
    default:
      return Format{8, 24, 127, 0x80000000u, 0x7F800000u, 0x00400000u};
  }
}

// A positive finite factor as an integer significand and exponent:
// factor = significand * 2^(exponent - 52), significand in [2^52, 2^53).
struct Factor {
  uint64_t significand;
  int exponent;
};

// Splits a finite double > 0 (checked by CheckAttributes) exactly.
JAS_HD inline Factor SplitFactor(double f) {
  uint64_t u;
  memcpy(&u, &f, sizeof(u));
  const int e = static_cast<int>((u >> 52) & 0x7FFu);
  uint64_t m = u & ((uint64_t{1} << 52) - 1);
  if (e != 0) return Factor{m | (uint64_t{1} << 52), e - 1023};
  int shift = 0;  // subnormal double: normalise
  while ((m & (uint64_t{1} << 52)) == 0) {
    m <<= 1;
    ++shift;
  }
  return Factor{m, -1022 - shift};
}

// Bit length of a nonzero value (position of the highest set bit + 1).
JAS_HD inline int BitLength(uint32_t v) {
  int n = 0;
  while (v != 0) {
    v >>= 1;
    ++n;
  }
  return n;
}

// scale * factor, rounded as torch rounds it: the exact product is first
// rounded to float64 (torch multiplies a float by a double), then to the
// scale's format (round to nearest even, overflow to inf, gradual underflow).
// Integer arithmetic only, so flush-to-zero modes (XLA:CPU sets them) and
// FMA contraction cannot change a bit.  `bits` holds a value of format `dt`.
JAS_HD inline uint32_t MulByFactor(ScaleDtype dt, uint32_t bits, Factor g) {
  const Format fm = FormatOf(dt);
  const int q = fm.p - 1;  // stored significand bits
  const uint32_t sign = bits & fm.sign_bit;
  const uint32_t mag = bits & ~fm.sign_bit;
  if (mag > fm.inf_bits) return bits | fm.quiet_bit;  // NaN stays NaN
  if (mag == fm.inf_bits || mag == 0) return bits;    // inf and zero are fixed
  const uint32_t e = mag >> q;
  const uint32_t m = mag & ((1u << q) - 1u);
  // x = mx * 2^(ex - 23) with mx in [2^23, 2^24).
  uint32_t mx;
  int ex;
  if (e != 0) {
    mx = (m | (1u << q)) << (23 - q);
    ex = static_cast<int>(e) - fm.bias;
  } else {
    const int n = BitLength(m);
    mx = m << (24 - n);
    ex = 1 - fm.bias - q + (n - 1);
  }
  // Exact product: < 2^77, top bit at 75 or 76.
  const unsigned __int128 prod =
      static_cast<unsigned __int128>(mx) * static_cast<unsigned __int128>(g.significand);
  int top = (prod >> 76) != 0 ? 76 : 75;
  // Round to float64's 53 bits (k1 = dropped low bits).
  const int k1 = top - 52;
  const unsigned __int128 one = 1;
  const unsigned __int128 low1 = prod & ((one << k1) - 1);
  const unsigned __int128 half1 = one << (k1 - 1);
  unsigned __int128 p1 = prod - low1;
  if (low1 > half1 || (low1 == half1 && ((prod >> k1) & 1) != 0)) p1 += one << k1;
  if ((p1 >> (top + 1)) != 0) ++top;
  // value = 1.f * 2^exp
  const int exp = ex + g.exponent + (top - 75);
  const int emin = 1 - fm.bias;
  const int emax = fm.bias;
  if (exp > emax) return sign | fm.inf_bits;
  // Round to the target format, keeping p bits (fewer when subnormal).
  const int shift = top - q + (exp < emin ? emin - exp : 0);
  if (shift > top + 1) return sign;  // below half the smallest subnormal
  uint32_t kept = static_cast<uint32_t>(p1 >> shift);
  const unsigned __int128 low2 = p1 & ((one << shift) - 1);
  const unsigned __int128 half2 = one << (shift - 1);
  if (low2 > half2 || (low2 == half2 && (kept & 1u) != 0)) ++kept;
  const int biased = (exp < emin ? emin : exp) + fm.bias - 1;
  uint32_t out = (static_cast<uint32_t>(biased) << q) + kept;  // carries fold in
  if (out > fm.inf_bits) out = fm.inf_bits;
  return sign | out;
}

JAS_HD inline uint32_t LoadBits(ScaleDtype dt, const void* base, int64_t i) {
  if (dt == ScaleDtype::kF32) return static_cast<const uint32_t*>(base)[i];
  return static_cast<const uint16_t*>(base)[i];
}

JAS_HD inline void StoreBits(ScaleDtype dt, void* base, int64_t i, uint32_t v) {
  if (dt == ScaleDtype::kF32) {
    static_cast<uint32_t*>(base)[i] = v;
  } else {
    static_cast<uint16_t*>(base)[i] = static_cast<uint16_t>(v);
  }
}

JAS_HD inline bool IsFiniteBits(ScaleDtype dt, uint32_t bits) {
  const Format fm = FormatOf(dt);
  return (bits & fm.inf_bits) != fm.inf_bits;
}

// found_inf (in the scale's format) counts when nonzero or NaN: any bits
// other than the sign.
JAS_HD inline bool IsFoundBits(ScaleDtype dt, uint32_t bits) {
  return (bits & ~FormatOf(dt).sign_bit) != 0;
}

// int32 increment that wraps INT32_MAX to INT32_MIN without signed overflow.
JAS_HD inline int32_t WrappingIncrement(int32_t t) {
  return t == std::numeric_limits<int32_t>::max()
             ? std::numeric_limits<int32_t>::min()
             : t + 1;
}

// One element of the update.  `scale_out` may alias `scale_in` and
// `tracker_out` may alias `tracker_in` (in-place update): each input is read
// before its output is written.
JAS_HD inline void UpdateElement(ScaleDtype dt, const void* scale_in,
                                 const int32_t* tracker_in,
                                 const void* found_inf, void* scale_out,
                                 int32_t* tracker_out, int64_t i,
                                 Factor growth, Factor backoff,
                                 int64_t growth_interval) {
  const uint32_t scale = LoadBits(dt, scale_in, i);
  if (IsFoundBits(dt, LoadBits(dt, found_inf, i))) {
    StoreBits(dt, scale_out, i, MulByFactor(dt, scale, backoff));
    tracker_out[i] = 0;
    return;
  }
  const int32_t successful = WrappingIncrement(tracker_in[i]);
  if (static_cast<int64_t>(successful) == growth_interval) {
    // Growth is refused when the rounded product is inf/NaN.
    const uint32_t grown = MulByFactor(dt, scale, growth);
    StoreBits(dt, scale_out, i, IsFiniteBits(dt, grown) ? grown : scale);
    tracker_out[i] = 0;
  } else {
    StoreBits(dt, scale_out, i, scale);
    tracker_out[i] = successful;
  }
}

// Attribute checks shared by every handler.  Returns nullptr when valid,
// otherwise a static message naming the attribute and its allowed range.
inline const char* CheckAttributes(double growth_factor, double backoff_factor,
                                   int64_t growth_interval) {
  if (!(std::isfinite(growth_factor) && growth_factor > 0.0)) {
    return "growth_factor must be a finite number > 0";
  }
  if (!(std::isfinite(backoff_factor) && backoff_factor > 0.0)) {
    return "backoff_factor must be a finite number > 0";
  }
  if (growth_interval < 1 ||
      growth_interval > std::numeric_limits<int32_t>::max()) {
    return "growth_interval must lie in [1, 2147483647]";
  }
  return nullptr;
}

// One call of the rule on `count` independent states, as every handler sees
// it once its buffers and attributes are checked (handler_common.h).  The
// outputs may alias the inputs.
struct UpdateScaleCall {
  ScaleDtype dtype;
  void* scale;
  int32_t* tracker;
  const void* found_inf;
  void* scale_out;
  int32_t* tracker_out;
  int64_t count;
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
};

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_UPDATE_SCALE_H_
