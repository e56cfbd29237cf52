"""Float bit patterns: the only Python module that reads or writes them.

It mirrors ``ffi/float_formats.h``, ``ffi/torch_rule.h`` and
``ffi/cann_rule.h``.  Every function works in uint32/int32 arithmetic, so
XLA:CPU's flush-to-zero of subnormals and FMA contraction cannot change a
result.  `encode` is the one rounding to nearest even of the package's
Python code.
"""

from __future__ import annotations

import math
import struct
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


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

# The dtypes a scale may have: the Ascend operator's, which are also the ones
# aclnnForeachNonFiniteCheckAndUnscale takes for gradients.
SCALE_DTYPES = tuple(FORMATS)


def is_float_leaf(x: Any) -> bool:
    """Whether `x` is an array with a floating dtype (float0 excluded)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return False
    dtype = np.dtype(dtype)
    return dtype != jax.dtypes.float0 and jnp.issubdtype(dtype, jnp.floating)


def compute_dtype(dtype: Any) -> Any:
    """float16/bfloat16 values are computed in float32 (and rounded once back
    to their own dtype), float64 values in float64."""
    return jnp.promote_types(dtype, jnp.float32)


def widened(fn: Any, x: jax.Array) -> jax.Array:
    """``fn(x)`` computed in `compute_dtype`, rounded once back to `x`'s dtype."""
    return fn(x.astype(compute_dtype(x.dtype))).astype(x.dtype)


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


# ---- torch's product: the exact product, to float64, to the scale's dtype ----
#
# A power-of-two factor (the defaults 2.0 and 0.5) is a handful of integer ops
# on the exponent: x * 2**k is exact in float64 unless it leaves float64's
# normal range, and there the result is 0 or inf either way.  Any other factor
# takes the 77-bit product of a 24-bit significand and the factor's 53-bit one
# in seven 12-bit limbs (every partial product fits in uint32, no x64 mode),
# rounded to 53 bits, then to the scale's dtype.  Mirrors MulByFactor in
# ffi/torch_rule.h.

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


def limb_product(bits: jax.Array, dtype: np.dtype, factor: float) -> jax.Array:
    """`torch_product` by the limb product, whatever the factor (torch_product
    takes it for factors that are not powers of two)."""
    return _torch_product(bits, dtype, factor, None)


def torch_product(bits: jax.Array, dtype: np.dtype, factor: float) -> jax.Array:
    """Bits of ``value(bits) * factor`` rounded as torch does.

    Args:
      bits: uint32 (float32) or uint16 (float16/bfloat16) array of scale bits.
      dtype: the scale dtype the bits encode.
      factor: a static, finite Python float > 0.
    """
    return _torch_product(bits, dtype, factor, power_of_two_exponent(factor))


def _torch_product(bits: jax.Array, dtype: np.dtype, factor: float, k: int | None) -> jax.Array:
    fm = FORMATS[jnp.dtype(dtype)]
    b = bits.astype(jnp.uint32)
    sign, _, sig, exp = decode(b, fm)
    sig = jnp.maximum(sig, u32(1))  # zeros are kept as they are below
    if k is not None:
        # Clamp k so int32 cannot overflow; past 300 it is as good as infinite.
        out = encode(sig, exp + max(min(k, 300), -300), fm)
    else:
        out = _times_factor_rounded(sig, exp, factor, fm)
    return keep_specials(b, fm, sign | out).astype(fm.bits_dtype)


# ---- CANN's product (rule="cann"): ffi/cann_rule.h ----


