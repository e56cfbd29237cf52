// torch's `scale * factor` (torch._amp_update_scale_, Rule::kTorch): the
// exact product is rounded to float64 (torch multiplies a float by a
// double), then to the scale's format.  Written once: the CANN rule
// (cann_rule.h) rounds its float32 product and its float32 factors with it.
//
// Integer arithmetic only, so flush-to-zero modes (XLA:CPU sets them) and
// FMA contraction cannot change a bit.  The pure-JAX reference is
// jax_amp_scale/mechanisms/floats.py (torch_product) (docs/rule-in-code.md).
#ifndef JAX_AMP_SCALE_FFI_TORCH_RULE_H_
#define JAX_AMP_SCALE_FFI_TORCH_RULE_H_

#include <cstdint>
#include <cstring>

#include "float_formats.h"

namespace jas {

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

// Rounds `v` to nearest even after dropping its low `k` bits (k >= 1):
// returns v with those bits cleared, plus 2^k when rounding up.
JAS_HD inline unsigned __int128 RoundDroppingBits(unsigned __int128 v, int k) {
  const unsigned __int128 one = 1;
  const unsigned __int128 low = v & ((one << k) - 1);
  const unsigned __int128 half = one << (k - 1);
  const bool up = low > half || (low == half && ((v >> k) & 1) != 0);
  return v - low + (up ? one << k : 0);
}

// scale * factor, rounded as torch rounds it: the exact product is first
// rounded to float64, then to the scale's format (round to nearest even,
// overflow to inf, gradual underflow).  `bits` holds a value of format `dt`.
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
  // Round to float64's 53 bits.
  const unsigned __int128 p1 = RoundDroppingBits(prod, top - 52);
  if ((p1 >> (top + 1)) != 0) ++top;
  // value = 1.f * 2^exp
  const int exp = ex + g.exponent + (top - 75);
  const int emin = 1 - fm.bias;
  if (exp > fm.bias) return sign | fm.inf_bits;
  // Round to the target format, keeping p bits (fewer when subnormal).
  const int shift = top - q + (exp < emin ? emin - exp : 0);
  if (shift > top + 1) return sign;  // below half the smallest subnormal
  const uint32_t kept = static_cast<uint32_t>(RoundDroppingBits(p1, shift) >> shift);
  const int biased = (exp < emin ? emin : exp) + fm.bias - 1;
  uint32_t out = (static_cast<uint32_t>(biased) << q) + kept;  // carries fold in
  if (out > fm.inf_bits) out = fm.inf_bits;
  return sign | out;
}

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_TORCH_RULE_H_
