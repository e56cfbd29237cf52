// The XLA FFI target names of jax_amp_scale's custom calls, spelled once.
// Every native module exports them (UPDATE_SCALE_TARGET,
// UNSCALE_AND_CHECK_TARGET; capsule_module.h) and keys registrations() by
// them, so Python reads the names instead of spelling them again.
#ifndef JAX_AMP_SCALE_FFI_TARGETS_H_
#define JAX_AMP_SCALE_FFI_TARGETS_H_

namespace jas {

// Update-scale (aclnnAmpUpdateScale's rule): every platform's handler.
inline constexpr char kUpdateScaleTarget[] = "jas_update_scale";
// The fused unscale-and-check pass over the gradient leaves (CPU).
inline constexpr char kUnscaleAndCheckTarget[] = "jas_unscale_and_check";

}  // namespace jas

#endif  // JAX_AMP_SCALE_FFI_TARGETS_H_
