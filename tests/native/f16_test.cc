// The unscale loops: x86's F16C (float16) and AVX2 (float32, bfloat16)
// paths against the portable ones.
//
// Every float16 and every bfloat16 pattern (NaN inputs with a NaN inverse
// scale excepted), for inverse scales that reach overflow, subnormal
// results, zero and NaN, in place and out of place with a ragged tail, under
// the handler's flush modes: same bits and same flag.  Then every float32
// pattern through vcvtps2ph against FloatToHalf, a sweep of float32 patterns
// through FloatToBFloat16 against the rule as written, and the flag from
// each part of the loops.  Prints "ok" (or "skipped ok" on a CPU or target
// without F16C).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "unscale_and_check.h"

// Each loop runs with the amax (kAmax) and without it: the same bits and
// flag both ways (the handler of the v1 target takes the loop without), and
// the amax equal to a plain scalar pass over the input (the largest finite
// magnitude, by its bits).  Mismatches count in g_amax_bad.
static long g_amax_bad = 0;

template <typename U, typename T, typename Mag>
uint64_t ScalarAmax(const T* in, int64_t n, Mag mag) {
  uint64_t top = 0;
  for (int64_t i = 0; i < n; ++i) {
    U u;
    std::memcpy(&u, in + i, sizeof(u));
    const uint64_t m = mag(u);
    top = m > top ? m : top;
  }
  return top;
}

template <typename U, typename T, typename Mag, typename WithAmax, typename Without>
bool Both(const T* in, T* out, int64_t n, Mag mag, WithAmax with_amax, Without without) {
  const std::vector<T> input(in, in + n);  // `out` may be `in`
  std::vector<T> plain(static_cast<size_t>(n));
  const bool plain_flag = without(input.data(), plain.data(), n);
  uint64_t got = 0;
  const bool flag = with_amax(in, out, n, &got);
  const uint64_t want = ScalarAmax<U>(input.data(), n, mag);
  if (got != want && g_amax_bad++ < 10) {
    std::printf("amax %llx, scalar pass %llx (n %lld)\n", static_cast<unsigned long long>(got),
                static_cast<unsigned long long>(want), static_cast<long long>(n));
  }
  bool same = plain_flag == flag;
  for (int64_t i = 0; i < n && same; ++i) {
    same = std::memcmp(&plain[i], &out[i], sizeof(T)) == 0 || input[i] != input[i] ||
           out[i] != out[i];
  }
  if (!same && g_amax_bad++ < 10) std::printf("with and without the amax differ (n %lld)\n",
                                              static_cast<long long>(n));
  return flag;
}

#define JAS_BOTH(NAME, FN, U, T, MAG)                                                     \
  bool NAME(const T* in, T* out, int64_t n, float inv, float post) {                     \
    return Both<U>(                                                                       \
        in, out, n, MAG{},                                                                \
        [&](const T* i, T* o, int64_t m, uint64_t* a) { return FN<true>(i, o, m, inv, post, a); }, \
        [&](const T* i, T* o, int64_t m) { return FN<false>(i, o, m, inv, post, nullptr); }); \
  }

