"""torch's rule for ``scale * factor``: the exact product rounded to float64,
then to the scale's dtype, in integer arithmetic (`floats`).

torch's ``_amp_update_scale_`` multiplies a float scale by a double factor.
`mul_by_factor` gives its bits for float32, float16 and bfloat16 scales,
mirroring ``MulByFactor`` in ``ffi/torch_rule.h``, by the fastest exact
path (tests/test_fast_product.py compares them over every float16/bfloat16
pattern and 1M+ float32 patterns):

* a power-of-two factor (the defaults 2.0 and 0.5): a handful of integer
  ops on the exponent.  ``x * 2**k`` is exact in float64 unless it
  leaves float64's normal range, and there the float32/16 result is 0 or
  inf either way, so torch's two roundings collapse into one;
* any other factor: the 77-bit product of a 24-bit
  scale significand and the factor's static 53-bit significand in seven
  12-bit limbs (uint32 arrays, so every partial product fits in 32 bits
  without x64 mode), rounded to 53 bits, then to the scale's dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.reference.floats import (
    FORMATS,
    Format,
    bit_length,
    decode,
    encode,
    keep_specials,
    power_of_two_exponent,
    split_factor,
    u32,
)

LIMB = 12
NLIMBS = 7  # 84 bits >= 77
_MASK = (1 << LIMB) - 1


def _bit_at(limbs: list[jax.Array], pos: jax.Array) -> jax.Array:
    """Bit `pos` (int32 array, any value) of the limb number, as uint32 0/1."""
    out = u32(0)
    for i, limb in enumerate(limbs):
        local = jnp.clip(pos - LIMB * i, 0, LIMB - 1).astype(jnp.uint32)
        hit = (pos >= LIMB * i) & (pos < LIMB * (i + 1))
        out = out | jnp.where(hit, (limb >> local) & 1, 0).astype(jnp.uint32)
    return out


def _low_bits_nonzero(limbs: list[jax.Array], pos: jax.Array) -> jax.Array:
    """Whether any bit below `pos` is set."""
    out = jnp.zeros(pos.shape, bool)
    for i, limb in enumerate(limbs):
        width = jnp.clip(pos - LIMB * i, 0, LIMB).astype(jnp.uint32)
        out = out | ((limb & ((u32(1) << width) - 1)) != 0)
    return out


def _shift_right(limbs: list[jax.Array], pos: jax.Array) -> jax.Array:
    """(number >> pos) as uint32; the caller guarantees it fits in 31 bits."""
    out = u32(0)
    for i, limb in enumerate(limbs):
        offset = LIMB * i - pos  # where this limb's bit 0 lands
        left = jnp.clip(offset, 0, 31).astype(jnp.uint32)
        right = jnp.clip(-offset, 0, 31).astype(jnp.uint32)
        part = jnp.where(offset >= 0, limb << left, limb >> right)
        # Limbs entirely above the result are zero; limbs entirely below shift out.
        out = out | jnp.where(offset >= 32, u32(0), part)
    return out


def _carry(limbs: list[jax.Array]) -> list[jax.Array]:
    out = []
    carry = u32(0)
    for limb in limbs:
        v = limb + carry
        out.append(v & _MASK)
        carry = v >> LIMB
    return out


def _times_factor(sig: jax.Array, factor: float) -> tuple[list[jax.Array], int]:
    """``(limbs, e)``: ``sig * factor == limbs * 2**e`` exactly (sig < 2**24)."""
    fsig, fexp = split_factor(factor)
    c = [(fsig >> (LIMB * i)) & _MASK for i in range(math.ceil(53 / LIMB))]
    cols = [u32(0)] * NLIMBS
    for j, aj in enumerate([sig & _MASK, sig >> LIMB]):
        for i, ci in enumerate(c):
            if ci:  # the factor's limbs are Python ints
                cols[i + j] = cols[i + j] + aj * u32(ci)
    return _carry(cols), fexp - 52


def _round_to_53_bits(limbs: list[jax.Array], top: jax.Array) -> list[jax.Array]:
    """The limb number, leading bit at `top`, rounded to 53 bits (nearest even)."""
    k = top - 52
    up = (_bit_at(limbs, k - 1) != 0) & (_low_bits_nonzero(limbs, k - 1) | (_bit_at(limbs, k) != 0))
    out = []
    for i, limb in enumerate(limbs):
        width = jnp.clip(k - LIMB * i, 0, LIMB).astype(jnp.uint32)
        here = (k >= LIMB * i) & (k < LIMB * (i + 1)) & up
        local = jnp.clip(k - LIMB * i, 0, LIMB - 1).astype(jnp.uint32)
        out.append((limb & ~((u32(1) << width) - 1)) + jnp.where(here, u32(1) << local, u32(0)))
    return _carry(out)


def _times_factor_rounded(sig: jax.Array, exp: jax.Array, factor: float, fm: Format) -> jax.Array:
    """Magnitude bits of ``sig * 2**exp * factor`` rounded as torch does (sig > 0)."""
    shift = 24 - bit_length(sig)  # a 24-bit significand: the product's top is bit 75 or 76
    prod, fexp = _times_factor(sig << shift.astype(jnp.uint32), factor)
    exp = exp - shift + fexp
    top = jnp.where(_bit_at(prod, jnp.full(sig.shape, 76)) != 0, 76, 75).astype(jnp.int32)
    prod = _round_to_53_bits(prod, top)  # torch's first rounding, to float64
    top = top + _bit_at(prod, top + 1).astype(jnp.int32)
    # The second rounding: the top 30 bits and a sticky bit for the rest.
    kept = _shift_right(prod, top - 29)
    kept = kept | _low_bits_nonzero(prod, top - 29).astype(jnp.uint32)
    return encode(kept, exp + top - 29, fm)


def mul_by_factor(
    bits: jax.Array, dtype: np.dtype, factor: float, *, fast: bool = True
) -> jax.Array:
    """Bits of ``value(bits) * factor`` rounded as torch does.

    Args:
      bits: uint32 (float32) or uint16 (float16/bfloat16) array of scale bits.
      dtype: the scale dtype the bits encode.
      factor: a static, finite Python float > 0.
      fast: take exponent arithmetic when `factor` is a power of two (the
        same bits; False: the limb product for every factor, for tests).
    """
    fm = FORMATS[jnp.dtype(dtype)]
    b = bits.astype(jnp.uint32)
    sign, _, sig, exp = decode(b, fm)
    sig = jnp.maximum(sig, u32(1))  # zeros are kept as they are below
    k = power_of_two_exponent(factor) if fast else None
    if k is not None:
        # Clamp k so int32 cannot overflow; past 300 it is as good as infinite.
        out = encode(sig, exp + max(min(k, 300), -300), fm)
    else:
        out = _times_factor_rounded(sig, exp, factor, fm)
    return keep_specials(b, fm, sign | out).astype(fm.bits_dtype)
