"""CANN's rule for ``scale * factor`` (``rule="cann"``), exact on every platform.

CANN's published ``aclnnAmpUpdateScale`` kernel (hicann/ops-math
``math/amp_update_scale/``) rounds the factors to float32
(``op_host/amp_update_scale_tiling.cpp:63-71``), widens the scale to float32
(``op_kernel/amp_update_scale.h:115-134``), multiplies in float32 (``:141``
backoff, ``:146`` growth), refuses growth when the float32 product is not
finite (``:86-93``, ``:147``) and casts to the scale's dtype at the store
(``:162-172``).  The library adds a guard: growth is also refused when the
stored value is infinite.

Here, in integer arithmetic (`floats`), mirroring ``RuleProduct`` in
``ffi/cann_rule.h``: the scale is widened to float32 bits (exact), times
the float32 factor by torch's rule (`product.mul_by_factor`: the exact
product of two 24-bit significands fits float64, so it rounds once, to
float32), and the float32 bits are rounded to the scale dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.reference.floats import F32, FORMATS, convert
from jax_amp_scale.reference.product import mul_by_factor


def float32_factor(factor: float) -> float:
    """The factor as CANN's kernel holds it: rounded to float32 (nearest even)."""
    return float(np.float32(factor))


def cann_product(bits: jax.Array, dtype: np.dtype, factor: float) -> tuple[jax.Array, jax.Array]:
    """``(bits of scale * factor, growth allowed)`` under CANN's rule plus the guard.

    `bits` encode values of `dtype`; `factor` is the state's (double) factor.
    Growth is allowed when the float32 product is finite (the kernel's test)
    and the value stored in `dtype` is finite (the library's guard).
    """
    fm = FORMATS[jnp.dtype(dtype)]
    p32 = mul_by_factor(convert(bits, fm, F32), jnp.float32, float32_factor(factor))
    p32 = p32.astype(jnp.uint32)
    out = convert(p32, F32, fm).astype(fm.bits_dtype)
    finite = ((p32 & F32.inf_bits) != F32.inf_bits) & ((out & fm.inf_bits) != fm.inf_bits)
    return out, finite
