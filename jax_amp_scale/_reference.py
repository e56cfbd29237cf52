"""The update rule in plain jax.numpy/lax: runs on every JAX platform.

Arithmetic contract, shared bit for bit with the native handlers
(``ffi/update_scale.h``): the scale is widened to float32, multiplied by
``float32(factor)`` with one float32 rounding, and rounded back to the scale
dtype (round to nearest even).  For float32 scales this equals torch's float64
product rounded to float32 whenever the factor is exactly representable in
float32 (2.0, 0.5, 1.5, 0.25, ...); for other factors (1.1, 0.3, ...) the
last bit may differ from torch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def update_scale_reference(
    scale: jax.Array,
    growth_tracker: jax.Array,
    found: jax.Array,
    *,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> tuple[jax.Array, jax.Array]:
    """One step of the rule, elementwise.

    Args:
      scale: float32/float16/bfloat16 array.
      growth_tracker: int32 array of the same shape.
      found: bool array of the same shape (True: overflow on this step).
      growth_factor, backoff_factor, growth_interval: validated Python numbers.

    Returns:
      ``(updated_scale, updated_growth_tracker)`` with the input shapes/dtypes.
    """
    wide = scale.astype(jnp.float32)
    backed_off = (wide * np.float32(backoff_factor)).astype(scale.dtype)
    grown = (wide * np.float32(growth_factor)).astype(scale.dtype)

    # int32 addition wraps in XLA (two's complement), as the spec requires.
    successful = growth_tracker + jnp.int32(1)
    grow = successful == jnp.int32(growth_interval)

    grown_or_kept = jnp.where(jnp.isfinite(grown), grown, scale)
    new_scale = jnp.where(found, backed_off, jnp.where(grow, grown_or_kept, scale))
    zero = jnp.zeros_like(growth_tracker)
    new_tracker = jnp.where(found | grow, zero, successful)
    return new_scale, new_tracker
