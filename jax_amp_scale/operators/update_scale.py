"""The update-scale operator: one dynamic loss-scale step, ``ScaleState -> ScaleState``.

Its pure-JAX reference (`update_scale_reference`, exact on every platform),
its native call (``jas_update_scale_v2``; the rule in ffi/update_scale.h),
partitioned per element, with the guard after CANN's kernel, and the public
functions (`update_scale`, `amp_update_scale`) that choose between them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning

from jax_amp_scale.mechanisms import custom_call as cc
from jax_amp_scale.mechanisms import floats, handlers
from jax_amp_scale.mechanisms.handlers import Backend
from jax_amp_scale.operators.scale_state import (
    DEFAULT_RULE,
    STATIC_FIELDS,
    ScaleState,
    check_scale,
    check_static,
    check_tracker,
    found_to_bool,
    or_across,
)

# ---- the reference: every platform ------------------------------------------


# Jitted so that an eager (un-jitted) call runs as one compiled kernel instead
# of ~150 dispatched integer ops; inside an outer jit it is simply inlined.
@functools.partial(
    jax.jit, static_argnames=("growth_factor", "backoff_factor", "growth_interval", "rule")
)
def update_scale_reference(
    scale: jax.Array,
    growth_tracker: jax.Array,
    found: jax.Array,
    *,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    rule: str = "torch",
) -> tuple[jax.Array, jax.Array]:
    """One step of the rule, elementwise.

    Args:
      scale: float32/float16/bfloat16 array.
      growth_tracker: int32 array of the same shape.
      found: bool array of the same shape (True: overflow on this step).
      growth_factor, backoff_factor, growth_interval: validated Python numbers.
      rule: ``"torch"`` (`floats.torch_product`) or ``"cann"`` (CANN's
        float32 kernel plus the guard: `floats.cann_product`).

    Returns:
      ``(updated_scale, updated_growth_tracker)`` with the input shapes/dtypes.
    """
    fm = floats.FORMATS[jnp.dtype(scale.dtype)]
    bits = jax.lax.bitcast_convert_type(scale, fm.bits_dtype)
    backed_off, _ = floats.product(bits, scale.dtype, backoff_factor, rule)
    grown, grown_finite = floats.product(bits, scale.dtype, growth_factor, rule)

    # int32 addition wraps in XLA (two's complement), as the spec requires.
    successful = growth_tracker + jnp.int32(1)
    grow = successful == jnp.int32(growth_interval)

    new_bits = jnp.where(found, backed_off, jnp.where(grow & grown_finite, grown, bits))
    new_tracker = jnp.where(found | grow, jnp.zeros_like(growth_tracker), successful)
    return jax.lax.bitcast_convert_type(new_bits, scale.dtype), new_tracker


# ---- the native call -----------------------------------------------------------

# The operator's attributes and the types its handlers decode them as.
ATTRIBUTES = {
    "growth_factor": np.float64,
    "backoff_factor": np.float64,
    "growth_interval": np.int64,
    "rule": str,
}


def call_native(
    target: str, scale: jax.Array, tracker: jax.Array, found: jax.Array, **attrs: Any
) -> tuple[jax.Array, jax.Array]:
    """One ``ffi_call`` of `target` with the operator's `ATTRIBUTES` (all of
    them); `found` is bool."""
    # The operator's dtype rule: found_inf has the scale's dtype (1 or 0).
    found_inf = found.astype(scale.dtype)
    attrs = {name: kind(attrs[name]) for name, kind in ATTRIBUTES.items()}

    def call(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, ...]:
        ffi = jax.ffi.ffi_call(
            target,
            (jax.ShapeDtypeStruct(s.shape, s.dtype), jax.ShapeDtypeStruct(t.shape, jnp.int32)),
            # A vmapped batch of states goes to the handler in one call.
            vmap_method="broadcast_all",
            # In place, as torch_npu calls aclnnAmpUpdateScale.
            input_output_aliases={0: 0, 1: 1},
        )
        return tuple(ffi(s, t, f, **attrs))

    # Each device updates the states it holds (`per_element`); the state
    # varies over shard_map's axes wherever an input does.
    new_scale, new_tracker = per_element(call)(scale, tracker, found_inf)
    return cc.vary_like((new_scale, new_tracker), scale, tracker, found)


def refuse_infinite_growth(
    old_scale: jax.Array, found: jax.Array, new_scale: jax.Array
) -> jax.Array:
    """`new_scale`, except where growth stored an infinite value: there `old_scale`.

    The library's guard around ``aclnnAmpUpdateScale``, whose kernel tests
    finiteness on the float32 product and casts to float16/bfloat16 after
    (hicann/ops-math ``math/amp_update_scale/op_kernel/amp_update_scale.h``
    :146-147, :162-172), so float16 32768 grown x2 is stored as inf.  Without
    `found` the scale changes only by growth, so a finite scale that became
    infinite did so there; the tracker is 0 either way.  Bits only, no float
    comparison.  float32 needs no guard (the kernel's own test covers it).
    """
    if jnp.dtype(old_scale.dtype) == jnp.float32:
        return new_scale
    grew_to_inf = ~found & floats.is_inf(new_scale) & ~floats.is_inf(old_scale)
    return jnp.where(grew_to_inf, old_scale, new_scale)


def _per_element_partitioned(fn: Callable[..., Any], *args: jax.Array) -> Any:
    shape = args[0].shape
    if cc.unwrapped() or any(a.shape != shape for a in args):
        return tuple(cc.typed_like(y, args[0]) for y in fn(*args))
    n_out = len(jax.eval_shape(fn, *args))
    dims = " ".join(f"d{d}" for d in range(len(shape)))
    shardy_rule = ", ".join([dims] * len(args)) + " -> " + ", ".join([dims] * n_out)

    @custom_partitioning
    def call(*xs: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(cc.typed_like(y, xs[0]) for y in fn(*xs))

    def sharding(mesh: Any, arg_shapes: Any) -> Any:
        _, (first,), _ = cc.operand_shardings(mesh, arg_shapes[:1])
        return first

    def partition(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        s = sharding(mesh, arg_shapes)
        return mesh, fn, (s,) * n_out, (s,) * len(arg_shapes)

    def infer(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        return (sharding(mesh, arg_shapes),) * n_out

    call.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=shardy_rule,
    )
    return call(*args)


def per_element(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (arrays of one shape -> a tuple of arrays of that shape, each
    element computed from the same element of the operands alone) run on each
    device's shard, every operand and result sharded like the first."""

    @jax.custom_batching.custom_vmap
    def call(*args: jax.Array) -> Any:
        return _per_element_partitioned(fn, *args)

    @call.def_vmap
    def _batched(axis_size: int, in_batched: Any, *args: jax.Array) -> Any:
        full = [
            a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
            for a, b in zip(args, in_batched, strict=True)
        ]
        out = call(*full)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return call  # type: ignore[no-any-return]


# ---- the choice, and the operator -------------------------------------------


def exact_on_cann(factor: float) -> bool:
    """Whether `factor` is a power of two that is a normal float32 (then
    CANN's float32 product gives torch's bits)."""
    k = floats.power_of_two_exponent(factor)
    return k is not None and -126 <= k <= 127


def cann_serves(rule: str, growth_factor: float, backoff_factor: float) -> bool:
    """Whether aclnnAmpUpdateScale (plus the guard) gives `rule`'s bits."""
    return rule == "cann" or (exact_on_cann(growth_factor) and exact_on_cann(backoff_factor))


def amp_update_scale(
    current_scale: jax.Array,
    growth_tracker: jax.Array,
    found_inf: Any,
    *,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    backend: Backend = "auto",
    axis_name: Hashable | None = None,
    rule: str = DEFAULT_RULE,
) -> tuple[jax.Array, jax.Array]:
    """One dynamic loss-scale update, with the arguments of ``aclnnAmpUpdateScale``.

    Args:
      current_scale: float32, float16 or bfloat16 array of shape ``()`` or ``(1,)``.
      growth_tracker: int32 array of the same shape.
      found_inf: bool/int/float scalar (Python, NumPy or JAX; shape ``()`` or
        ``(1,)``). Nonzero or NaN means this step overflowed.
      growth_factor: what the scale is multiplied by after `growth_interval`
        finite steps; a Python number, finite and > 0 (static).
      backoff_factor: what the scale is multiplied by after an overflow; a
        Python number, finite and > 0 (static).
      growth_interval: Python int in [1, 2**31 - 1] (static).
      backend: ``"reference"`` (pure JAX, every platform), ``"ffi"`` (the
        native custom call; lowering fails clearly on a platform without a
        handler) or ``"auto"`` (per lowering platform: the native handler on
        CPU and Ascend, the reference elsewhere; `auto_backend` answers).
      axis_name: optional mapped axis name, or tuple of names, of
        ``shard_map``/``pmap``/``vmap``; found_inf is OR-reduced across it so
        every replica takes one decision.
      rule: ``"torch"`` (default: torch's float64 product) or ``"cann"``
        (CANN's float32 kernel plus the guard); see `ScaleState`.  Every
        backend gives the chosen rule's bits.

    Returns:
      ``(updated_scale, updated_growth_tracker)``, shapes and dtypes of the inputs.
      The state is not differentiable: gradients through it are zero.
    """
    chosen = handlers.check_backend(backend)
    gf, bf, gi, rule = check_static(growth_factor, backoff_factor, growth_interval, rule)
    scale = check_scale(current_scale, "current_scale")
    tracker = check_tracker(growth_tracker, tuple(scale.shape), "growth_tracker")
    found = found_to_bool(found_inf, tuple(scale.shape))
    attrs = dict(growth_factor=gf, backoff_factor=bf, growth_interval=gi, rule=rule)
    return update_scale_checked(scale, tracker, found, attrs, chosen, axis_name)


def update_scale_checked(
    scale: jax.Array,
    tracker: jax.Array,
    found: jax.Array,
    attrs: dict[str, Any],
    backend: str,
    axis_name: Hashable | None = None,
) -> tuple[jax.Array, jax.Array]:
    """`amp_update_scale` on inputs already checked (`found` a bool array;
    `attrs` the state's growth_factor, backoff_factor, growth_interval, rule)."""
    # The state carries no gradient; stopping it here also means the custom
    # call never needs a JVP rule under jax.grad.
    scale, tracker, found = (jax.lax.stop_gradient(x) for x in (scale, tracker, found))
    found = or_across(found, axis_name)
    plan = handlers.plan(
        handlers.UPDATE_SCALE,
        backend,
        partitions=cc.partitions([scale, tracker, found]),
        not_auto=frozenset()
        if cann_serves(attrs["rule"], attrs["growth_factor"], attrs["backoff_factor"])
        else handlers.CANN_PLATFORMS,
    )
    if plan.mode == "reference":
        return update_scale_reference(scale, tracker, found, **attrs)

    # The custom call on the plan's platforms; elsewhere the reference, or a
    # lowering-time error for backend="ffi".
    def native(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        return call_native(plan.target, s, t, f, **attrs)

    def native_guarded(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        # Ascend: the operator is CANN's kernel, whose growth may store inf.
        new_s, new_t = native(s, t, f)
        return refuse_infinite_growth(s, f, new_s), new_t

    def other(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        if plan.mode == "native":
            return update_scale_reference(s, t, f, **attrs)
        return cc.unavailable(handlers.UPDATE_SCALE, (s, t))  # type: ignore[no-any-return]

    overrides = {p: native_guarded for p in plan.platforms if p in plan.cann_platforms}
    return cc.per_platform(  # type: ignore[no-any-return]
        native, other, scale, tracker, found, native_on=plan.platforms, overrides=overrides
    )


def update_scale(
    state: ScaleState,
    found_inf: Any,
    backend: Backend = "auto",
    *,
    axis_name: Hashable | None = None,
) -> ScaleState:
    """Advances `state` by one step; see `ScaleState` for the rule.

    Args:
      state: the current `ScaleState`.
      found_inf: bool/int/float scalar; nonzero or NaN means overflow.
      backend: ``"auto"``, ``"reference"`` or ``"ffi"`` (see `amp_update_scale`).
      axis_name: optional mapped axis name, or tuple of names, to OR-reduce
        found_inf across.

    Returns:
      A new `ScaleState` with the same static fields.
    """
    if not isinstance(state, ScaleState):
        hint = ""
        if hasattr(state, "inner_state"):
            hint = "; take the ScaleState out with jax_amp_scale.find_scale_state(opt_state)"
        elif hasattr(state, "scale_state"):
            hint = "; a scaler advances with its own .update(found_inf)"
        raise TypeError(f"state must be a ScaleState, got {type(state).__name__}{hint}")
    # The static fields were checked when the state was built; its leaves
    # and the other arguments are checked here.
    chosen = handlers.check_backend(backend)
    scale = check_scale(state.scale, "state.scale")
    tracker = check_tracker(state.growth_tracker, tuple(scale.shape), "state.growth_tracker")
    found = found_to_bool(found_inf, tuple(scale.shape))
    attrs = {name: getattr(state, name) for name in STATIC_FIELDS}
    scale, tracker = update_scale_checked(scale, tracker, found, attrs, chosen, axis_name)
    return dataclasses.replace(state, scale=scale, growth_tracker=tracker)
