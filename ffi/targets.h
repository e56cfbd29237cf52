// The XLA FFI target names of jax_amp_scale's custom calls, spelled once.
//
// Each name carries the version of its operand and attribute set: a
// serialized program (jax.export) names the target it calls, so a change to
// what a target takes gets a new name, and the old name stays registered
// with a handler for its own set from the release that published it on
// (tests/fixtures/ holds artifacts that every release must run with the
// same bits).  0.1.0 is the first release: only these names exist.
//
// Every native module exports the names (UPDATE_SCALE_TARGET,
// UNSCALE_AND_CHECK_TARGET; capsule_module.h) and keys registrations() by
// them, so Python reads the names instead of spelling them.
#ifndef JAX_AMP_SCALE_FFI_TARGETS_H_
#define JAX_AMP_SCALE_FFI_TARGETS_H_

namespace jas {

// Update-scale, v2: current_scale, growth_tracker, found_inf -> updated
// scale and tracker (aliased); attributes growth_factor, backoff_factor,
// growth_interval and rule ("torch" or "cann").
inline constexpr char kUpdateScaleTarget[] = "jas_update_scale_v2";
// The fused unscale-and-check pass, v1: inv_scale (float32, one element,
// subnormal allowed) and the leaves -> found_inf (bool) and the unscaled
// leaves (aliased).  No attributes.
inline constexpr char kUnscaleAndCheckTarget[] = "jas_unscale_and_check_v1";
// The same pass, v1's operands; results found_inf (bool), leaf_amax
// (float32, one element per leaf: each leaf's largest finite |input|),
// then the unscaled leaves (aliased).  No attributes.  CPU only.
inline constexpr char kUnscaleCheckAmaxTarget[] = "jas_unscale_check_amax_v1";

// The Ascend float status register (ffi/ascend_float_status.h), v1; served
// on Ascend only.  Clear: (x, order...) -> x (aliased), resets the flag.
// Read: (order...) -> status (uint8[64]), nonzero after an overflow.  No
// attributes.
inline constexpr char kFloatStatusClearTarget[] = "jas_float_status_clear_v1";
inline constexpr char kFloatStatusReadTarget[] = "jas_float_status_read_v1";

// The host report, v1: flag (bool) and values (bool, float32, int32) ->
// flag; attribute report (int64), the key of a Python function in this
// process.  Never in an exported program (the key means nothing elsewhere).
inline constexpr char kHostReportTarget[] = "jas_host_report_v1";

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_TARGETS_H_
