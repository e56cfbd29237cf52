"""The float formats in integer arithmetic: bit tables, decode, encode, convert.

Every rule (`product` for torch's, `cann_rule` for CANN's) reads and writes
floats through these functions, with uint32/int32 ops only: no float
arithmetic runs, so XLA:CPU's flush-to-zero of subnormals and any FMA
contraction cannot change a result.  `encode` is the one rounding to
nearest even of the package's Python code (``ffi/float_formats.h`` holds the
C++ one).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


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
F32 = FORMATS[jnp.dtype(jnp.float32)]


def u32(x: int | jax.Array) -> jax.Array:
    return jnp.asarray(x, jnp.uint32)


def bit_length(v: jax.Array) -> jax.Array:
    """int32 bit length of the uint32 `v` (0 for 0)."""
    return 32 - jax.lax.clz(v).astype(jnp.int32)


def split_factor(factor: float) -> tuple[int, int]:
    """A finite double > 0 as (significand in [2**52, 2**53), exponent)."""
    (u,) = struct.unpack("<Q", struct.pack("<d", factor))
    e = (u >> 52) & 0x7FF
    m = u & ((1 << 52) - 1)
    if e:
        return m | (1 << 52), e - 1023
    shift = 53 - m.bit_length()
    return m << shift, -1022 - shift


def power_of_two_exponent(factor: float) -> int | None:
    """k when ``factor == 2.0**k`` exactly (subnormal doubles included), else None."""
    sig, fexp = split_factor(factor)
    return fexp if sig == 1 << 52 else None


def decode(bits: jax.Array, fm: Format) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(sign, magnitude, significand, exponent)`` of `bits` (uint32) in format `fm`.

    ``sign`` and ``magnitude`` are the bits with and without the sign bit;
    a finite value is ``significand * 2**exponent`` (uint32, int32), the
    implicit one included for normals.
    """
    q = fm.p - 1
    sign = bits & u32(fm.sign_bit)
    mag = bits & u32(~fm.sign_bit & 0xFFFFFFFF)
    e = (mag >> q).astype(jnp.int32)
    m = mag & u32((1 << q) - 1)
    sig = jnp.where(e != 0, m | u32(1 << q), m)
    return sign, mag, sig, jnp.maximum(e, 1) - fm.bias - q


def encode(sig: jax.Array, exp: jax.Array, fm: Format) -> jax.Array:
    """Magnitude bits (uint32) of ``sig * 2**exp`` rounded to `fm`, nearest even.

    `sig` is a nonzero uint32 below 2**31, `exp` int32 (it may hold any
    value a caller gets from exponents of its formats plus a clamped
    offset).  Subnormal results round on the subnormal grid; overflow gives
    inf.  A caller with more significant bits than `sig` holds folds the
    rest into bit 0 (a sticky bit): exact as long as the format keeps at most
    29 of the 31 bits.
    """
    q = fm.p - 1
    lead = exp + bit_length(sig) - 1  # exponent of the leading bit
    lsb = jnp.maximum(lead, 1 - fm.bias) - q  # exponent of the result's last bit
    shift = lsb - exp
    up = jnp.clip(-shift, 0, 31).astype(jnp.uint32)
    s = jnp.clip(shift, 0, 31).astype(jnp.uint32)
    kept = jnp.where(shift < 0, sig << up, sig >> s)
    rem = sig & ((u32(1) << s) - 1)
    half = (u32(1) << s) >> 1
    kept = kept + ((shift > 0) & ((rem > half) | ((rem == half) & ((kept & 1) != 0)))).astype(
        jnp.uint32
    )
    kept = jnp.where(shift > 31, u32(0), kept)  # below half the smallest subnormal
    # The implicit bit of a normal `kept` adds one to the exponent field, and
    # a carry out of the significand lands there too.
    field = (jnp.clip(lsb + q, 1 - fm.bias, fm.bias + 1) + fm.bias - 1).astype(jnp.uint32)
    out = jnp.minimum((field << q) + kept, u32(fm.inf_bits))
    return jnp.where(lead > fm.bias, u32(fm.inf_bits), out)


def keep_specials(bits: jax.Array, fm: Format, out: jax.Array) -> jax.Array:
    """`out` for finite nonzero `bits`; zeros and infinities as they are, NaNs quieted."""
    mag = bits & u32(~fm.sign_bit & 0xFFFFFFFF)
    out = jnp.where((mag == fm.inf_bits) | (mag == 0), bits, out)
    return jnp.where(mag > fm.inf_bits, bits | u32(fm.quiet_bit), out)


def convert(bits: jax.Array, src: Format, dst: Format) -> jax.Array:
    """`bits` of format `src` as format `dst` (uint32), rounded to nearest even.

    Exact when `dst` is wider; zeros and infinities keep their sign; a NaN
    becomes a quiet NaN with its payload's top bits.
    """
    b = bits.astype(jnp.uint32)
    if src == dst:
        return b
    sign, mag, sig, exp = decode(b, src)
    sign = jnp.where(sign != 0, u32(dst.sign_bit), u32(0))
    out = encode(jnp.maximum(sig, u32(1)), exp, dst)
    payload = mag & u32((1 << (src.p - 1)) - 1)
    payload = (payload << max(dst.p - src.p, 0)) >> max(src.p - dst.p, 0)
    out = jnp.where(mag == 0, u32(0), out)
    out = jnp.where(mag == src.inf_bits, u32(dst.inf_bits), out)
    out = jnp.where(mag > src.inf_bits, u32(dst.inf_bits | dst.quiet_bit) | payload, out)
    return sign | out