JAS_BOTH(F16Portable, jas::UnscaleF16Portable, uint16_t, uint16_t, jas::F16Magnitude)
JAS_BOTH(BF16Portable, jas::UnscaleBF16Portable, uint16_t, uint16_t, jas::BF16Magnitude)
JAS_BOTH(F32Portable, jas::UnscaleF32Portable, uint32_t, float, jas::F32Magnitude)
#ifdef JAS_HAVE_F16C_PATH
JAS_BOTH(F16c, jas::UnscaleF16F16c, uint16_t, uint16_t, jas::F16Magnitude)
JAS_BOTH(BF16Avx2, jas::UnscaleBF16Avx2, uint16_t, uint16_t, jas::BF16Magnitude)
JAS_BOTH(F32Avx2, jas::UnscaleF32Avx2, uint32_t, float, jas::F32Magnitude)
#endif

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
      const bool fa = F16c(a.data(), a.data(), m, inv, 1.0f);  // in place
      const bool fb = F16Portable(src.data(), b.data(), m, inv, 1.0f);
      const bool fc = F16c(src.data(), c.data(), m, inv, 1.0f);  // out of place
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
  // Every tail length (1-31 elements after the last whole line, which the
  // loop converts on a padded copy): every pattern lands in a tail, in
  // place and out of place, against the portable loop; bits and flags.
  for (float inv : {0.5f, 0x1p-24f, 65504.0f, 0.0f}) {
    for (int64_t r = 1; r < 32; ++r) {
      const int64_t seg = 32 + r;
      for (int64_t at = 0; at + seg <= n; at += seg) {
        uint16_t in_place[64], out[64], want[64];
        std::memcpy(in_place, src.data() + at, seg * sizeof(uint16_t));
        const bool fa = F16c(in_place, in_place, seg, inv, 1.0f);
        const bool fc = F16c(src.data() + at, out, seg, inv, 1.0f);
        const bool fb = F16Portable(src.data() + at, want, seg, inv, 1.0f);
        if ((fa != fb || fc != fb || std::memcmp(in_place, want, seg * sizeof(uint16_t)) != 0 ||
             std::memcmp(out, want, seg * sizeof(uint16_t)) != 0) &&
            bad++ < 60) {
          std::printf("f16 tail of %lld at %lld, inv %a: differs\n", static_cast<long long>(r),
                      static_cast<long long>(at), inv);
        }
      }
    }
  }
  bad = CompareEveryFloat(bad);
  // bfloat16: the AVX2 loop against the portable one on every pattern, in
  // place and out of place, with a tail.
  if (jas::HaveAvx2()) {
    for (float inv : invs) {
      a = src;
      const bool fa = BF16Avx2(a.data(), a.data(), n, inv, 1.0f);
      const bool fb = BF16Portable(src.data(), b.data(), n, inv, 1.0f);
      const bool fc = BF16Avx2(src.data(), c.data(), n, inv, 1.0f);
      if (fa != fb || fc != fb) {
        std::printf("bf16 flag differs: inv %a\n", inv);
        ++bad;
      }
      for (int64_t i = 0; i < n; ++i) {
        if (inv != inv && (src[i] & 0x7fffu) > 0x7f80u) continue;  // NaN * NaN
        if ((a[i] != b[i] || c[i] != b[i]) && bad++ < 40) {
          std::printf("bf16 inv %a x %04x: avx2 %04x/%04x portable %04x\n", inv,
                      static_cast<unsigned>(src[i]), a[i], c[i], b[i]);
        }
      }
    }
    // The portable conversion (which the vector loop mirrors) against a
    // plain reading of the rule: round half to even on the low 16 bits, NaN
    // to the canonical quiet NaN with its sign.
    for (uint64_t v = 0; v <= 0xffffffffu; v += 251) {
      const uint32_t u = static_cast<uint32_t>(v);
      const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
      uint32_t want = (u >> 16) + (((u & 0xffffu) > 0x8000u) ||
                                   ((u & 0xffffu) == 0x8000u && ((u >> 16) & 1u)));
      if (is_nan) want = ((u >> 16) & 0x8000u) | 0x7fc0u;
      if (jas::FloatToBFloat16(jas::F32FromBits(u), jas::BF16Nan::kCanonical) != static_cast<uint16_t>(want) &&
          bad++ < 50) {
        std::printf("FloatToBFloat16(%08x) = %04x, want %04x\n", u,
                    jas::FloatToBFloat16(jas::F32FromBits(u), jas::BF16Nan::kCanonical), want);
      }
    }
  }
  // The flag from each part of the loops: the prefetching lines, the last
  // lines (prefetch would pass the end), the portable tail.
  {
    const int64_t len = 4096 + 40 + 3;
    for (int64_t pos : {int64_t{-1}, int64_t{0}, int64_t{2000}, len - 45, len - 40, len - 1}) {
      std::vector<uint16_t> h(len, 0x3c00);  // 1.0
      std::vector<float> f(len, 1.0f);
      if (pos >= 0) {
        h[pos] = 0x7c00;  // inf
        f[pos] = std::numeric_limits<float>::infinity();
      }
      const bool want = pos >= 0;
      if (F16c(h.data(), h.data(), len, 0.5f, 1.0f) != want) {
        std::printf("f16 flag wrong with inf at %lld\n", static_cast<long long>(pos));
        ++bad;
      }
      std::vector<uint16_t> bf(len, 0x3f80);  // 1.0
      if (pos >= 0) bf[pos] = 0x7f80;            // inf
      if (jas::HaveAvx2() && BF16Avx2(bf.data(), bf.data(), len, 0.5f, 1.0f) != want) {
        std::printf("bf16 flag wrong with inf at %lld\n", static_cast<long long>(pos));
        ++bad;
      }
      if (jas::HaveAvx2() && bf[len / 2] != 0x3f00) ++bad;
      if (jas::HaveAvx2() && F32Avx2(f.data(), f.data(), len, 0.5f, 1.0f) != want) {
        std::printf("f32 flag wrong with inf at %lld\n", static_cast<long long>(pos));
        ++bad;
      }
      if (h[len / 2] != 0x3800 || f[len / 2] != 0.5f) ++bad;  // and unscaled
    }
  }
  // float32: the AVX2 loop against the portable one, on a sweep of patterns
  // (every exponent, edge and strided significands, both signs) with a tail.
  if (jas::HaveAvx2()) {
    std::vector<float> x;
    for (uint32_t e = 0; e < 256; ++e) {
      for (uint32_t m = 0; m < (1u << 23); m += 4099u) {
        x.push_back(jas::F32FromBits((e << 23) | m));
        x.push_back(jas::F32FromBits(0x80000000u | (e << 23) | m | 1u));
      }
    }
    x.push_back(1.0f);  // an odd count: a tail for the portable loop
    std::vector<float> p(x.size()), q(x.size());
    for (float inv : invs) {
      p = x;
      const bool fa = F32Avx2(p.data(), p.data(), p.size(), inv, 1.0f);
      const bool fb = F32Portable(x.data(), q.data(), q.size(), inv, 1.0f);
      if (fa != fb) ++bad;
      for (size_t i = 0; i < x.size(); ++i) {
        const uint32_t xa = jas::F32Bits(x[i]);
        if (inv != inv && (xa & 0x7fffffffu) > 0x7f800000u) continue;  // NaN * NaN
        if (jas::F32Bits(p[i]) != jas::F32Bits(q[i]) && bad++ < 30) {
          std::printf("f32 inv %a x %08x: avx2 %08x portable %08x\n", inv, xa,
                      jas::F32Bits(p[i]), jas::F32Bits(q[i]));
        }
      }
    }
    // Subnormal inverses (scales above 2**126) split into (m, post): the
    // two-multiply loops agree too.
    for (uint32_t inv_bits : {0x00000001u, 0x00123457u, 0x00400000u, 0x807fffffu}) {
      const jas::InverseFactors f = jas::SplitInverse(jas::F32FromBits(inv_bits));
      p = x;
      const bool fa = F32Avx2(p.data(), p.data(), p.size(), f.m, f.post);
      const bool fb = F32Portable(x.data(), q.data(), q.size(), f.m, f.post);
      if (fa != fb) ++bad;
      for (size_t i = 0; i < x.size(); ++i) {
        if (jas::F32Bits(p[i]) != jas::F32Bits(q[i]) && bad++ < 30) {
          std::printf("f32 inv %08x x %08x: avx2 %08x portable %08x\n", inv_bits,
                      jas::F32Bits(x[i]), jas::F32Bits(p[i]), jas::F32Bits(q[i]));
        }
      }
    }
  }
  // SplitInverse over every subnormal pattern: m normal, m * post == inv
  // exactly (compared in double, inv's value built from its bits: the flush
  // modes would read the subnormal itself as 0), normal inverses unchanged.
  for (uint32_t mant = 1; mant < (1u << 23); ++mant) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const jas::InverseFactors f = jas::SplitInverse(jas::F32FromBits(sign | mant));
      const double want = (sign ? -1.0 : 1.0) * std::ldexp(static_cast<double>(mant), -149);
      const bool normal = (jas::F32Bits(f.m) & 0x7f800000u) != 0;
      if ((!normal || static_cast<double>(f.m) * static_cast<double>(f.post) != want) &&
          bad++ < 40) {
        std::printf("SplitInverse %08x: m %08x post %a\n", sign | mant, jas::F32Bits(f.m),
                    static_cast<double>(f.post));
      }
    }
  }
  for (float inv : invs) {
    const jas::InverseFactors f = jas::SplitInverse(inv);
    if ((jas::F32Bits(f.m) != jas::F32Bits(inv) || f.post != 1.0f) &&
        (jas::F32Bits(inv) & 0x7f800000u) != 0 && bad++ < 40) {
      std::printf("SplitInverse changed the normal inverse %a\n", static_cast<double>(inv));
    }
  }
  bad += g_amax_bad;
  if (bad != 0) {
    std::printf("%ld mismatches\n", bad);
    return 1;
  }
  std::printf("ok\n");
  return 0;
#endif
}
