// CANN's `scale * factor` (aclnnAmpUpdateScale, Rule::kCann), as hicann/
// ops-math math/amp_update_scale/ publishes it: the factors are float32
// (op_host/amp_update_scale_tiling.cpp:63-71), the scale is widened to
// float32 (op_kernel/amp_update_scale.h:115-134), multiplied in float32
// (:141, :146), growth is refused when the float32 product is not finite
// (:86-93, :147), and the result is cast to the scale's dtype at the store
// (:162-172; bfloat16 by CAST_RINT, float16 assumed nearest even).  The
// library adds one guard the kernel lacks: growth is also refused when the
// value stored in the scale's dtype is infinite (a float16 32768 grown x2
// stays 32768 instead of the kernel's inf).
//
// Built from float_formats.h (widen, narrow) and torch_rule.h (the product
// of two 24-bit significands fits float64, so torch's rounding rounds once,
// to float32).  The pure-JAX reference is jax_amp_scale/mechanisms/
// floats.py, cann_product (docs/rule-in-code.md).
#ifndef JAX_AMP_SCALE_FFI_CANN_RULE_H_
#define JAX_AMP_SCALE_FFI_CANN_RULE_H_

#include <cmath>
#include <cstdint>

#include "float_formats.h"
#include "torch_rule.h"

namespace jas {

// A double rounded to float32 (nearest even, gradual underflow), as bits:
// 1.0f * f rounded as MulByFactor rounds, in integer ops.
JAS_HD inline uint32_t RoundToF32Bits(double f) {
  return MulByFactor(ScaleDtype::kF32, 0x3F800000u, SplitFactor(f));
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

// The factor as CANN's kernel holds it: the API's double rounded to float32.
JAS_HD inline Factor CannFactor(double f) { return SplitF32Factor(RoundToF32Bits(f)); }

// scale * factor (factor from CannFactor) in format `dt`.  `*finite` says
// whether growth may keep it: the float32 product is finite (the kernel's
// test) and so is the stored value (the library's guard).
JAS_HD inline uint32_t CannProduct(ScaleDtype dt, uint32_t bits, Factor f, bool* finite) {
  const uint32_t p32 = MulByFactor(ScaleDtype::kF32, WidenToF32Bits(dt, bits), f);
  const uint32_t out = NarrowF32Bits(dt, p32);
  *finite = IsFiniteBits(ScaleDtype::kF32, p32) && IsFiniteBits(dt, out);
  return out;
}

// A factor CANN's kernel can use: finite and nonzero once rounded to float32.
inline bool IsCannFactor(double f) {
  const uint32_t bits = RoundToF32Bits(f);
  return bits != 0 && IsFiniteBits(ScaleDtype::kF32, bits);
}

// Whether `f` is a power of two whose float32 rounding is a normal float32:
// then CANN's kernel plus the library's guard gives torch's bits (README,
// tests/operators/update_scale/test_rule_choice.py), so the Ascend operator can serve Rule::kTorch.
// The reference's twin is operators/update_scale.py's exact_on_cann.
inline bool IsExactInFloat32PowerOfTwo(double f) {
  int e = 0;
  const double m = std::frexp(f, &e);  // f = m * 2^e, m in [0.5, 1)
  return m == 0.5 && e - 1 >= -126 && e - 1 <= 127;
}

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_CANN_RULE_H_
