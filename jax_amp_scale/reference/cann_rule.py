"""CANN's rule for ``scale * factor`` (``rule="cann"``), exact on every platform.

CANN's published ``aclnnAmpUpdateScale`` kernel (hicann/ops-math
``math/amp_update_scale/``) rounds the factors to float32
(``op_host/amp_update_scale_tiling.cpp:63-71``), widens the scale to float32
(``op_kernel/amp_update_scale.h:115-134``), multiplies in float32 (``:141``
backoff, ``:146`` growth), refuses growth when the float32 product is not
finite (``:86-93``, ``:147``) and casts to the scale's dtype at the store
(``:162-172``).  The library adds a guard: growth is also refused when the
stored value is infinite.

Here no step can meet XLA:CPU's flush-to-zero of subnormals, mirroring
``RuleProduct`` in ``ffi/update_scale.h``:

* a float32 scale times the float32 factor is ``mul_by_factor(bits,
  float32, float(np.float32(factor)))`` (`product`): the exact product of
  two 24-bit significands fits float64, so torch-style rounding rounds once,
  to float32;
* a float16/bfloat16 scale is widened to float32 bits, multiplied so, and
  the float32 bits are rounded to the scale dtype (nearest even).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.reference.exact_product import FORMATS
from jax_amp_scale.reference.product import mul_by_factor

_F32 = jnp.dtype(jnp.float32)
_F32_INF = 0x7F800000


def float32_factor(factor: float) -> float:
    """The factor as CANN's kernel holds it: rounded to float32 (nearest even)."""
    return float(np.float32(factor))


def _u32(x: int | jax.Array) -> jax.Array:
    return jnp.asarray(x, jnp.uint32)


def widen_to_f32_bits(bits: jax.Array, dtype: np.dtype) -> jax.Array:
    """uint32 float32 bits of the float16/bfloat16/float32 values `bits` (exact)."""
    dt = jnp.dtype(dtype)
    b = bits.astype(jnp.uint32)
    if dt == _F32:
        return b
    if dt == jnp.dtype(jnp.bfloat16):
        return b << 16
    sign = (b & 0x8000) << 16
    e = (b >> 10) & 0x1F
    m = b & 0x3FF
    # Subnormal: m = 1.f * 2**(n-1) with n its bit length; value m * 2**-24.
    n = 32 - jax.lax.clz(jnp.maximum(m, _u32(1))).astype(jnp.uint32)
    sub_exp = n - 1 + 127 - 24  # biased float32 exponent of the leading bit
    sub_frac = (m << (_u32(24) - n)) & 0x7FFFFF  # drop the leading bit, align
    out = jnp.where(e == 0, (sub_exp << 23) | sub_frac, ((e + (127 - 15)) << 23) | (m << 13))
    out = jnp.where(e == 0x1F, _u32(_F32_INF) | (m << 13), out)
    out = jnp.where((e == 0) & (m == 0), _u32(0), out)
    return sign | out


def narrow_f32_bits(bits: jax.Array, dtype: np.dtype) -> jax.Array:
    """float32 bits (uint32) rounded to `dtype` (nearest even), as its bits dtype."""
    dt = jnp.dtype(dtype)
    fm = FORMATS[dt]
    if dt == _F32:
        return bits.astype(fm.bits_dtype)
    q = fm.p - 1
    b = bits.astype(jnp.uint32)
    sign = jnp.where((b >> 31) != 0, _u32(fm.sign_bit), _u32(0))
    mag = b & 0x7FFFFFFF
    e = (mag >> 23).astype(jnp.int32)
    sig = jnp.where(e != 0, (mag & 0x7FFFFF) | 0x800000, mag)
    ex = jnp.where(e != 0, e - 127, -126)
    nbits = 32 - jax.lax.clz(jnp.maximum(sig, _u32(1))).astype(jnp.int32)
    vexp = ex + nbits - 24
    emin = 1 - fm.bias
    x = jnp.maximum(vexp, emin)
    shift = x - q - ex + 23  # >= 13 for float16 and bfloat16
    sh = jnp.clip(shift, 1, 31).astype(jnp.uint32)
    kept = sig >> sh
    low = sig & ((_u32(1) << sh) - 1)
    half = _u32(1) << (sh - 1)
    kept = kept + ((low > half) | ((low == half) & ((kept & 1) != 0))).astype(jnp.uint32)
    out = ((x + fm.bias - 1).astype(jnp.uint32) << q) + kept
    out = jnp.minimum(out, _u32(fm.inf_bits))
    out = jnp.where(shift > 24, _u32(0), out)
    out = jnp.where(vexp > fm.bias, _u32(fm.inf_bits), out)
    out = jnp.where(mag == 0, _u32(0), out)
    out = jnp.where(mag == _F32_INF, _u32(fm.inf_bits), out)
    nan = _u32(fm.inf_bits | fm.quiet_bit) | ((mag & 0x7FFFFF) >> (23 - q))
    out = jnp.where(mag > _F32_INF, nan, out)
    return (sign | out).astype(fm.bits_dtype)


def cann_product(bits: jax.Array, dtype: np.dtype, factor: float) -> tuple[jax.Array, jax.Array]:
    """``(bits of scale * factor, growth allowed)`` under CANN's rule plus the guard.

    `bits` encode values of `dtype`; `factor` is the state's (double) factor.
    Growth is allowed when the float32 product is finite (the kernel's test)
    and the value stored in `dtype` is finite (the library's guard).
    """
    fm = FORMATS[jnp.dtype(dtype)]
    p32 = mul_by_factor(widen_to_f32_bits(bits, dtype), _F32, float32_factor(factor))
    p32 = p32.astype(jnp.uint32)
    out = narrow_f32_bits(p32, dtype)
    finite = ((p32 & _F32_INF) != _F32_INF) & ((out & fm.inf_bits) != fm.inf_bits)
    return out, finite
