"""``scale * factor`` rounded as torch rounds it, by the fastest exact path.

Every path gives the same bits (tests/test_fast_product.py compares them over
every float16/bfloat16 pattern and 1M+ float32 patterns):

* a power-of-two factor (the defaults 2.0 and 0.5), any scale dtype:
  `exact_product.mul_by_power_of_two`, a handful of integer ops;
* any other factor and a float32 scale: `float64_product`, one float64
  multiply on CPU and GPU, the integer product on other platforms;
* any other factor and a float16/bfloat16 scale: the exact integer product,
  `exact_product.mul_by_factor_exact`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.reference.exact_product import (
    mul_by_factor_exact,
    mul_by_power_of_two,
    power_of_two_exponent,
)
from jax_amp_scale.reference.float64_product import mul_float32_by_factor


def mul_by_factor(bits: jax.Array, dtype: np.dtype, factor: float) -> jax.Array:
    """Bits of ``value(bits) * factor`` rounded as torch does.

    Args:
      bits: uint32 (float32) or uint16 (float16/bfloat16) array of scale bits.
      dtype: the scale dtype the bits encode.
      factor: a static, finite Python float > 0.
    """
    k = power_of_two_exponent(factor)
    if k is not None:
        return mul_by_power_of_two(bits, dtype, k)
    if jnp.dtype(dtype) == jnp.dtype(jnp.float32):
        return mul_float32_by_factor(bits, factor)
    return mul_by_factor_exact(bits, dtype, factor)
