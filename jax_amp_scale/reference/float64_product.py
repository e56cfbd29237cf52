"""torch's product for a float32 scale, in float64 where the platform has it.

torch multiplies the float32 scale by the double factor in float64 and
rounds the result to float32.  On CPU and GPU we do exactly that: one
float64 multiply, which XLA compiles in a fraction of the time of the exact
multi-limb integer product (`exact_product.mul_by_factor_exact`).

It is a primitive, `mul_float32_by_factor_p`, on the scale's bits (uint32
in, uint32 out), so float64 exists only inside its lowering: tracing,
`vmap`, `jvp` and the rest see uint32 arrays whatever ``jax_enable_x64``
says, and each platform gets its own lowering rule (float64 on
`FLOAT64_PLATFORMS`, the integer product everywhere else) without the other
rule being traced or lowered.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import struct
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from jax_amp_scale.reference.exact_product import mul_by_factor_exact

# Platforms whose XLA backend has float64 arithmetic in hardware.  TPU and
# plugin platforms (Ascend among them) may not: they take the integer product.
FLOAT64_PLATFORMS = ("cpu", "cuda", "rocm")


def float64_on() -> contextlib.AbstractContextManager[Any]:
    """Traces float64 ops whatever jax_enable_x64 says."""
    ctx: Any = getattr(jax, "enable_x64", None)
    if ctx is None:  # older jax (0.6) has only the experimental context manager
        ctx = importlib.import_module("jax.experimental").enable_x64
    return ctx(True)


def float64_constant(value: float) -> jax.Array:
    """A float64 constant built from its two 32-bit words.

    A float64 literal can be narrowed to float32 when it is lowered with x64
    off (jax 0.6 does); uint32 constants and a bitcast are lowered as they are.
    """
    (u,) = struct.unpack("<Q", struct.pack("<d", value))
    words = np.array([u & 0xFFFFFFFF, u >> 32], np.uint32)  # low word first
    return jax.lax.bitcast_convert_type(words, jnp.float64)


def mul_float32_in_float64(bits: jax.Array, factor: float) -> jax.Array:
    """Bits of ``value(bits) * factor`` for float32 `bits` (uint32): the
    float64 product, rounded to float32.  Trace it with float64 on.

    Only the multiply is a float op, on operands and a result that float64
    holds as normal numbers.  Around it, integer ops keep XLA:CPU's
    flush-to-zero away: a subnormal scale is widened as ``significand *
    2**-149`` (not by a float32 convert, which reads it as 0), and a product
    below float32's normal range is rounded to a subnormal by a
    round-half-even of ``p * 2**149`` (not by a convert, which flushes it).
    A product below float64's normal range, flushed or not, gives 0 either
    way: it is far below half of float32's smallest subnormal.
    """
    # lax ops only: a jitted jnp helper (jnp.where) would be lowered as a
    # nested function whose platform-index argument is int64 under x64 and
    # int32 in the caller, which breaks multi-platform lowering.
    b = jax.lax.convert_element_type(bits, jnp.uint32)

    def u32(v: int) -> jax.Array:
        return jax.lax.full_like(b, v, jnp.uint32)

    def f64(v: float) -> jax.Array:
        return jax.lax.broadcast_in_dim(float64_constant(v), b.shape, ())

    sign = jax.lax.bitwise_and(b, u32(0x80000000))
    mag = jax.lax.bitwise_and(b, u32(0x7FFFFFFF))
    normal_in = jax.lax.convert_element_type(
        jax.lax.bitcast_convert_type(mag, jnp.float32), jnp.float64
    )
    significand = jax.lax.convert_element_type(jax.lax.bitwise_and(mag, u32(0x7FFFFF)), jnp.float64)
    subnormal_in = jax.lax.mul(significand, f64(2.0**-149))
    x = jax.lax.select(jax.lax.lt(mag, u32(0x00800000)), subnormal_in, normal_in)
    p = jax.lax.mul(x, f64(factor))
    normal_out = jax.lax.bitcast_convert_type(
        jax.lax.convert_element_type(p, jnp.float32), jnp.uint32
    )
    ticks = jax.lax.round(jax.lax.mul(p, f64(2.0**149)), jax.lax.RoundingMethod.TO_NEAREST_EVEN)
    # ticks <= 2**23 here: 2**23 ticks is float32's smallest normal, 2**-126.
    subnormal_out = jax.lax.convert_element_type(ticks, jnp.uint32)
    out = jax.lax.select(jax.lax.ge(p, f64(2.0**-126)), normal_out, subnormal_out)
    out = jax.lax.bitwise_or(sign, out)
    keep = jax.lax.bitwise_or(jax.lax.eq(mag, u32(0x7F800000)), jax.lax.eq(mag, u32(0)))
    out = jax.lax.select(keep, b, out)
    quiet = jax.lax.bitwise_or(b, u32(0x00400000))
    return jax.lax.select(jax.lax.gt(mag, u32(0x7F800000)), quiet, out)


def mul_in_integers(bits: jax.Array, factor: float) -> jax.Array:
    return mul_by_factor_exact(bits, jnp.float32, factor)


mul_float32_by_factor_p = Primitive("jas_mul_float32_by_factor")


def mul_float32_by_factor(bits: jax.Array, factor: float) -> jax.Array:
    """Bits of ``value(bits) * factor`` as torch rounds it, for float32 `bits`
    (a uint32 array) and a static factor."""
    out: jax.Array = mul_float32_by_factor_p.bind(jnp.asarray(bits, jnp.uint32), factor=factor)
    return out


def _lowering(fn: Any, x64: bool) -> Any:
    lower = mlir.lower_fun(fn, multiple_results=False)

    def rule(ctx: Any, bits: Any, *, factor: float) -> Any:
        with float64_on() if x64 else contextlib.nullcontext():
            return lower(ctx, bits, factor=factor)

    return rule


def _eager(bits: jax.Array, *, factor: float) -> jax.Array:
    return jax.jit(functools.partial(mul_float32_by_factor, factor=factor))(bits)


mul_float32_by_factor_p.def_impl(_eager)
# Bits in, bits out: the same shape, dtype and sharding.
mul_float32_by_factor_p.def_abstract_eval(lambda bits, *, factor: bits)
batching.defvectorized(mul_float32_by_factor_p)
mlir.register_lowering(mul_float32_by_factor_p, _lowering(mul_in_integers, x64=False))
for _platform in FLOAT64_PLATFORMS:
    mlir.register_lowering(
        mul_float32_by_factor_p, _lowering(mul_float32_in_float64, x64=True), platform=_platform
    )