def float32_factor(factor: float) -> float:
    """The factor as CANN's kernel holds it: rounded to float32 (nearest even)."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.float32(factor))


def cann_product(bits: jax.Array, dtype: np.dtype, factor: float) -> tuple[jax.Array, jax.Array]:
    """``(bits of scale * factor, growth allowed)`` under CANN's rule plus the guard.

    `bits` encode values of `dtype`; `factor` is the state's (double) factor.
    Growth is allowed when the float32 product is finite (the kernel's test)
    and the value stored in `dtype` is finite (the library's guard).
    """
    fm = FORMATS[jnp.dtype(dtype)]
    p32 = torch_product(convert(bits, fm, F32), jnp.float32, float32_factor(factor))
    p32 = p32.astype(jnp.uint32)
    out = convert(p32, F32, fm).astype(fm.bits_dtype)
    finite = finite_bits(p32, F32) & finite_bits(out, fm)
    return out, finite


def product(
    bits: jax.Array, dtype: np.dtype, factor: float, rule: str
) -> tuple[jax.Array, jax.Array]:
    """``(bits of scale * factor, finite)`` under `rule` (``"torch"`` or ``"cann"``)."""
    if rule == "cann":
        return cann_product(bits, dtype, factor)
    out = torch_product(bits, dtype, factor)
    return out, finite_bits(out, FORMATS[jnp.dtype(dtype)])


# ---- torch's inverse scale and the product with it ----
#
# torch's GradScaler unscales with float32(1 / float64(scale)).  Above 2**126
# that is a float32 subnormal, which XLA flushes (and reads as 0 when it is an
# operand): `inverse_scale` builds it by its bits, `inverse_factors` splits it
# into a normal float32 times a power of two, and `multiply_by_inverse`
# multiplies by the two in turn: torch's bits everywhere except results that
# are subnormal in torch (zero under flush-to-zero at every scale).  The
# native pass (ffi/unscale_and_check.h) splits the same way.

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
    # products apart (tests/operators/unscale_and_check/test_inverse_scale.py pins it).
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


# ---- flags and checks read from the bits ----

# Bit masks of everything but the sign, per float width: a float is "found"
# when any of these bits is set (nonzero, subnormal, inf or NaN).  Comparing
# with `!= 0` instead would let XLA:CPU's denormals-are-zero read a subnormal
# found_inf as zero under jit, and as nonzero eagerly.
_MAGNITUDE_BITS = {
    2: (np.uint16, 0x7FFF),
    4: (np.uint32, 0x7FFFFFFF),
    8: (np.uint64, (1 << 63) - 1),
}


def nonzero_bits(x: jax.Array) -> jax.Array:
    """`x != 0` read from the bits: subnormals and NaN count, -0.0 does not.

    Exact under jit on every backend (no float comparison, so no
    flush-to-zero); bool and integer arrays compare as usual.
    """
    dtype = jnp.dtype(x.dtype)
    if dtype == jnp.bool_:
        return x
    if not jnp.issubdtype(dtype, jnp.floating):
        return x != 0
    uint, mask = _MAGNITUDE_BITS[dtype.itemsize]
    bits = jax.lax.bitcast_convert_type(x, uint)
    return (bits & jnp.asarray(mask, uint)) != 0


def finite_bits(bits: jax.Array, fm: Format) -> jax.Array:
    """Whether `bits` (format `fm`) encode a finite value: the exponent field
    is not all ones."""
    return (bits & fm.inf_bits) != fm.inf_bits


def is_inf(x: jax.Array) -> jax.Array:
    """Whether each value of the float array `x` is +inf or -inf, by its bits."""
    fm = FORMATS[jnp.dtype(x.dtype)]
    mag = lax.bitcast_convert_type(x, fm.bits_dtype) & jnp.asarray(fm.sign_bit - 1, fm.bits_dtype)
    return mag == jnp.asarray(fm.inf_bits, fm.bits_dtype)


def magnitude_above_one(x: jax.Array) -> jax.Array:
    """Whether ``|x| > 1`` for a float32 `x` (NaN included), by its bits."""
    bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    return (bits & _u32(0x7FFFFFFF)) > _u32(0x3F800000)


def finite_amax(x: jax.Array) -> jax.Array:
    """The largest |value| of the finite entries of the float array `x`, as a
    float32 scalar (0 for none), read by the bits: the magnitude bits of
    finite values order as their |values| (subnormals included, which
    XLA:CPU's max would read as 0), mirroring ``FiniteMagnitude`` in
    ffi/unscale_and_check.h.  Not differentiable (no gradient flows)."""
    x = lax.stop_gradient(x)
    dtype = jnp.dtype(x.dtype)
    if dtype == jnp.float64:  # only under x64, where uint64 arrays exist
        bits = lax.bitcast_convert_type(x, jnp.uint64) & jnp.uint64((1 << 63) - 1)
        bits = jnp.where(bits < jnp.uint64(0x7FF << 52), bits, jnp.uint64(0))
        top = jnp.max(bits, initial=jnp.uint64(0)) if x.size else jnp.uint64(0)
        return lax.bitcast_convert_type(top, jnp.float64).astype(jnp.float32)
    fm = FORMATS[dtype]
    bits = lax.bitcast_convert_type(x, fm.bits_dtype).astype(jnp.uint32)
    bits = bits & _u32(fm.sign_bit - 1)
    bits = jnp.where(bits < _u32(fm.inf_bits), bits, _u32(0))
    top = jnp.max(bits, initial=_u32(0)) if x.size else _u32(0)
    return lax.bitcast_convert_type(convert(top, fm, F32), jnp.float32)


def float32_bits(x: jax.Array) -> jax.Array:
    """The bits of `x` widened to float32 (exact), as int32: a value passed
    to the host this way keeps a subnormal that XLA:CPU would flush."""
    return lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)


def from_float32_bits(bits: Any) -> np.ndarray:
    """Host side of `float32_bits`: the values of int32 `bits`, as float64.

    Decoded in integer arithmetic: a report runs on one of XLA's threads,
    whose denormals-are-zero mode would read a float32 subnormal as 0 in any
    float operation, a conversion to float64 included."""

    def value(b: int) -> float:
        sign = -1.0 if b & F32.sign_bit else 1.0
        exp, mant = (b >> 23) & 0xFF, b & 0x7FFFFF
        if exp == 0xFF:
            return sign * math.inf if mant == 0 else math.nan
        if exp == 0:
            return sign * math.ldexp(mant, -149)
        return sign * math.ldexp(mant | 0x800000, exp - 150)

    flat = np.asarray(bits, np.int64).reshape(-1) & 0xFFFFFFFF
    return np.array([value(int(b)) for b in flat], np.float64)


def check_factor_in_float32(value: float, name: str) -> float:
    """`value` if `float32_factor` keeps it finite and nonzero, else a
    ValueError naming `name` (rule="cann" multiplies by float32 factors)."""
    f32 = float32_factor(value)
    if not (math.isfinite(f32) and f32 > 0):
        raise ValueError(
            f"{name}={value!r} is {f32} in float32; rule='cann' multiplies "
            "by float32 factors, which must be finite and nonzero"
        )
    return value
