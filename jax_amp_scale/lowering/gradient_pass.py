"""The fused native gradient pass: unscale and check every leaf in one pass.

One XLA FFI custom call (``jas_unscale_and_check_v1``, ffi/unscale_and_check_cpu.cc)
per group of up to `LEAVES_PER_CALL` leaves takes the float32 inverse scale
and the group's floating gradient leaves, and returns the unscaled leaves and
one found-inf flag: each gradient byte is read once and written once, on
XLA's intra-op threads.  XLA:CPU cannot build that pass itself (it never
fuses a reduction with an elementwise output, so the pure path runs one
kernel and one mask reduction per leaf, and compiles them all).

Under ``vmap`` a batched call runs the reference vmapped, ``jvp``/``grad``
take the reference's tangents, and under ``shard_map`` results carry the
inputs' varying axes (`custom_call`).  Results equal the reference's bit for
bit (tests/test_fused_unscale.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp

from jax_amp_scale.lowering.custom_call import (
    per_platform,
    unavailable,
    vary_like,
    with_reference_rules,
)
from jax_amp_scale.lowering.partitioning import elementwise_pass
from jax_amp_scale.platforms import handlers
from jax_amp_scale.reference.gradient_pass import leaf_finite
from jax_amp_scale.state.tree import nonzero_bits

Pass = Callable[[jax.Array, list[jax.Array]], tuple[jax.Array, list[jax.Array]]]

# Leaves per custom call.  XLA's compile time grows with the cube of the
# number of input/output aliases on one instruction (one call over 2,000
# aliased leaves: 30 s; 4,000: 209 s), so a large tree is split into calls of
# at most this many leaves: 10,000 leaves then compile in about the time of a
# plain copy of the same tree.  Measured on XLA:CPU (jax 0.10); 64 was the
# fastest of 32, 64, 128 and 256 at 4,000 leaves.
LEAVES_PER_CALL = 64


def _one_call(
    target: str, inv: jax.Array, leaves: list[jax.Array]
) -> tuple[jax.Array, list[jax.Array]]:
    results = [jax.ShapeDtypeStruct((), jnp.bool_)]
    results += [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    # In place, as torch's fused op: each unscaled leaf takes its gradient's
    # buffer.  Inside a step the gradients are dead after this call, so XLA
    # reuses them (no second gradient-sized buffer); a gradient still live
    # elsewhere (a non-donated jit argument, say) gets copied first.
    aliases = {k + 1: k + 1 for k in range(len(leaves))}
    call = jax.ffi.ffi_call(target, tuple(results), input_output_aliases=aliases)
    found, *outs = call(inv, *leaves)
    return found, outs


def _calls(target: str) -> Pass:
    def run(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        found: jax.Array | None = None
        outs: list[jax.Array] = []
        for start in range(0, len(leaves), LEAVES_PER_CALL):
            group_found, group_outs = _one_call(
                target, inv, leaves[start : start + LEAVES_PER_CALL]
            )
            found = group_found if found is None else jnp.logical_or(found, group_found)
            outs += group_outs
        assert found is not None  # leaves is nonempty
        return vary_like((found, outs), inv, leaves)  # type: ignore[no-any-return]

    return run


# dtypes aclnnForeachNonFiniteCheckAndUnscale takes (hicann/ops-nn
# foreach/foreach_non_finite_check_and_unscale/op_host/
# foreach_non_finite_check_and_unscale_def.cpp).
_CANN_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def cann_one_call(
    target: str, inv: jax.Array, leaves: list[jax.Array]
) -> tuple[jax.Array, list[jax.Array]]:
    """One call of the CANN fused pass on leaves of one dtype, in place.

    `inv` goes to the operator's float32 ``invScale`` as is: torch_npu's
    ``float32(1 / float64(scale))`` bit for bit (`reference.inverse`),
    a float32 subnormal above 2**126.  What is exact: the operator receives
    the operand torch_npu's GradScaler passes it, so the NPU computes what it
    computes for torch_npu.  Whether the device's float32 multiply honours a
    subnormal operand is the kernel's arithmetic, not visible in its source.
    The CANN test double multiplies in IEEE's default mode.

    found starts as a float32 zero the result aliases: the kernel only ever
    sets it to 1.0, and the handler's launches (256 leaves each) OR into it.
    """
    results = [jax.ShapeDtypeStruct((1,), jnp.float32)]
    results += [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    aliases = {1: 0, **{k + 2: k + 1 for k in range(len(leaves))}}
    call = jax.ffi.ffi_call(target, tuple(results), input_output_aliases=aliases)
    found, *outs = call(inv.reshape((1,)), jnp.zeros((1,), jnp.float32), *leaves)
    return nonzero_bits(found)[0], outs


def cann_fused_pass(target: str, reference: Pass) -> Pass:
    """The fused pass as the CANN operator takes it: one dtype per call,
    float64 and empty leaves through `reference` (the operator takes neither)."""

    def run(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        outs: list[jax.Array | None] = [None] * len(leaves)
        flags: list[jax.Array] = []
        outside = [
            k for k, x in enumerate(leaves) if x.size == 0 or jnp.dtype(x.dtype) not in _CANN_DTYPES
        ]
        if outside:
            found, done = reference(inv, [leaves[k] for k in outside])
            flags.append(found)
            for k, y in zip(outside, done, strict=True):
                outs[k] = y
        for dtype in _CANN_DTYPES:
            idx = [k for k, x in enumerate(leaves) if outs[k] is None and x.dtype == dtype]
            for start in range(0, len(idx), LEAVES_PER_CALL):
                part = idx[start : start + LEAVES_PER_CALL]
                found, done = cann_one_call(target, inv, [leaves[k] for k in part])
                flags.append(found)
                for k, y in zip(part, done, strict=True):
                    outs[k] = y
        # The kernel checks the scaled *input* (n_d.h:187-209); the library's
        # flag is about the unscaled value.  They differ only when a finite
        # input overflows once unscaled, which needs |inv| > 1 (a scale
        # below 1) or a NaN inv: only then, rarely, the outputs are checked.
        inv_bits = jax.lax.bitcast_convert_type(inv.astype(jnp.float32), jnp.uint32)
        may_overflow = (inv_bits & jnp.uint32(0x7FFFFFFF)) > jnp.uint32(0x3F800000)
        natives = [y for k, y in enumerate(outs) if k not in outside]
        if natives:
            flags.append(
                jax.lax.cond(
                    may_overflow.reshape(()),
                    lambda ys: jnp.logical_not(jnp.all(jnp.stack([leaf_finite(y) for y in ys]))),
                    lambda ys: jnp.array(False),
                    natives,
                )
            )
        found = flags[0]
        for f in flags[1:]:
            found = jnp.logical_or(found, f)
        return vary_like((found, outs), inv, leaves)  # type: ignore[no-any-return]

    return run


def unscale_and_check_native(
    inv: jax.Array,
    leaves: list[jax.Array],
    *,
    target: str,
    native_on: Iterable[str],
    reference: Pass,
    strict: bool,
    cann_platforms: Iterable[str] = (),
) -> tuple[jax.Array, list[jax.Array]]:
    """``(found_inf, unscaled_leaves)`` through the native pass on `native_on`.

    Args:
      inv: float32 scalar, ``1 / scale``.
      leaves: floating arrays (float16, bfloat16, float32, float64), nonempty.
      target: the FFI target name.
      native_on: lowering platforms that run the native pass.
      reference: the pure pass with the same signature and results; it gives
        the vmap and jvp rules, and runs on the other platforms.
      strict: on the other platforms fail at lowering (``backend="ffi"``)
        rather than run `reference` (``"auto"``).
      cann_platforms: platforms of `native_on` whose handler is CANN's
        ``aclnnForeachNonFiniteCheckAndUnscale`` (its calling convention).
    """

    def other(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        out = reference(inv, leaves)  # typed like the native branch
        return unavailable(handlers.UNSCALE_AND_CHECK, out) if strict else out

    # Each device runs the pass on its shards; the flag is OR-reduced (partitioning.py).
    native = with_reference_rules(elementwise_pass(_calls(target)), reference)
    cann = with_reference_rules(elementwise_pass(cann_fused_pass(target, reference)), reference)
    overrides = {p: cann for p in native_on if p in frozenset(cann_platforms)}
    return per_platform(  # type: ignore[no-any-return]
        native, other, inv, leaves, native_on=native_on, overrides=overrides
    )
