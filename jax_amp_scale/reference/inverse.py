"""The inverse scale, exact at every scale, and the product with it.

torch's GradScaler unscales with ``inv_scale = float32(1 / float64(scale))``
and multiplies each gradient by it in float32 (float64 for float64
gradients).  Above ``2**126`` that inverse is a float32 *subnormal*, and
XLA runs with flush-to-zero and denormals-are-zero: the plain
``1 / scale`` is flushed to 0 there, and a subnormal operand of a multiply
is read as 0.  The two functions here avoid both without changing a bit
anywhere else:

- `inverse_scale` builds torch's inverse by its bits: a float32 division
  where the quotient is normal (IEEE division is correctly rounded, and a
  double rounding through float64 cannot change a float32 quotient), and an
  integer division rounded to the subnormal grid (ties to even) where it is
  not.  A subnormal scale gets its exact inverse too (XLA would read it
  as 0 and return inf).
- `inverse_factors` splits an inverse into ``(m, p)`` with ``inv == m * p``
  exactly, `m` a normal float32 and `p` a power of two: ``(inv, 1)`` for a
  normal inverse, ``(inv * 2**64, 2**-64)`` for a subnormal one.  Then
  ``(x * m) * p`` equals ``x * inv`` bit for bit under flush-to-zero: the
  first product is rounded to 24 bits exactly as ``x * inv`` is (the
  factor 2**64 only moves the exponent), and the second is exact unless the
  result is itself below the normal range, where both flush to a zero of
  the same sign.  The only results that differ from torch's are those that
  are subnormal in torch (XLA returns zero there at every scale).

The native handlers (ffi/unscale_and_check.h) take the same inverse and
split it the same way.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jax_amp_scale.reference.floats import F32

# The power of two a subnormal inverse is multiplied by (then divided by, in
# the second product).  Any k with 2**-149 * 2**k normal and 2**-126 * 2**k
# < 1 works; the native code uses the same (ffi/unscale_and_check.h).
SUBNORMAL_SHIFT = 64

_EXP = F32.inf_bits
_MANT = (1 << (F32.p - 1)) - 1
_SIGN = F32.sign_bit
_u32 = jnp.uint32


def _round_div_pow2(n: int, b: jax.Array) -> jax.Array:
    """``round(2**n / b)`` (to nearest, ties to even) in uint32 arithmetic.

    `b` is an integer in [2**23, 2**24) and ``2**n / b < 2**24``; the long
    division runs 8 bits at a time so no intermediate reaches 2**32.
    """
    q = lax.div(_u32(1 << (n - 16)), b)
    r = lax.rem(_u32(1 << (n - 16)), b)
    for _ in range(2):
        t = lax.shift_left(r, _u32(8))
        q = lax.bitwise_or(lax.shift_left(q, _u32(8)), lax.div(t, b))
        r = lax.rem(t, b)
    twice = lax.shift_left(r, _u32(1))
    up = (twice > b) | ((twice == b) & ((q & _u32(1)) == _u32(1)))
    return q + up.astype(jnp.uint32)


@jax.custom_jvp
def inverse_scale(scale: Any) -> jax.Array:
    """torch's ``float32(1 / scale)`` with gradual underflow, as a float32 array.

    `scale` is any float array (float16/bfloat16 are widened to float32
    first, exactly).  The result may be a float32 subnormal: pass it only to
    `inverse_factors` (or to a native pass, which splits it itself), never
    to arithmetic directly.
    """
    s = jnp.asarray(scale).astype(jnp.float32)
    bits = lax.bitcast_convert_type(s, jnp.uint32)
    sign = bits & _u32(_SIGN)
    mag = bits & _u32(0x7FFFFFFF)
    exp = lax.shift_right_logical(mag, _u32(23))
    mant = mag & _u32(_MANT)
    # Normal quotient: IEEE division (s normal, 1/s normal, 0, inf or NaN).
    plain = jnp.float32(1.0) / s
    # s in [2**126, 2**128): 1/s in (2**-128, 2**-126], on the grid 2**-149.
    # With s = B * 2**(e - 150), B = 2**23 + mant, 1/s = 2**(299 - e) / B
    # units of 2**-149: 2**46 / B for e = 253 (s in [2**126, 2**127)), and
    # 2**45 / B for e = 254.  A result of 2**23 units is 2**-126, whose bits
    # are the same integer: no special case.
    b = mant | _u32(1 << 23)
    sub_bits = jnp.where(exp == _u32(253), _round_div_pow2(46, b), _round_div_pow2(45, b))
    tiny_inverse = (exp == _u32(253)) | (exp == _u32(254))
    # s subnormal (XLA reads it as 0): s = mant * 2**-149, 1/s = 2**149 / mant,
    # rounded once by the division (mant converts exactly) and scaled by a
    # power of two exactly (the product overflows to inf where 1/s does).
    big = (jnp.float32(2.0**100) / mant.astype(jnp.float32)) * jnp.float32(2.0**49)
    big_bits = lax.bitcast_convert_type(big, jnp.uint32)
    plain_bits = lax.bitcast_convert_type(plain, jnp.uint32) & _u32(0x7FFFFFFF)
    subnormal_scale = (exp == _u32(0)) & (mant != _u32(0))
    out = jnp.where(tiny_inverse, sub_bits, jnp.where(subnormal_scale, big_bits, plain_bits))
    return lax.bitcast_convert_type(out | sign, jnp.float32)


@inverse_scale.defjvp
def _inverse_scale_jvp(primals: Any, tangents: Any) -> tuple[jax.Array, jax.Array]:
    # The bit construction has no derivative; 1/s's is -1/s**2.
    (scale,), (t,) = primals, tangents
    s = jnp.asarray(scale).astype(jnp.float32)
    return inverse_scale(scale), -jnp.asarray(t).astype(jnp.float32) / (s * s)


def inverse_factors(inv: Any) -> tuple[jax.Array, jax.Array]:
    """``(m, p)``, float32, with ``inv == m * p`` exactly, `m` never subnormal.

    `p` is 1 unless `inv` is a float32 subnormal, then ``2**-SUBNORMAL_SHIFT``.
    The split reads `inv` by its bits (a subnormal operand would be read as
    zero by XLA's arithmetic).
    """
    bits = lax.bitcast_convert_type(jnp.asarray(inv, jnp.float32), jnp.uint32)
    mant = bits & _u32(_MANT)
    subnormal = ((bits & _u32(_EXP)) == _u32(0)) & (mant != _u32(0))
    # mant * 2**-149 * 2**64 = mant * 2**-85: the integer converts exactly
    # and the power-of-two product is normal.
    lifted = mant.astype(jnp.float32) * jnp.float32(2.0 ** (SUBNORMAL_SHIFT - 149))
    lifted_bits = lax.bitcast_convert_type(lifted, jnp.uint32) | (bits & _u32(_SIGN))
    m = lax.bitcast_convert_type(jnp.where(subnormal, lifted_bits, bits), jnp.float32)
    p = jnp.where(subnormal, jnp.float32(2.0**-SUBNORMAL_SHIFT), jnp.float32(1.0))
    # XLA may not fold m * p back into one (subnormal, flushed) constant when
    # the scale is a compile-time constant: the barrier keeps the two
    # products apart (tests/test_inverse_scale.py pins it).
    return lax.optimization_barrier((m, p))  # type: ignore[no-any-return]


@jax.custom_jvp
def multiply_by_inverse(x: jax.Array, inv: Any) -> jax.Array:
    """``x * inv`` in `x`'s dtype (float32 or float64), exact for every `inv`.

    Differentiable as the product it is (the split reads bits).
    """
    m, p = inverse_factors(inv)
    return (x * m.astype(x.dtype)) * p.astype(x.dtype)


@multiply_by_inverse.defjvp
def _multiply_by_inverse_jvp(primals: Any, tangents: Any) -> tuple[jax.Array, jax.Array]:
    (x, inv), (tx, tinv) = primals, tangents
    out = multiply_by_inverse(x, inv)
    return out, multiply_by_inverse(tx, inv) + x * jnp.asarray(tinv).astype(x.dtype)
