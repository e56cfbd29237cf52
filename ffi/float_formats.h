// The floating-point storage formats the handlers read and write (float32,
// float16, bfloat16): bit casts, the format table, and the conversions
// between float16/bfloat16 and float32, written once for the update rule
// (update_scale.h, cann_rule.h) and the gradient pass (unscale_and_check.h).
//
// Every conversion gives the same bits whatever the thread's flush modes
// (XLA:CPU sets denormals-are-zero and flush-to-zero) and on CUDA devices:
// integer arithmetic, plus two float operations whose operands and results
// are always normal numbers (said where they are).  They are branch-free
// (every case computed, one selected) so that the gradient pass's loops
// vectorise.  The hardware conversions are not available on every target
// and their NaN handling differs between instruction sets.
//
// No XLA or CUDA dependency: CPU, CUDA and the native tests include it.
#ifndef JAX_AMP_SCALE_FFI_FLOAT_FORMATS_H_
#define JAX_AMP_SCALE_FFI_FLOAT_FORMATS_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define JAS_HD __host__ __device__
#else
#define JAS_HD
#endif

namespace jas {

// Bit casts through memcpy: the only portable, UB-free way in C++17.
JAS_HD inline uint32_t F32Bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}
JAS_HD inline float F32FromBits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// cond ? a : b as bit arithmetic: a select the vectoriser cannot turn back
// into a branch (GCC leaves `?:` over float arithmetic as control flow).
JAS_HD inline uint32_t Select(bool cond, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

// Bit length of a value (position of the highest set bit + 1; 0 for 0).
JAS_HD inline int BitLength(uint32_t v) {
  int n = 0;
  while (v != 0) {
    v >>= 1;
    ++n;
  }
  return n;
}

// The dtypes a loss scale may have.
enum class ScaleDtype { kF32, kF16, kBF16 };

// A storage format.  p = significand bits (with the implicit one), bias =
// exponent bias (the smallest normal exponent is 1 - bias).
struct Format {
  int p;
  int bias;
  uint32_t sign_bit;
  uint32_t inf_bits;   // +inf
  uint32_t quiet_bit;  // top significand bit (quiet NaN)
};

JAS_HD inline Format FormatOf(ScaleDtype dt) {
  switch (dt) {
    case ScaleDtype::kF16:
      return Format{11, 15, 0x8000u, 0x7C00u, 0x0200u};
    case ScaleDtype::kBF16:
      return Format{8, 127, 0x8000u, 0x7F80u, 0x0040u};
    case ScaleDtype::kF32:
    default:
      return Format{24, 127, 0x80000000u, 0x7F800000u, 0x00400000u};
  }
}

// Whether `bits` (a value of format `dt`) are neither inf nor NaN.
JAS_HD inline bool IsFiniteBits(ScaleDtype dt, uint32_t bits) {
  const Format fm = FormatOf(dt);
  return (bits & fm.inf_bits) != fm.inf_bits;
}

// Element i of an array of format `dt`, as bits.
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

// float16 -> float32, exact (float16 subnormals become float32 normals); NaN
// keeps its sign and payload.  A subnormal's value mant * 2^-24 is computed
// in float32, where it is a normal number (or zero), so it is exact and no
// flush mode touches it.
JAS_HD inline float HalfToFloat(uint16_t h) {
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
// A subnormal result is rounded by a float32 addition of 0.5, whose ulp is
// 2^-24, the float16 subnormal step: round to nearest even in hardware, and
// the sum is a normal number, so flush-to-zero cannot touch it (a float32
// subnormal input is read as zero under denormals-are-zero, and rounds to
// zero either way).
JAS_HD inline uint16_t FloatToHalf(float f) {
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

JAS_HD inline float BFloat16ToFloat(uint16_t b) {
  return F32FromBits(static_cast<uint32_t>(b) << 16);
}

// What a float32 NaN becomes in bfloat16.  The update rule keeps its top
// payload bits (as float16 does; the reference, mechanisms/floats.py, does
// the same); XLA:CPU's conversion, which the gradient pass matches, gives
// the canonical quiet NaN.  Either way the sign stays and the NaN is quiet.
enum class BF16Nan { kKeepPayload, kCanonical };

// float32 -> bfloat16: round to nearest even (gradual underflow and
// overflow to inf come with the integer rounding: bfloat16 has float32's
// exponent range).
JAS_HD inline uint16_t FloatToBFloat16(float f, BF16Nan nan) {
  const uint32_t u = F32Bits(f);
  const uint32_t payload = nan == BF16Nan::kKeepPayload ? (u >> 16) & 0x7fu : 0u;
  const uint32_t quiet = ((u >> 16) & 0x8000u) | 0x7fc0u | payload;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(Select((u & 0x7fffffffu) > 0x7f800000u, quiet, rounded));
}

// Bits of a value of format `dt` widened (exactly) to float32 bits.
JAS_HD inline uint32_t WidenToF32Bits(ScaleDtype dt, uint32_t bits) {
  switch (dt) {
    case ScaleDtype::kF16:
      return F32Bits(HalfToFloat(static_cast<uint16_t>(bits)));
    case ScaleDtype::kBF16:
      return bits << 16;
    case ScaleDtype::kF32:
    default:
      return bits;
  }
}

// float32 bits rounded to format `dt` (nearest even, overflow to inf,
// gradual underflow, NaN payload kept).
JAS_HD inline uint32_t NarrowF32Bits(ScaleDtype dt, uint32_t bits) {
  switch (dt) {
    case ScaleDtype::kF16:
      return FloatToHalf(F32FromBits(bits));
    case ScaleDtype::kBF16:
      return FloatToBFloat16(F32FromBits(bits), BF16Nan::kKeepPayload);
    case ScaleDtype::kF32:
    default:
      return bits;
  }
}

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_FLOAT_FORMATS_H_
