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
// jax_amp_scale/_reference.py): the scale is widened to float32, multiplied
// by float32(factor) with one float32 rounding, then narrowed to the storage
// dtype with round-to-nearest-even.  This header has no XLA or CUDA
// dependency so that CPU, CUDA and test code can all include it.
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

// IEEE binary16 -> binary32, exact (NaN payloads kept, quiet bit set, as
// the x86 F16C and CUDA conversions do).
JAS_HD inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) {  // inf or NaN
    uint32_t bits = sign | 0x7F800000u | (mant << 13);
    if (mant != 0) bits |= 0x00400000u;
    return BitsToFloat(bits);
  }
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    // Subnormal half: value = mant * 2^-24, exactly representable in f32.
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3FFu;
    const uint32_t f_exp = static_cast<uint32_t>(127 - 15 - e);
    return BitsToFloat(sign | (f_exp << 23) | (mant << 13));
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// binary32 -> binary16, round to nearest even; NaN stays NaN (quiet, top
// payload bits kept), overflow goes to inf.
JAS_HD inline uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t exp = (u >> 23) & 0xFFu;
  const uint32_t mant = u & 0x7FFFFFu;
  if (exp == 0xFFu) {
    if (mant == 0) return static_cast<uint16_t>(sign | 0x7C00u);
    return static_cast<uint16_t>(sign | 0x7E00u | (mant >> 13));
  }
  const int32_t e = static_cast<int32_t>(exp) - 127 + 15;
  if (e >= 0x1F) return static_cast<uint16_t>(sign | 0x7C00u);
  if (e <= 0) {
    // Result is subnormal in half (or zero).  Shift the full significand
    // (with implicit bit) right and round to nearest even.
    if (e < -10) return sign;  // below half the smallest subnormal
    const uint32_t full = mant | 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - e);  // 14..24
    uint32_t half_mant = full >> shift;
    const uint32_t rem = full & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t out = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (out & 1u))) ++out;  // may carry to inf
  return static_cast<uint16_t>(sign | out);
}

JAS_HD inline float Bf16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

JAS_HD inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  }
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

JAS_HD inline float LoadScale(ScaleDtype dt, const void* base, int64_t i) {
  switch (dt) {
    case ScaleDtype::kF32:
      return static_cast<const float*>(base)[i];
    case ScaleDtype::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(base)[i]);
    case ScaleDtype::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
  }
  return 0.0f;
}

JAS_HD inline void StoreScale(ScaleDtype dt, void* base, int64_t i, float v) {
  switch (dt) {
    case ScaleDtype::kF32:
      static_cast<float*>(base)[i] = v;
      return;
    case ScaleDtype::kF16:
      static_cast<uint16_t*>(base)[i] = FloatToHalf(v);
      return;
    case ScaleDtype::kBF16:
      static_cast<uint16_t*>(base)[i] = FloatToBf16(v);
      return;
  }
}

JAS_HD inline void CopyScale(ScaleDtype dt, const void* in, void* out,
                             int64_t i) {
  if (dt == ScaleDtype::kF32) {
    static_cast<float*>(out)[i] = static_cast<const float*>(in)[i];
  } else {
    static_cast<uint16_t*>(out)[i] = static_cast<const uint16_t*>(in)[i];
  }
}

// A value of the scale dtype counts as "found" when it is nonzero or NaN.
JAS_HD inline bool IsFound(float v) { return !(v == 0.0f); }

// Whether `v`, once rounded to the storage dtype, is finite.
JAS_HD inline bool NarrowsToFinite(ScaleDtype dt, float v) {
  switch (dt) {
    case ScaleDtype::kF32:
      return (FloatBits(v) & 0x7F800000u) != 0x7F800000u;
    case ScaleDtype::kF16:
      return (FloatToHalf(v) & 0x7C00u) != 0x7C00u;
    case ScaleDtype::kBF16:
      return (FloatToBf16(v) & 0x7F80u) != 0x7F80u;
  }
  return false;
}

// int32 increment that wraps INT32_MAX to INT32_MIN without signed overflow.
JAS_HD inline int32_t WrappingIncrement(int32_t t) {
  return t == std::numeric_limits<int32_t>::max()
             ? std::numeric_limits<int32_t>::min()
             : t + 1;
}

// One element of the update.  `scale_out` may alias `scale_in` and
// `tracker_out` may alias `tracker_in` (in-place update).
JAS_HD inline void UpdateElement(ScaleDtype dt, const void* scale_in,
                                 const int32_t* tracker_in,
                                 const void* found_inf, void* scale_out,
                                 int32_t* tracker_out, int64_t i,
                                 float growth_factor, float backoff_factor,
                                 int64_t growth_interval) {
  const float scale = LoadScale(dt, scale_in, i);
  if (IsFound(LoadScale(dt, found_inf, i))) {
    StoreScale(dt, scale_out, i, scale * backoff_factor);
    tracker_out[i] = 0;
    return;
  }
  const int32_t successful = WrappingIncrement(tracker_in[i]);
  if (static_cast<int64_t>(successful) == growth_interval) {
    // Growth is refused when the value, rounded to the storage dtype, is
    // inf/NaN.  Decide before writing: scale_out may alias scale_in.
    const float grown = scale * growth_factor;
    if (NarrowsToFinite(dt, grown)) {
      StoreScale(dt, scale_out, i, grown);
    } else {
      CopyScale(dt, scale_in, scale_out, i);
    }
    tracker_out[i] = 0;
  } else {
    CopyScale(dt, scale_in, scale_out, i);
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

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_UPDATE_SCALE_H_
