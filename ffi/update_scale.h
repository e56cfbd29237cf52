// The dynamic loss-scale update rule, written once for every handler.
//
//   if found_inf != 0 (NaN counts):  scale *= backoff_factor; tracker = 0
//   elif tracker + 1 == interval:    grown = scale * growth_factor
//                                    scale = grown if finite(grown) else scale
//                                    tracker = 0
//   else:                            tracker += 1 (int32, wrapping)
//
// Two published kernels define `scale * factor`, and a state names the one it
// follows (Rule, the FFI attribute "rule"):
//
// - Rule::kTorch (torch._amp_update_scale_): the exact product is rounded to
//   float64, then to the scale's dtype (MulByFactor).
// - Rule::kCann (CANN's aclnnAmpUpdateScale, hicann/ops-math
//   math/amp_update_scale/op_kernel/amp_update_scale.h): the factors are
//   float32 (op_host/amp_update_scale_tiling.cpp:63-71), the scale is
//   widened to float32 (kernel :115-134), multiplied in float32 (:141,
//   :146), growth is refused when the float32 product is not finite
//   (:86-93, :147), and the result is cast to the scale's dtype at the store
//   (:162-172).  The library adds one guard the kernel lacks: growth is also
//   refused when the value stored in the scale's dtype is infinite (a
//   float16 32768 grown x2 stays 32768 instead of the kernel's inf).
//
// Arithmetic contract (shared bit for bit with the pure-JAX reference,
// jax_amp_scale/reference/exact_product.py and cann_rule.py): integer
// operations only, so XLA:CPU's flush-to-zero and FMA contraction cannot
// change a bit.  This header has no XLA or CUDA dependency so that CPU, CUDA
// and test code can all include it.
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

// Which published kernel's arithmetic a state follows (see the top).
enum class Rule { kTorch, kCann };

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

JAS_HD inline bool IsFiniteBits(ScaleDtype dt, uint32_t bits) {
  const Format fm = FormatOf(dt);
  return (bits & fm.inf_bits) != fm.inf_bits;
}

// ---- CANN's rule (Rule::kCann) ----

constexpr uint32_t kF32One = 0x3F800000u;

// A double rounded to float32 (nearest even, gradual underflow), as bits.
// 1.0f * f rounded as MulByFactor rounds is exactly that, in integer ops.
JAS_HD inline uint32_t RoundToF32Bits(double f) {
  return MulByFactor(ScaleDtype::kF32, kF32One, SplitFactor(f));
}

// A positive finite nonzero float32 (as bits) as a Factor, exactly.
JAS_HD inline Factor SplitF32Factor(uint32_t bits) {
  const int e = static_cast<int>((bits >> 23) & 0xFFu);
  uint64_t m = bits & 0x7FFFFFu;
  if (e != 0) return Factor{(m | (uint64_t{1} << 23)) << 29, e - 127};
  int shift = 0;  // float32 subnormal: normalise
  while ((m & (uint64_t{1} << 23)) == 0) {
    m <<= 1;
    ++shift;
  }
  return Factor{m << 29, -126 - shift};
}

// The factor as CANN's kernel holds it: the API's double rounded to float32
// (op_host/amp_update_scale_tiling.cpp:63-71 reads the attribute as float).
JAS_HD inline Factor CannFactor(double f) { return SplitF32Factor(RoundToF32Bits(f)); }

// Bits of a value of format `dt` widened (exactly) to float32 bits, as the
// kernel widens the scale (amp_update_scale.h:115-134).
JAS_HD inline uint32_t WidenToF32Bits(ScaleDtype dt, uint32_t bits) {
  if (dt == ScaleDtype::kF32) return bits;
  if (dt == ScaleDtype::kBF16) return bits << 16;
  const uint32_t sign = (bits & 0x8000u) << 16;
  const uint32_t e = (bits >> 10) & 0x1Fu;
  uint32_t m = bits & 0x3FFu;
  if (e == 0x1Fu) return sign | 0x7F800000u | (m << 13);  // inf, NaN
  if (e == 0) {
    if (m == 0) return sign;
    int ex = -14;  // subnormal: normalise into float32's normal range
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --ex;
    }
    return sign | (static_cast<uint32_t>(ex + 127) << 23) | ((m & 0x3FFu) << 13);
  }
  return sign | ((e - 15 + 127) << 23) | (m << 13);
}

