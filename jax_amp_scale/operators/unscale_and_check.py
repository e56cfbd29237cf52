"""The gradient pass: unscale the gradients and check them for inf/NaN in one pass.

Its pure-JAX reference (`reference_pass`: each leaf times torch's inverse
scale, checked after unscaling), its native call
(``jas_unscale_and_check_v1``, ffi/unscale_and_check.h; on Ascend CANN's
``aclnnForeachNonFiniteCheckAndUnscale``), partitioned per shard with the
flag OR-reduced by one scalar all-reduce, and the operator over a pytree
(`unscale_and_check`) that chooses between them.

The native pass reads the float32 inverse scale and up to
`LEAVES_PER_CALL` floating leaves, and writes the unscaled leaves in place
and one found-inf flag: each gradient byte read once and written once.
XLA:CPU cannot build that pass (it never fuses a reduction with an
elementwise output).  vmap and jvp take the reference's rules; the results
equal the reference's bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning

from jax_amp_scale.mechanisms import custom_call as cc
from jax_amp_scale.mechanisms import floats, handlers, jax_internals
from jax_amp_scale.operators import float_status

PyTree = Any
Pass = Callable[[jax.Array, list[jax.Array]], tuple[jax.Array, list[jax.Array]]]
# A pass that may also measure each leaf's amax: ``(found, amaxes, unscaled)``,
# `amaxes` a float32 scalar per leaf, or empty when not asked for.
AmaxPass = Callable[
    [jax.Array, list[jax.Array]], tuple[jax.Array, list[jax.Array], list[jax.Array]]
]


# ---- the reference: every platform ------------------------------------------


def unscale_leaf(x: Any, inv: jax.Array | None) -> Any:
    """`x * inv` in `compute_dtype`, rounded once to `x`'s dtype; non-floats pass.

    `inv` is a float32 inverse scale (`floats.inverse_scale`), subnormal ones
    included: the product is exact at every scale (`multiply_by_inverse`).
    """
    if inv is None or not floats.is_float_leaf(x):
        return x
    return floats.widened(lambda w: floats.multiply_by_inverse(w, inv), x)


def leaf_finite(x: Any) -> jax.Array:
    """True (bool scalar) when every value of `x` is finite."""
    # min over a uint8 mask, not all() over a bool one: XLA:CPU vectorizes
    # the uint8 reduction and rewrites a pred one into slower passes.
    if x.size == 0:
        return jnp.array(True)
    return jnp.min(jnp.isfinite(x).astype(jnp.uint8)) == 1


def reference_pass(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
    """``(found_inf, unscaled_leaves)`` for floating `leaves` and float32 `inv`."""
    # Each leaf's check reduces the very expression that produces its
    # unscaled value: the shape a multi-output fusion (XLA:GPU) makes one pass.
    outs = [unscale_leaf(x, inv) for x in leaves]
    return jnp.logical_not(all_finite(outs)), outs


def reference_amax_pass(
    inv: jax.Array, leaves: list[jax.Array]
) -> tuple[jax.Array, list[jax.Array], list[jax.Array]]:
    """`reference_pass` and each leaf's `floats.finite_amax` of the input."""
    found, outs = reference_pass(inv, leaves)
    return found, [floats.finite_amax(x) for x in leaves], outs


def _with_amax(run: Pass) -> AmaxPass:
    def with_none(
        inv: jax.Array, leaves: list[jax.Array]
    ) -> tuple[jax.Array, list[jax.Array], list[jax.Array]]:
        found, outs = run(inv, leaves)
        return found, [], outs

    return with_none


# ---- the native call -----------------------------------------------------------

# Leaves per custom call: XLA's compile time grows with the cube of the
# number of input/output aliases on one instruction, so a large tree is
# split into calls of at most this many leaves (bench/ measured 64 fastest).
LEAVES_PER_CALL = 64


