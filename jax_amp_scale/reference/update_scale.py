"""The update rule in plain jax.numpy/lax: runs on every JAX platform.

The products ``scale * factor`` follow the state's rule: torch's
(`product.mul_by_factor`: exact product, to float64, to the scale dtype) or
CANN's (`cann_rule.cann_product`), both in integer arithmetic (`floats`), so
this lowering, the native handlers and ``torch._amp_update_scale_`` agree bit
for bit, and XLA:CPU's flush-to-zero cannot touch subnormal scales.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_amp_scale.reference.cann_rule import cann_product
from jax_amp_scale.reference.floats import FORMATS
from jax_amp_scale.reference.product import mul_by_factor


# Jitted so that an eager (un-jitted) call runs as one compiled kernel instead
# of ~150 dispatched integer ops; inside an outer jit it is simply inlined.
@functools.partial(
    jax.jit, static_argnames=("growth_factor", "backoff_factor", "growth_interval", "rule")
)
def update_scale_reference(
    scale: jax.Array,
    growth_tracker: jax.Array,
    found: jax.Array,
    *,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    rule: str = "torch",
) -> tuple[jax.Array, jax.Array]:
    """One step of the rule, elementwise.

    Args:
      scale: float32/float16/bfloat16 array.
      growth_tracker: int32 array of the same shape.
      found: bool array of the same shape (True: overflow on this step).
      growth_factor, backoff_factor, growth_interval: validated Python numbers.
      rule: ``"torch"`` (float64 product, above) or ``"cann"`` (CANN's
        float32 kernel plus the guard: `cann_rule.cann_product`).

    Returns:
      ``(updated_scale, updated_growth_tracker)`` with the input shapes/dtypes.
    """
    fm = FORMATS[jnp.dtype(scale.dtype)]
    bits = jax.lax.bitcast_convert_type(scale, fm.bits_dtype)
    if rule == "cann":
        backed_off, _ = cann_product(bits, scale.dtype, backoff_factor)
        grown, grown_finite = cann_product(bits, scale.dtype, growth_factor)
    else:
        backed_off = mul_by_factor(bits, scale.dtype, backoff_factor)
        grown = mul_by_factor(bits, scale.dtype, growth_factor)
        grown_finite = (grown & fm.inf_bits) != fm.inf_bits

    # int32 addition wraps in XLA (two's complement), as the spec requires.
    successful = growth_tracker + jnp.int32(1)
    grow = successful == jnp.int32(growth_interval)

    new_bits = jnp.where(found, backed_off, jnp.where(grow & grown_finite, grown, bits))
    new_tracker = jnp.where(found | grow, jnp.zeros_like(growth_tracker), successful)
    return jax.lax.bitcast_convert_type(new_bits, scale.dtype), new_tracker