// float32 bits rounded to format `dt` (nearest even, overflow to inf,
// gradual underflow): the kernel's cast at the store (amp_update_scale.h:165,
// :171; bfloat16 by CAST_RINT, float16 assumed nearest even).
JAS_HD inline uint32_t NarrowF32Bits(ScaleDtype dt, uint32_t bits) {
  if (dt == ScaleDtype::kF32) return bits;
  const Format fm = FormatOf(dt);
  const int q = fm.p - 1;
  const uint32_t sign = (bits >> 31) != 0 ? fm.sign_bit : 0u;
  const uint32_t mag = bits & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) {
    return sign | fm.inf_bits | fm.quiet_bit | ((mag & 0x7FFFFFu) >> (23 - q));
  }
  if (mag == 0x7F800000u) return sign | fm.inf_bits;
  if (mag == 0) return sign;
  const uint32_t e = mag >> 23;
  // value = sig * 2^(ex - 23)
  const uint32_t sig = e != 0 ? ((mag & 0x7FFFFFu) | 0x800000u) : mag;
  const int ex = e != 0 ? static_cast<int>(e) - 127 : -126;
  const int vexp = ex + BitLength(sig) - 24;  // exponent of the leading bit
  const int emin = 1 - fm.bias;
  if (vexp > fm.bias) return sign | fm.inf_bits;
  const int x = vexp < emin ? emin : vexp;
  const int shift = x - q - ex + 23;  // dropped bits, >= 13 for both formats
  if (shift > 24) return sign;        // below half the smallest subnormal
  uint32_t kept = sig >> shift;
  const uint32_t low = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (low > half || (low == half && (kept & 1u) != 0)) ++kept;
  uint32_t out = (static_cast<uint32_t>(x + fm.bias - 1) << q) + kept;
  if (out > fm.inf_bits) out = fm.inf_bits;
  return sign | out;
}

JAS_HD inline bool IsFiniteF32Bits(uint32_t bits) {
  return (bits & 0x7F800000u) != 0x7F800000u;
}

// scale * factor under `rule` (factor from FactorFor), in format `dt`.
// `*finite` says whether growth may keep it: for kTorch the stored value is
// finite; for kCann the float32 product is finite (the kernel's test) and so
// is the stored value (the library's guard).
JAS_HD inline uint32_t RuleProduct(Rule rule, ScaleDtype dt, uint32_t bits, Factor f,
                                   bool* finite) {
  if (rule == Rule::kTorch) {
    const uint32_t out = MulByFactor(dt, bits, f);
    *finite = IsFiniteBits(dt, out);
    return out;
  }
  const uint32_t p32 = MulByFactor(ScaleDtype::kF32, WidenToF32Bits(dt, bits), f);
  const uint32_t out = NarrowF32Bits(dt, p32);
  *finite = IsFiniteF32Bits(p32) && IsFiniteBits(dt, out);
  return out;
}

// The factor as `rule` multiplies by it.
JAS_HD inline Factor FactorFor(Rule rule, double f) {
  return rule == Rule::kCann ? CannFactor(f) : SplitFactor(f);
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
// before its output is written.  `growth` and `backoff` come from FactorFor
// with the same `rule`.
JAS_HD inline void UpdateElement(ScaleDtype dt, const void* scale_in,
                                 const int32_t* tracker_in,
                                 const void* found_inf, void* scale_out,
                                 int32_t* tracker_out, int64_t i,
                                 Factor growth, Factor backoff,
                                 int64_t growth_interval, Rule rule = Rule::kTorch) {
  const uint32_t scale = LoadBits(dt, scale_in, i);
  bool finite = false;
  // found_inf by its bits: a subnormal counts even where the FPU flushes.
  if (IsFoundBits(dt, LoadBits(dt, found_inf, i))) {
    // Backoff has no finiteness test (torch; CANN amp_update_scale.h:141).
    StoreBits(dt, scale_out, i, RuleProduct(rule, dt, scale, backoff, &finite));
    tracker_out[i] = 0;
    return;
  }
  const int32_t successful = WrappingIncrement(tracker_in[i]);
  if (static_cast<int64_t>(successful) == growth_interval) {
    const uint32_t grown = RuleProduct(rule, dt, scale, growth, &finite);
    StoreBits(dt, scale_out, i, finite ? grown : scale);
    tracker_out[i] = 0;
  } else {
    StoreBits(dt, scale_out, i, scale);
    tracker_out[i] = successful;
  }
}

// Attribute checks shared by every handler.  Returns nullptr when valid,
// otherwise a static message naming the attribute and its allowed range.
// Under Rule::kCann the factors are used as float32, so they must also be
// finite and nonzero once rounded to float32.
inline const char* CheckAttributes(double growth_factor, double backoff_factor,
                                   int64_t growth_interval, Rule rule = Rule::kTorch) {
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
  if (rule == Rule::kCann) {
    const uint32_t g = RoundToF32Bits(growth_factor), b = RoundToF32Bits(backoff_factor);
    if (g == 0 || !IsFiniteF32Bits(g)) {
      return "growth_factor must be finite and nonzero in float32 under rule 'cann'";
    }
    if (b == 0 || !IsFiniteF32Bits(b)) {
      return "backoff_factor must be finite and nonzero in float32 under rule 'cann'";
    }
  }
  return nullptr;
}

// Whether `f` is a power of two whose float32 rounding is a normal float32:
// then CANN's kernel plus the library's guard gives torch's bits (README,
// tests/test_rule_choice.py), so the Ascend operator can serve Rule::kTorch.
inline bool IsExactInFloat32PowerOfTwo(double f) {
  int e = 0;
  const double m = std::frexp(f, &e);  // f = m * 2^e, m in [0.5, 1)
  return m == 0.5 && e - 1 >= -126 && e - 1 <= 127;
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
  Rule rule;
};

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_UPDATE_SCALE_H_
