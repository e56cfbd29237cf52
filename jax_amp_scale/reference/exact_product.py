"""scale * factor in integer arithmetic, rounded exactly as torch rounds it.

torch's ``_amp_update_scale_`` multiplies a float scale by a double factor:
the exact product is rounded to float64, then to float32.  This module does
the same for float32, float16 and bfloat16 scales with int32/uint32 ops only,
mirroring ``MulByFactor`` in ``ffi/update_scale.h`` step by step, so that

* the FFI handlers and this reference agree bit for bit, and
* no float arithmetic runs: XLA:CPU's flush-to-zero of subnormals and any
  FMA contraction cannot change a result.

The 77-bit product of a 24-bit scale significand and the factor's static
53-bit significand is held in seven 12-bit limbs (uint32 arrays), so every
partial product fits in 32 bits without x64 mode.

That general path is about 1,800 lines of optimized HLO and takes 0.3-0.5 s
to compile.  When the factor is a power of two (the defaults 2.0 and 0.5)
`mul_by_power_of_two` gives the same bits with a handful of integer ops:
``x * 2**k`` is exact in float64 unless it leaves float64's normal range,
and there the float32/16 result is 0 or inf either way, so torch's two
roundings collapse into one, done on the exponent field.  `product.mul_by_factor`
picks the fastest path that gives the same bits.
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

LIMB = 12
NLIMBS = 7  # 84 bits >= 77
_MASK = (1 << LIMB) - 1


class Format(NamedTuple):
    bits_dtype: type
    p: int  # significand bits, implicit one included
    bias: int
    sign_bit: int
    inf_bits: int
    quiet_bit: int


FORMATS = {
    jnp.dtype(jnp.float32): Format(np.uint32, 24, 127, 0x80000000, 0x7F800000, 0x00400000),
    jnp.dtype(jnp.float16): Format(np.uint16, 11, 15, 0x8000, 0x7C00, 0x0200),
    jnp.dtype(jnp.bfloat16): Format(np.uint16, 8, 127, 0x8000, 0x7F80, 0x0040),
}


def split_factor(factor: float) -> tuple[int, int]:
    """A finite double > 0 as (significand in [2**52, 2**53), exponent)."""
    (u,) = struct.unpack("<Q", struct.pack("<d", factor))
    e = (u >> 52) & 0x7FF
    m = u & ((1 << 52) - 1)
    if e:
        return m | (1 << 52), e - 1023
    shift = 53 - m.bit_length()
    return m << shift, -1022 - shift


def _u32(x: int | jax.Array) -> jax.Array:
    return jnp.asarray(x, jnp.uint32)


def _bit_length(v: jax.Array) -> jax.Array:
    return 32 - jax.lax.clz(v).astype(jnp.int32)


def _bit_at(limbs: list[jax.Array], pos: jax.Array) -> jax.Array:
    """Bit `pos` (int32 array, any value) of the limb number, as uint32 0/1."""
    out = _u32(0)
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
        mask = (_u32(1) << width) - 1
        out = out | ((limb & mask) != 0)
    return out


def _shift_right(limbs: list[jax.Array], pos: jax.Array) -> jax.Array:
    """(number >> pos) as uint32; the caller guarantees it fits in 31 bits."""
    out = _u32(0)
    for i, limb in enumerate(limbs):
        offset = LIMB * i - pos  # where this limb's bit 0 lands
        left = jnp.clip(offset, 0, 31).astype(jnp.uint32)
        right = jnp.clip(-offset, 0, 31).astype(jnp.uint32)
        part = jnp.where(offset >= 0, limb << left, limb >> right)
        # Limbs entirely above the result are zero; limbs entirely below shift out.
        part = jnp.where(offset >= 32, _u32(0), part)
        out = out | part
    return out


def _carry(limbs: list[jax.Array]) -> list[jax.Array]:
    out = []
    carry = _u32(0)
    for limb in limbs:
        v = limb + carry
        out.append(v & _MASK)
        carry = v >> LIMB
    return out


def power_of_two_exponent(factor: float) -> int | None:
    """k when ``factor == 2.0**k`` exactly (subnormal doubles included), else None."""
    sig, fexp = split_factor(factor)
    return fexp if sig == 1 << 52 else None


def mul_by_power_of_two(bits: jax.Array, dtype: np.dtype, k: int) -> jax.Array:
    """Bits of ``value(bits) * 2**k``, rounded as torch rounds it (see module doc).

    Normalise the scale to a (q+1)-bit significand and an exponent field
    that may go below 1, add k, and encode: a normal, inf, or a subnormal
    rounded to nearest even by a right shift.  Integer ops only.
    """
    fm = FORMATS[jnp.dtype(dtype)]
    q = fm.p - 1
    b = bits.astype(jnp.uint32)
    sign = b & _u32(fm.sign_bit)
    mag = b & _u32(~fm.sign_bit & 0xFFFFFFFF)
    e = (mag >> q).astype(jnp.int32)
    m = mag & _u32((1 << q) - 1)
    # Subnormal scale: shift its top bit up to bit q; its exponent field
    # becomes 1 - shift.  clz of 0 is 32: zero scales are passed through below.
    sub_shift = jnp.clip(jax.lax.clz(m).astype(jnp.int32) - (31 - q), 0, 31)
    sig = jnp.where(e != 0, m | _u32(1 << q), m << sub_shift.astype(jnp.uint32))
    # Clamp k so int32 cannot overflow; any |k| past 300 is as good as infinite.
    new_e = jnp.where(e != 0, e, 1 - sub_shift) + jnp.int32(max(min(k, 300), -300))
    normal = (new_e.astype(jnp.uint32) << q) | (sig & _u32((1 << q) - 1))
    s = jnp.clip(1 - new_e, 1, 31).astype(jnp.uint32)
    kept = sig >> s
    rem = sig & ((_u32(1) << s) - 1)
    half = _u32(1) << (s - 1)
    kept = kept + ((rem > half) | ((rem == half) & ((kept & 1) != 0))).astype(jnp.uint32)
    out = jnp.where(new_e >= 1, normal, kept)
    out = jnp.where(new_e > 2 * fm.bias, _u32(fm.inf_bits), out)
    out = sign | out
    out = jnp.where((mag == fm.inf_bits) | (mag == 0), b, out)
    out = jnp.where(mag > fm.inf_bits, b | _u32(fm.quiet_bit), out)
    return out.astype(fm.bits_dtype)


def mul_by_factor_exact(bits: jax.Array, dtype: np.dtype, factor: float) -> jax.Array:
    """Returns the bits of ``value(bits) * factor`` rounded as torch does.

    Args:
      bits: uint32 (float32) or uint16 (float16/bfloat16) array of scale bits.
      dtype: the scale dtype the bits encode.
      factor: a static, finite Python float > 0.
    """
    fm = FORMATS[jnp.dtype(dtype)]
    q = fm.p - 1
    b = bits.astype(jnp.uint32)
    sign = b & _u32(fm.sign_bit)
    mag = b & _u32(~fm.sign_bit & 0xFFFFFFFF)
    is_nan = mag > fm.inf_bits
    passthrough = (mag == fm.inf_bits) | (mag == 0)

    # x = mx * 2**(ex - 23), mx in [2**23, 2**24).
    e = (mag >> q).astype(jnp.int32)
    m = mag & _u32((1 << q) - 1)
    n = _bit_length(jnp.maximum(m, 1))
    sub_shift = jnp.clip(24 - n, 0, 31).astype(jnp.uint32)
    mx = jnp.where(e != 0, (m | (1 << q)) << (23 - q), m << sub_shift)
    ex = jnp.where(e != 0, e - fm.bias, 1 - fm.bias - q + (n - 1))

    # Exact product in 12-bit limbs.  The factor's limbs are Python ints.
    sig, fexp = split_factor(factor)
    c = [(sig >> (LIMB * i)) & _MASK for i in range(math.ceil(53 / LIMB))]
    a = [mx & _MASK, mx >> LIMB]
    cols = [_u32(0)] * NLIMBS
    for j, aj in enumerate(a):
        for i, ci in enumerate(c):
            if ci:
                cols[i + j] = cols[i + j] + aj * _u32(ci)
    prod = _carry(cols)

    top = jnp.where(_bit_at(prod, jnp.full(b.shape, 76)) != 0, 76, 75).astype(jnp.int32)
    # Round to float64's 53 significant bits.
    k1 = top - 52
    half = _bit_at(prod, k1 - 1)
    sticky = _low_bits_nonzero(prod, k1 - 1)
    lsb = _bit_at(prod, k1)
    up1 = (half != 0) & (sticky | (lsb != 0))
    cleared = []
    for i, limb in enumerate(prod):
        width = jnp.clip(k1 - LIMB * i, 0, LIMB).astype(jnp.uint32)
        cleared.append(limb & ~((_u32(1) << width) - 1))
    add = []
    for i in range(NLIMBS):
        here = (k1 >= LIMB * i) & (k1 < LIMB * (i + 1)) & up1
        local = jnp.clip(k1 - LIMB * i, 0, LIMB - 1).astype(jnp.uint32)
        add.append(jnp.where(here, _u32(1) << local, _u32(0)))
    p1 = _carry([x + y for x, y in zip(cleared, add, strict=True)])
    top = top + _bit_at(p1, top + 1).astype(jnp.int32)

    exp = ex + fexp + (top - 75)
    emin, emax = 1 - fm.bias, fm.bias
    shift = top - q + jnp.maximum(emin - exp, 0)
    too_small = shift > top + 1
    shift_c = jnp.minimum(shift, top + 1)
    kept = _shift_right(p1, shift_c)
    half2 = _bit_at(p1, shift_c - 1)
    sticky2 = _low_bits_nonzero(p1, shift_c - 1)
    kept = kept + ((half2 != 0) & (sticky2 | ((kept & 1) != 0))).astype(jnp.uint32)
    biased = (jnp.clip(exp, emin, emax) + fm.bias - 1).astype(jnp.uint32)
    out = jnp.minimum((biased << q) + kept, _u32(fm.inf_bits))
    out = jnp.where(exp > emax, _u32(fm.inf_bits), out)
    out = jnp.where(too_small, _u32(0), out)
    out = sign | out

    out = jnp.where(passthrough, b, out)
    out = jnp.where(is_nan, b | _u32(fm.quiet_bit), out)
    return out.astype(fm.bits_dtype)
