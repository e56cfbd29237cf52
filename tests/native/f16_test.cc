// The float16 unscale loop: x86's F16C path against the portable one.
//
// Every float16 pattern (NaN inputs with a NaN inverse scale excepted), for
// inverse scales that reach overflow, subnormal
// results, zero and NaN, in place and out of place with a ragged tail, under
// the handler's flush modes: same bits and same flag.  Then every float32
// pattern through vcvtps2ph against FloatToHalf.  Prints "ok" (or "skipped ok"
// on a CPU or target without F16C).
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "unscale_and_check.h"

#ifdef JAS_HAVE_F16C_PATH
// Every float32 pattern through vcvtps2ph against FloatToHalf; mismatches.
__attribute__((target("f16c"))) long CompareEveryFloat(long bad) {
  uint32_t u = 0;
  do {
    const float f = jas::F32FromBits(u);
    const uint16_t hw = static_cast<uint16_t>(
        _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (hw != jas::FloatToHalf(f) && bad++ < 20) {
      std::printf("float %08x: vcvtps2ph %04x FloatToHalf %04x\n", u, hw, jas::FloatToHalf(f));
    }
  } while (++u != 0);
  return bad;
}
#endif

int main() {
#ifndef JAS_HAVE_F16C_PATH
  std::printf("skipped ok\n");
  return 0;
#else
  if (!jas::HaveF16c()) {
    std::printf("skipped ok\n");
    return 0;
  }
  jas::ScopedFlushDenormals modes;
  const float invs[] = {1.0f,     0.5f,     0x1p-15f, 0x1p15f,  3.0f,
                        1.0f / 3, 0x1p-24f, 0x1p-30f, 65504.0f, 0x1p-140f,
                        0.0f,     -2.0f,    std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()};
  const int64_t n = 65536 + 5;  // a tail the vector loop leaves to the portable one
  std::vector<uint16_t> src(n), a(n), b(n), c(n);
  for (int64_t i = 0; i < n; ++i) src[i] = static_cast<uint16_t>(i);
  long bad = 0;
  for (float inv : invs) {
    for (int64_t skip = 0; skip < 2; ++skip) {  // the flag: with and without non-finite
      const int64_t m = skip ? 0x7c00 : n;  // below 0x7c00 every input is finite
      a = src;
      const bool fa = jas::UnscaleF16F16c(a.data(), a.data(), m, inv);  // in place
      const bool fb = jas::UnscaleF16Portable(src.data(), b.data(), m, inv);
      const bool fc = jas::UnscaleF16F16c(src.data(), c.data(), m, inv);  // out of place
      if (fa != fb || fc != fb) {
        std::printf("flag differs: inv %a, m %lld\n", inv, static_cast<long long>(m));
        ++bad;
      }
      {
        for (int64_t i = 0; i < m; ++i) {
          // NaN times NaN: which payload survives is the compiler's operand
          // order (multiplication commutes), in XLA's kernels too; not compared.
          if (inv != inv && (src[i] & 0x7fffu) > 0x7c00u) continue;
          if ((a[i] != b[i] || c[i] != b[i]) && bad++ < 10) {
            std::printf("inv %a x %04x: f16c %04x/%04x portable %04x\n", inv,
                        static_cast<unsigned>(src[i]), a[i], c[i], b[i]);
          }
        }
      }
    }
  }
  bad = CompareEveryFloat(bad);
  if (bad != 0) {
    std::printf("%ld mismatches\n", bad);
    return 1;
  }
  std::printf("ok\n");
  return 0;
#endif
}
