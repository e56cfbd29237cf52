// Standalone check of ffi/update_scale.h (and torch_rule.h, cann_rule.h,
// float_formats.h under it), built by tests/operators/update_scale/test_native_rule.py
// with -fsanitize=address,undefined (leak checking on: no Python around).
//
// For float32 scales, MulByFactor must equal the hardware's float(double(x)
// * g): the same rounding torch performs.  Exhaustive over special values and
// random over bit patterns and factors.
//
// For Rule::kCann: float16 widening and narrowing against the compiler's
// _Float16 conversions (IEEE, nearest even), and the float32 product against
// the hardware's float * float (CANN's kernel multiplies in float32:
// hicann/ops-math math/amp_update_scale/op_kernel/amp_update_scale.h:141,146).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "update_scale.h"

namespace {

int failures = 0;

void Expect(bool ok, const char* what, uint32_t x, double g, uint32_t got,
            uint32_t want) {
  if (ok) return;
  if (++failures <= 10) {
    std::printf("FAIL %s: x=0x%08x g=%.17g got=0x%08x want=0x%08x\n", what, x,
                g, got, want);
  }
}

uint32_t HardwareProduct(uint32_t xbits, double g) {
  const float x = jas::F32FromBits(xbits);
  const float r = static_cast<float>(static_cast<double>(x) * g);
  return jas::F32Bits(r);
}

bool SameFloat(uint32_t a, uint32_t b) {
  const bool a_nan = (a & 0x7FFFFFFFu) > 0x7F800000u;
  const bool b_nan = (b & 0x7FFFFFFFu) > 0x7F800000u;
  if (a_nan || b_nan) return a_nan && b_nan;
  return a == b;
}

void CheckF32(uint32_t x, double g) {
  const uint32_t got = jas::MulByFactor(jas::ScaleDtype::kF32, x, jas::SplitFactor(g));
  const uint32_t want = HardwareProduct(x, g);
  Expect(SameFloat(got, want), "f32 product", x, g, got, want);
}

void CheckRule() {
  // In-place update over a batch, with aliasing, wrap-around and priority.
  std::vector<float> scale = {1024.0f, 1024.0f, 1024.0f, 3.0e38f};
  std::vector<int32_t> tracker = {5, 1999, std::numeric_limits<int32_t>::max(), 1999};
  std::vector<float> found = {1.0f, 0.0f, 0.0f, 0.0f};
  const jas::Factor grow = jas::SplitFactor(2.0), back = jas::SplitFactor(0.5);
  for (int64_t i = 0; i < 4; ++i) {
    jas::UpdateElement(jas::ScaleDtype::kF32, scale.data(), tracker.data(),
                       found.data(), scale.data(), tracker.data(), i, grow,
                       back, 2000);
  }
  Expect(scale[0] == 512.0f && tracker[0] == 0, "backoff", 0, 0.5, 0, 0);
  Expect(scale[1] == 2048.0f && tracker[1] == 0, "growth", 1, 2.0, 0, 0);
  Expect(scale[2] == 1024.0f && tracker[2] == std::numeric_limits<int32_t>::min(),
         "wrap", 2, 2.0, 0, 0);
  Expect(scale[3] == 3.0e38f && tracker[3] == 0, "overflow guard", 3, 2.0, 0, 0);

  // float16: 40000 * 2 overflows half, growth refused; found as -0.0 is not found.
  uint16_t h_scale = 0x78E2;  // 40000 in binary16
  int32_t h_tracker = 1999;
  uint16_t h_found = 0x8000;  // -0.0
  jas::UpdateElement(jas::ScaleDtype::kF16, &h_scale, &h_tracker, &h_found,
                     &h_scale, &h_tracker, 0, grow, back, 2000);
  Expect(h_scale == 0x78E2 && h_tracker == 0, "f16 overflow guard", h_scale, 2.0, 0, 0);
  Expect(jas::CheckAttributes(2.0, 0.5, 0) != nullptr, "interval 0 rejected", 0, 0, 0, 0);
  Expect(jas::CheckAttributes(2.0, -1.0, 5) != nullptr, "negative factor", 0, 0, 0, 0);
  Expect(jas::CheckAttributes(2.0, 0.5, 2147483647) == nullptr, "max interval", 0, 0, 0, 0);
}

uint16_t HalfBits(_Float16 h) {
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

void CheckCann() {
  // Every float16 widens exactly to the float32 the hardware gives.
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 x;
    const uint16_t hb = static_cast<uint16_t>(h);
    std::memcpy(&x, &hb, 2);
    const uint32_t want = jas::F32Bits(static_cast<float>(x));
    const uint32_t got = jas::WidenToF32Bits(jas::ScaleDtype::kF16, h);
    Expect(SameFloat(got, want), "f16 widen", h, 0, got, want);
  }
  // float32 -> float16 and -> bfloat16 (nearest even) over a stride of patterns.
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4093) {
    const uint32_t b = static_cast<uint32_t>(u);
    const float f = jas::F32FromBits(b);
    const uint32_t want = HalfBits(static_cast<_Float16>(f));
    const uint32_t got = jas::NarrowF32Bits(jas::ScaleDtype::kF16, b);
    const bool nan = (b & 0x7FFFFFFFu) > 0x7F800000u;
    // A NaN keeps its sign and top payload bits, made quiet (in both formats,
    // as reference/cann_rule.py's narrow_f32_bits).
    const uint32_t f16_nan = ((b >> 16) & 0x8000u) | 0x7E00u | ((b >> 13) & 0x3FFu);
    Expect(got == (nan ? f16_nan : want), "f16 narrow", b, 0, got, want);
    // bfloat16 by the textbook rounding of the top half.
    const uint32_t bf_want = nan ? ((b >> 16) | 0x40u) : ((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
    const uint32_t bf_got = jas::NarrowF32Bits(jas::ScaleDtype::kBF16, b);
    Expect(bf_got == bf_want, "bf16 narrow", b, 0, bf_got, bf_want);
  }
  // float32 products: the hardware's float * float.
  std::mt19937_64 rng(777);
  const double gs[] = {1.1, 0.3, 2.0, 0.5, 65536.0, 1e-3, 1.0000001};
  for (int i = 0; i < 300000; ++i) {
    const uint32_t x = static_cast<uint32_t>(rng());
    const double g = gs[i % 7];
    bool finite = false;
    const uint32_t got = jas::RuleProduct(jas::Rule::kCann, jas::ScaleDtype::kF32, x,
                                          jas::CannFactor(g), &finite);
    const uint32_t want =
        jas::F32Bits(jas::F32FromBits(x) * static_cast<float>(g));
    Expect(SameFloat(got, want), "cann f32 product", x, g, got, want);
  }
  // The guard: float16 32768 grown x2 stays 32768 (the kernel would store inf).
  uint16_t h_scale = 0x7800;  // 32768
  int32_t h_tracker = 0;
  uint16_t h_found = 0;
  jas::UpdateElement(jas::ScaleDtype::kF16, &h_scale, &h_tracker, &h_found, &h_scale,
                     &h_tracker, 0, jas::CannFactor(2.0), jas::CannFactor(0.5), 1,
                     jas::Rule::kCann);
  Expect(h_scale == 0x7800 && h_tracker == 0, "cann f16 guard", h_scale, 2.0, 0, 0);
  Expect(jas::CheckAttributes(1e39, 0.5, 5, jas::Rule::kCann) != nullptr,
         "cann: growth factor inf in float32", 0, 0, 0, 0);
  Expect(jas::CheckAttributes(1e39, 0.5, 5, jas::Rule::kTorch) == nullptr,
         "torch: growth factor 1e39 fine", 0, 0, 0, 0);
  Expect(jas::IsExactInFloat32PowerOfTwo(0.5) && !jas::IsExactInFloat32PowerOfTwo(0.3) &&
             !jas::IsExactInFloat32PowerOfTwo(std::ldexp(1.0, -127)),
         "power of two in float32", 0, 0, 0, 0);
}

}  // namespace

int main() {
  const double factors[] = {2.0, 0.5, 1.5, 0.25, 1.1, 0.3, 1e-3, 1e10, 3.0,
                            1.0000001, 4.9e-324, 1e300, 0.999999999};
  const uint32_t specials[] = {0u, 0x80000000u, 1u, 0x80000001u, 0x007FFFFFu,
                               0x00800000u, 0x7F7FFFFFu, 0x7F800000u,
                               0xFF800000u, 0x7FC00000u, 0x7F800001u,
                               0x3F800000u, 0x47800000u, 0x00400000u};
  for (double g : factors)
    for (uint32_t x : specials) CheckF32(x, g);

  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> logf(-40.0, 40.0);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t x = static_cast<uint32_t>(rng());
    const double g = (i % 3 == 0) ? std::exp2(std::floor(logf(rng)))
                                  : std::exp(logf(rng) * 0.5);
    CheckF32(x, g);
  }
  // Subnormal scales against factors that move them across the boundary.
  for (uint32_t x = 1; x < 0x00900000u; x += 7919) {
    CheckF32(x, 3.0);
    CheckF32(x, 0.7);
    CheckF32(x | 0x80000000u, 1.3);
  }
  CheckRule();
  CheckCann();
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