def _one_call(
    target: str, inv: jax.Array, leaves: list[jax.Array], amax: bool
) -> tuple[jax.Array, list[jax.Array], list[jax.Array]]:
    results = [jax.ShapeDtypeStruct((), jnp.bool_)]
    if amax:  # jas_unscale_check_amax_v1: one float32 per leaf after the flag
        results.append(jax.ShapeDtypeStruct((len(leaves),), jnp.float32))
    first = len(results)
    results += [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    # In place, as torch's fused op: each unscaled leaf takes its gradient's
    # buffer.  Inside a step the gradients are dead after this call, so XLA
    # reuses them (no second gradient-sized buffer); a gradient still live
    # elsewhere (a non-donated jit argument, say) gets copied first.
    aliases = {k + 1: k + first for k in range(len(leaves))}
    call = jax.ffi.ffi_call(target, tuple(results), input_output_aliases=aliases)
    found, *rest = call(inv, *leaves)
    if not amax:
        return found, [], rest
    return found, list(rest[0]), rest[1:]


def _calls(target: str, amax: bool) -> AmaxPass:
    def run(
        inv: jax.Array, leaves: list[jax.Array]
    ) -> tuple[jax.Array, list[jax.Array], list[jax.Array]]:
        found: jax.Array | None = None
        amaxes: list[jax.Array] = []
        outs: list[jax.Array] = []
        for start in range(0, len(leaves), LEAVES_PER_CALL):
            group_found, group_amax, group_outs = _one_call(
                target, inv, leaves[start : start + LEAVES_PER_CALL], amax
            )
            found = group_found if found is None else jnp.logical_or(found, group_found)
            amaxes += group_amax
            outs += group_outs
        assert found is not None  # leaves is nonempty
        return cc.vary_like((found, amaxes, outs), inv, leaves)  # type: ignore[no-any-return]

    return run


def cann_one_call(
    target: str, inv: jax.Array, leaves: list[jax.Array]
) -> tuple[jax.Array, list[jax.Array]]:
    """One call of the CANN fused pass on leaves of one dtype, in place.

    `inv` goes to the operator's float32 ``invScale`` as is: torch_npu's
    ``float32(1 / float64(scale))`` bit for bit (`floats.inverse_scale`),
    a float32 subnormal above 2**126: the operator receives the operand
    torch_npu's GradScaler passes it, so the NPU computes what it computes
    for torch_npu.

    found starts as a float32 zero the result aliases: the kernel only ever
    sets it to 1.0, and the handler's launches (256 leaves each) OR into it.
    """
    results = [jax.ShapeDtypeStruct((1,), jnp.float32)]
    results += [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    aliases = {1: 0, **{k + 2: k + 1 for k in range(len(leaves))}}
    call = jax.ffi.ffi_call(target, tuple(results), input_output_aliases=aliases)
    found, *outs = call(inv.reshape((1,)), jnp.zeros((1,), jnp.float32), *leaves)
    return floats.nonzero_bits(found)[0], outs


def cann_fused_pass(target: str, reference: Pass) -> Pass:
    """The fused pass as the CANN operator takes it: one dtype per call,
    float64 and empty leaves through `reference` (the operator takes neither)."""

    def run(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        outs: list[jax.Array | None] = [None] * len(leaves)
        flags: list[jax.Array] = []
        takes = floats.SCALE_DTYPES  # the operator's gradient dtypes
        outside = [
            k for k, x in enumerate(leaves) if x.size == 0 or jnp.dtype(x.dtype) not in takes
        ]
        if outside:
            found, done = reference(inv, [leaves[k] for k in outside])
            flags.append(found)
            for k, y in zip(outside, done, strict=True):
                outs[k] = y
        for dtype in takes:
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
        may_overflow = floats.magnitude_above_one(inv)
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
        found = functools.reduce(jnp.logical_or, flags)
        return cc.vary_like((found, outs), inv, leaves)  # type: ignore[no-any-return]

    return run


def _rule(ranks: Sequence[int], n_amax: int) -> str:
    """The Shardy rule: a replicated scalar, then every leaf elementwise;
    the results also hold `n_amax` replicated scalars after the flag."""
    leaves = [" ".join(f"l{k}d{d}" for d in range(r)) for k, r in enumerate(ranks)]
    operands = ", ".join(["", *leaves])
    results = ", ".join(["", *[""] * n_amax, *leaves])
    return f"{operands} -> {results}"


def _partitioned(run: AmaxPass, ranks: tuple[int, ...], n_amax: int) -> Any:
    @custom_partitioning
    def call(inv: jax.Array, *leaves: jax.Array) -> tuple[jax.Array, ...]:
        found, amaxes, outs = run(inv, list(leaves))
        typed = (cc.typed_like(y, x) for y, x in zip(outs, leaves, strict=True))
        return (found, *amaxes, *typed)

    def shardings(mesh: Any, arg_shapes: Any) -> tuple[Any, list[Any], list[Hashable]]:
        # Without mesh axis names there is no axis to reduce the flag over:
        # every operand replicated (correct, but gathers).
        rep, leaf_shardings, named = cc.operand_shardings(mesh, arg_shapes[1:])
        if not named:
            return rep, leaf_shardings, []
        axes = sorted({a for s in leaf_shardings for a in cc.spec_axes(s)}, key=str)
        return rep, leaf_shardings, axes

    def partition(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        rep, leaf_shardings, axes = shardings(mesh, arg_shapes)

        def local(inv: jax.Array, *leaves: jax.Array) -> tuple[jax.Array, ...]:
            with cc.local_shapes():
                found, amaxes, outs = run(inv, list(leaves))
                if axes and amaxes:  # one all-reduce: the flag (0 or 1) beside the amaxes
                    both = jnp.stack([found.astype(jnp.float32), *amaxes])
                    both = jax.lax.pmax(both, tuple(axes))
                    found, amaxes = both[0] > 0, list(both[1:])
                elif axes:  # one scalar all-reduce: the OR over every shard
                    found = jax.lax.pmax(found.astype(jnp.int32), tuple(axes)) > 0
            return (found, *amaxes, *outs)

        shards = (rep, *leaf_shardings)
        return mesh, local, (rep, *[rep] * n_amax, *leaf_shardings), shards

    def infer(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        rep, leaf_shardings, _ = shardings(mesh, arg_shapes)
        return (rep, *[rep] * n_amax, *leaf_shardings)

    call.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=_rule(ranks, n_amax),
    )
    return call


def elementwise_pass(run: AmaxPass, amax: bool) -> AmaxPass:
    """`run` (``(inv, leaves) -> (found, amaxes, unscaled)``) partitioned per shard.

    `run` must be elementwise in the leaves, its flag an OR and its amaxes
    maxima over their elements: then the OR of the per-shard flags and the
    max of the per-shard amaxes are the global ones, bit for bit, whatever
    the sharding.
    """

    def partitioned(
        inv: jax.Array, leaves: list[jax.Array]
    ) -> tuple[jax.Array, list[jax.Array], list[jax.Array]]:
        if cc.unwrapped():
            found, amaxes, outs = run(inv, leaves)
            return found, amaxes, [cc.typed_like(y, x) for y, x in zip(outs, leaves, strict=True)]
        n_amax = len(leaves) if amax else 0
        found, *rest = _partitioned(run, tuple(x.ndim for x in leaves), n_amax)(inv, *leaves)
        # Each result in one sharding group with its operand: the partitioner
        # carries shardings through the call as through an elementwise unscale.
        _, outs = jax_internals.shard_alike(leaves, list(rest[n_amax:]))
        return found, list(rest[:n_amax]), list(outs)

    return partitioned


# ---- the choice, and the operator -------------------------------------------


def unscale_and_check_leaves(
    inv: jax.Array, leaves: list[jax.Array], backend: str
) -> tuple[jax.Array, list[jax.Array]]:
    """``(found_inf, unscaled)`` for nonempty floating `leaves`; `backend` checked."""
    found, _, outs = _pass(inv, leaves, backend, amax=False)
    return found, outs


def _pass(
    inv: jax.Array, leaves: list[jax.Array], backend: str, *, amax: bool
) -> tuple[jax.Array, list[jax.Array], list[jax.Array]]:
    """``(found_inf, amaxes, unscaled)`` for nonempty floating `leaves` and
    float32 `inv`, under the plan for `backend`: the native pass on the
    plan's platforms (CANN's on Ascend; `amaxes` empty unless `amax`), the
    reference elsewhere, or a lowering-time error there for ``"ffi"``.  The
    reference gives the native pass's vmap and jvp rules."""
    op = handlers.UNSCALE_CHECK_AMAX if amax else handlers.UNSCALE_AND_CHECK
    reference = reference_amax_pass if amax else _with_amax(reference_pass)
    partitions = cc.partitions(leaves)
    if backend == "ffi" and not partitions:
        raise ValueError(
            "unscale_and_check: backend='ffi' cannot take explicitly sharded leaves "
            "on jax < 0.7 (its collective does not lower there); use backend='auto' "
            "or 'reference', jax >= 0.7, or call it inside shard_map"
        )
    plan = handlers.plan(op, backend, partitions=partitions)
    if plan.mode == "reference":
        return reference(inv, leaves)

    def other(
        inv: jax.Array, leaves: list[jax.Array]
    ) -> tuple[jax.Array, list[jax.Array], list[jax.Array]]:
        out = reference(inv, leaves)  # typed like the native branch
        return cc.unavailable(op, out) if plan.mode == "strict" else out

    # Each device runs the pass on its shards; the flag is OR-reduced (`elementwise_pass`).
    native = cc.with_reference_rules(elementwise_pass(_calls(plan.target, amax), amax), reference)
    overrides = {}
    if not amax:  # the amax pass has no CANN form
        cann_run = _with_amax(cann_fused_pass(plan.target, reference_pass))
        cann = cc.with_reference_rules(elementwise_pass(cann_run, False), reference)
        overrides = {p: cann for p in plan.platforms & plan.cann_platforms}
    return cc.per_platform(  # type: ignore[no-any-return]
        native, other, inv, leaves, native_on=plan.platforms, overrides=overrides
    )


def all_finite(tree: PyTree) -> jax.Array:
    """True (bool scalar) when every floating leaf holds only finite values.

    Args:
      tree: any pytree; leaves that are not floating arrays (integer arrays,
        Python numbers) are ignored, and a tree with none is finite.
    """
    flags = [leaf_finite(x) for x in jax.tree_util.tree_leaves(tree) if floats.is_float_leaf(x)]
    if not flags:
        return jnp.array(True)
    return jnp.all(jnp.stack(flags))


def unscale_and_check(
    tree: PyTree, scale: jax.Array | None, backend: str = "auto"
) -> tuple[PyTree, jax.Array]:
    """``(unscaled, found_inf)``: every floating leaf of `tree` times torch's
    ``float32(1 / scale)`` (`scale`: a float array of shape (); None for an
    identity scale, which only checks), and whether any unscaled value is
    inf or NaN.  Non-floating leaves pass; `backend` is checked."""
    unscaled, found, _ = _unscale_tree(tree, scale, backend, amax=False)
    return unscaled, found


def unscale_check_amax(
    tree: PyTree, scale: jax.Array | None, backend: str = "auto"
) -> tuple[PyTree, jax.Array, jax.Array]:
    """`unscale_and_check` and, in the same pass, each floating leaf's amax:
    ``(unscaled, found_inf, leaf_amax)``.

    ``leaf_amax`` is float32 of shape (number of floating leaves,), in
    ``tree_flatten`` order: the largest |value| of each leaf's *finite*
    entries of `tree` as given (the scaled gradients: scaled units), 0 for
    a leaf with none; read by the bits (`floats.finite_amax`), so every
    backend gives the same values.  On CPU the native pass
    (``jas_unscale_check_amax_v1``) reads each gradient once for all three;
    elsewhere (Ascend included) the reference, which XLA:GPU fuses.
    """
    return _unscale_tree(tree, scale, backend, amax=True)  # type: ignore[return-value]


def _unscale_tree(
    tree: PyTree, scale: jax.Array | None, backend: str, *, amax: bool
) -> tuple[PyTree, jax.Array, jax.Array | None]:
    """`unscale_check_amax`'s results, ``leaf_amax`` None unless `amax`."""
    checked = handlers.check_backend(backend)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    floating = [i for i, x in enumerate(leaves) if floats.is_float_leaf(x)]
    if not floating:
        return tree, jnp.array(False), jnp.zeros((0,), jnp.float32) if amax else None
    picked = [leaves[i] for i in floating]
    if scale is None:  # identity scale: nothing to multiply, only the check
        found = float_status.or_flag(jnp.logical_not(all_finite(tree)), picked)
        return tree, found, jnp.stack([floats.finite_amax(x) for x in picked]) if amax else None
    found, amaxes, outs = _pass(floats.inverse_scale(scale), picked, checked, amax=amax)
    for i, u in zip(floating, outs, strict=True):
        leaves[i] = u
    # In saturation mode on Ascend, the hardware's flag too (float_status.py).
    found = float_status.or_flag(found, outs)
    leaf_amax = jax.lax.stop_gradient(jnp.stack(amaxes)) if amax else None
    return jax.tree_util.tree_unflatten(treedef, leaves), found, leaf_amax
