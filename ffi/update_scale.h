// The dynamic loss-scale update rule, written once for every handler.
//
//   if found_inf != 0 (NaN counts):  scale *= backoff_factor; tracker = 0
//   elif tracker + 1 == interval:    grown = scale * growth_factor
//                                    scale = grown if finite(grown) else scale
//                                    tracker = 0
//   else:                            tracker += 1 (int32, wrapping)
//
// Two published kernels define `scale * factor`, and a state names the one it
// follows (Rule, the FFI attribute "rule"): torch's (torch_rule.h) and
// CANN's (cann_rule.h).  Every step is integer arithmetic or exact (see
// float_formats.h), so XLA:CPU's flush-to-zero and FMA contraction cannot
// change a bit, and the pure-JAX reference (jax_amp_scale/operators/
// update_scale.py) gives the same bits: docs/rule-in-code.md says which
// places change together.  No XLA or CUDA dependency, so that CPU, CUDA and
// test code can all include it.
#ifndef JAX_AMP_SCALE_FFI_UPDATE_SCALE_H_
#define JAX_AMP_SCALE_FFI_UPDATE_SCALE_H_

#include <cmath>
#include <cstdint>
#include <limits>

#include "cann_rule.h"
#include "float_formats.h"
#include "torch_rule.h"

namespace jas {

// Which published kernel's arithmetic a state follows (see the top).
enum class Rule { kTorch, kCann };

// scale * factor under `rule` (factor from FactorFor), in format `dt`.
// `*finite` says whether growth may keep it (cann_rule.h for kCann; for
// kTorch the stored value is finite).
JAS_HD inline uint32_t RuleProduct(Rule rule, ScaleDtype dt, uint32_t bits, Factor f,
                                   bool* finite) {
  if (rule == Rule::kCann) return CannProduct(dt, bits, f, finite);
  const uint32_t out = MulByFactor(dt, bits, f);
  *finite = IsFiniteBits(dt, out);
  return out;
}

// The factor as `rule` multiplies by it.
JAS_HD inline Factor FactorFor(Rule rule, double f) {
  return rule == Rule::kCann ? CannFactor(f) : SplitFactor(f);
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
  if (rule == Rule::kCann && !IsCannFactor(growth_factor)) {
    return "growth_factor must be finite and nonzero in float32 under rule 'cann'";
  }
  if (rule == Rule::kCann && !IsCannFactor(backoff_factor)) {
    return "backoff_factor must be finite and nonzero in float32 under rule 'cann'";
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
  Rule rule;
};

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_UPDATE_SCALE_H_
