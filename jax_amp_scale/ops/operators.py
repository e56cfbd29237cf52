"""The operators: check the raw inputs, ask `dispatch` for a plan, run it.

`update_scale` and `amp_update_scale` (one loss-scale update), the gradient
pass over leaves the training layer picked out, and `report` (a Python
function run on the host from inside a step).  Each runs the plan
`dispatch` gives: the pure-JAX reference, or the native custom call.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.lowering import ffi_calls
from jax_amp_scale.ops import dispatch
from jax_amp_scale.ops.dispatch import Backend, check_backend
from jax_amp_scale.reference.gradient_pass import reference_pass
from jax_amp_scale.reference.update_scale import update_scale_reference
from jax_amp_scale.state.scale_state import DEFAULT_RULE, STATIC_FIELDS, ScaleState
from jax_amp_scale.state.tree import nonzero_bits
from jax_amp_scale.state.validation import (
    SCALE_DTYPES,
    SHAPES,
    check_static,
)


def check_scale(x: Any, name: str) -> jax.Array:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        raise TypeError(
            f"{name} must be a float32/float16/bfloat16 array of shape () or (1,), "
            f"got {type(x).__name__}"
        )
    if jnp.dtype(dtype) not in SCALE_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {jnp.dtype(dtype).name}")
    if tuple(x.shape) not in SHAPES:
        raise ValueError(f"{name} must have shape () or (1,), got {tuple(x.shape)}")
    return jnp.asarray(x)


def check_tracker(x: Any, shape: tuple[int, ...], name: str) -> jax.Array:
    dtype = getattr(x, "dtype", None)
    if dtype is None or jnp.dtype(dtype) != jnp.int32:
        got = jnp.dtype(dtype).name if dtype is not None else type(x).__name__
        raise TypeError(f"{name} must be an int32 array, got {got}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have the shape of the scale {shape}, got {tuple(x.shape)}")
    return jnp.asarray(x)


def found_to_bool(found_inf: Any, shape: tuple[int, ...]) -> jax.Array:
    """found_inf (any bool/int/float scalar) -> bool array of `shape`.

    Nonzero, subnormal and NaN mean overflow; +0.0 and -0.0 do not, read
    from the bits in every path (eager, jit, vmap).
    """
    if isinstance(found_inf, bool | numbers.Number) and not isinstance(found_inf, complex):
        return jnp.full(shape, bool(found_inf != 0))  # Python arithmetic: exact
    dtype = getattr(found_inf, "dtype", None)
    if dtype is None:
        raise TypeError(
            f"found_inf must be a bool, int or float scalar, got {type(found_inf).__name__}"
        )
    dtype = jnp.dtype(dtype)
    if not (
        dtype == jnp.bool_
        or jnp.issubdtype(dtype, jnp.integer)
        or jnp.issubdtype(dtype, jnp.floating)
    ):
        raise TypeError(f"found_inf must have a bool, integer or float dtype, got {dtype.name}")
    if tuple(found_inf.shape) not in SHAPES:
        raise ValueError(
            f"found_inf must be a scalar (shape () or (1,)), got shape {tuple(found_inf.shape)}"
        )
    if isinstance(found_inf, np.ndarray | np.generic):  # host value: NumPy is exact
        return jnp.full(shape, bool(np.asarray(found_inf).reshape(()) != 0))
    return nonzero_bits(jnp.asarray(found_inf)).reshape(shape)


def or_across(found: jax.Array, axis_name: Hashable | None) -> jax.Array:
    """`found` OR-reduced over the mapped axis (or tuple of axes) `axis_name`."""
    if axis_name is None:
        return found
    return jax.lax.pmax(found.astype(jnp.int32), axis_name) > 0


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
        handler) or ``"auto"`` (per lowering platform, the faster one measured
        in ``bench/``).
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
    chosen = check_backend(backend)
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
    plan = dispatch.plan(dispatch.UPDATE_SCALE, backend, [scale, tracker, found], attrs)
    if plan.mode == "reference":
        return update_scale_reference(scale, tracker, found, **attrs)

    def reference(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        return update_scale_reference(s, t, f, **attrs)

    return ffi_calls.update_scale_native(
        scale,
        tracker,
        found,
        target=plan.target,
        native_on=plan.platforms,
        fallback=reference if plan.mode == "native" else None,
        guarded=plan.cann_platforms,
        **attrs,
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
    chosen = check_backend(backend)
    scale = check_scale(state.scale, "state.scale")
    tracker = check_tracker(state.growth_tracker, tuple(scale.shape), "state.growth_tracker")
    found = found_to_bool(found_inf, tuple(scale.shape))
    attrs = {name: getattr(state, name) for name in STATIC_FIELDS}
    scale, tracker = update_scale_checked(scale, tracker, found, attrs, chosen, axis_name)
    return dataclasses.replace(state, scale=scale, growth_tracker=tracker)


def unscale_and_check_leaves(
    inv: jax.Array, leaves: list[jax.Array], backend: str
) -> tuple[jax.Array, list[jax.Array]]:
    """``(found_inf, unscaled)`` for nonempty floating `leaves`; `backend` checked."""
    plan = dispatch.plan(dispatch.UNSCALE_AND_CHECK, backend, leaves)
    if plan.mode == "reference":
        return reference_pass(inv, leaves)
    return ffi_calls.unscale_and_check_native(
        inv,
        leaves,
        target=plan.target,
        native_on=plan.platforms,
        reference=reference_pass,
        strict=plan.mode == "strict",
        cann_platforms=plan.cann_platforms,
    )


def report(fn: Callable[..., None], flag: Any, *values: Any, backend: str = "auto") -> jax.Array:
    """`flag` (bool), after ``fn(flag, *values)`` ran on the host, with flat
    NumPy arrays, wherever some element of `flag` is true.  Use the result
    (it keeps the report in the program).  `backend` ``"reference"`` takes
    ``jax.debug.callback`` on every platform.

    An exception `fn` raises reaches the caller when the step's result is
    read, as a ``jax.errors.JaxRuntimeError`` (or a ``ValueError`` from
    JAX's C++ dispatch path) holding its type and text; a warning is issued
    while the step runs (``jax.effects_barrier`` does not wait for it).  A
    program with a report does not export."""
    native_on, target = dispatch.host_report_plan(backend)
    return ffi_calls.report(fn, flag, *values, native_on=native_on, target=target)
