"""`loss_scaled`: an optax wrapper that unscales, checks and skips overflow steps.

Usage::

    tx = jax_amp_scale.optax.loss_scaled(optax.adam(1e-3))
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        def scaled_loss(p):
            return jax_amp_scale.scale_loss(loss_fn(p, batch), opt_state)
        grads = jax.grad(scaled_loss)(params)          # scaled gradients
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_amp_scale.ops.update_scale import or_across
from jax_amp_scale.state.scale_state import ScaleState
from jax_amp_scale.state.validation import Backend, check_backend, check_bool
from jax_amp_scale.training import helpers, loss_scale_kinds

__all__ = ["LossScaledState", "get_loss_scaled_state", "loss_scaled"]


class LossScaledState(NamedTuple):
    """State of `loss_scaled`.

    Attributes:
      scale: the scale kind (`DynamicScale`, `StaticScale` or `NoOpScale`); it
        holds the one core `ScaleState` of this state (``scale_state``).
      inner_state: the wrapped transformation's state; never changed on a
        skipped step.
      found_inf: bool scalar, whether the last update saw inf/NaN.
      skipped_steps: int32, updates dropped because of inf/NaN so far.
      total_steps: int32, calls to ``update`` so far (skipped ones included).
    """

    scale: loss_scale_kinds.DynamicScale | loss_scale_kinds.StaticScale | loss_scale_kinds.NoOpScale
    inner_state: Any
    found_inf: jax.Array
    skipped_steps: jax.Array
    total_steps: jax.Array

    @property
    def loss_scale(self) -> jax.Array:
        """The current loss scale (what `jax_amp_scale.scale_loss` multiplies by)."""
        return self.scale.loss_scale

    @property
    def scale_state(self) -> ScaleState:
        """The core `ScaleState`."""
        return self.scale.scale_state

    @property
    def is_identity(self) -> bool:
        return self.scale.is_identity


def get_loss_scaled_state(opt_state: Any) -> LossScaledState:
    """The one `LossScaledState` inside `opt_state` (for example a chain's tuple)."""
    found = [
        x
        for x in jax.tree_util.tree_leaves(
            opt_state, is_leaf=lambda x: isinstance(x, LossScaledState)
        )
        if isinstance(x, LossScaledState)
    ]
    if len(found) != 1:
        raise ValueError(f"expected exactly one LossScaledState in opt_state, found {len(found)}")
    return found[0]


def _strongly_typed(tree: Any) -> Any:
    # Weak-typed leaves would make the two cond branches' types differ.
    return jax.tree_util.tree_map(
        lambda x: jax.lax.convert_element_type(x, jnp.result_type(x)), tree
    )


def _update_unless(
    found: jax.Array,
    inner: optax.GradientTransformationExtraArgs,
    grads: Any,
    inner_state: Any,
    params: Any,
    extra_args: dict[str, Any],
    *,
    by_select: bool,
    flag_in_memory: bool = False,
) -> tuple[Any, Any]:
    """inner.update(...), or (zero updates, inner_state unchanged) when `found`.

    `by_select` picks how the step is skipped; both give the same bits.
    A select per leaf fuses into that leaf's update kernel (no extra pass, and
    the fewest kernels to compile), but only when `found` is a value XLA
    cannot recompute: the fused native pass's flag.  A flag built from
    per-leaf reductions is recomputed inside every leaf's kernel (compile
    time then grows with the square of the tree) and the unscale fuses into
    each reader: for those, one ``lax.cond`` (bench/RESULTS.md).
    `flag_in_memory`: `found` is one native call's own result (no OR of
    several), so the selects can read it as it is.
    """

    def apply(operands: tuple[Any, Any]) -> tuple[Any, Any]:
        g, st = operands
        return _strongly_typed(inner.update(g, st, params, **extra_args))

    if by_select:
        new_updates, new_state = apply((grads, inner_state))
        # A cond with constant branches hands the selects one materialised
        # flag (the OR of several native calls, say) that XLA cannot copy
        # into each kernel; optimization_barrier does not stop that on XLA:CPU.
        # With one native call the flag already is such a value; the cond
        # would only cost compile time (a conditional and two computations).
        if not flag_in_memory:
            found = jax.lax.cond(found, lambda: jnp.bool_(True), lambda: jnp.bool_(False))
        updates = jax.tree_util.tree_map(
            lambda u: jnp.where(found, jnp.zeros_like(u), u), new_updates
        )
        kept = jax.tree_util.tree_map(
            lambda old, new: jnp.where(found, old.astype(new.dtype), new), inner_state, new_state
        )
        return updates, kept

    def skip(operands: tuple[Any, Any]) -> tuple[Any, Any]:
        # Built from the traced update so both branches carry the same
        # shardings and shard_map varying axes; the update is dead code here
        # and XLA removes it.  select(True, old, new) keeps old's bits exactly.
        new_updates, new_state = apply(operands)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, new_updates)
        kept = jax.tree_util.tree_map(
            lambda old, new: jnp.where(True, old.astype(new.dtype), new), operands[1], new_state
        )
        return zeros, kept

    return jax.lax.cond(found, skip, apply, (grads, inner_state))


def loss_scaled(
    inner: optax.GradientTransformation,
    scale: Any = None,
    drop_overflow_update: bool | None = None,
    *,
    axis_name: Hashable | None = None,
    backend: Backend = "auto",
) -> optax.GradientTransformationExtraArgs:
    """Wraps `inner` so that it receives unscaled, checked gradients.

    Args:
      inner: any optax transformation or chain, or an ``optax.MultiSteps``
        (extra args are forwarded).
      scale: a scale kind (`dynamic_scale()`, `static_scale(x)`,
        `no_op_scale()`) or a `ScaleState`; default ``dynamic_scale()``
        (torch GradScaler's defaults).
      drop_overflow_update: on a step with inf/NaN, return zero updates and
        keep ``inner_state`` (True) or apply the inner update anyway (False).
        Default: the kind's own choice (True unless a static/no-op kind says
        otherwise).
      axis_name: optional mapped axis; found_inf is OR-reduced across it so
        all replicas skip together and keep equal scales.
      backend: the core `update_scale` backend (``"auto"``, ``"reference"``,
        ``"ffi"``).  `unscale_and_check` runs with ``"auto"`` (the native
        fused pass on a one-device CPU process), or ``"reference"`` when
        `backend` is ``"reference"``.

    ``update(grads, state, params=None, **extra_args)`` expects the gradients
    of the *scaled* loss (``scale_loss(loss, state)``); it unscales them,
    checks them, advances the scale with `update_scale`, and returns the
    inner updates, or zeros with ``inner_state`` untouched (its step count
    too) when the step is dropped.
    """
    if isinstance(inner, optax.MultiSteps):
        inner = inner.gradient_transformation()
    if not isinstance(inner, optax.GradientTransformation):
        raise TypeError(
            "inner must be an optax GradientTransformation (or optax.MultiSteps), "
            f"got {type(inner).__name__}"
        )
    kind = loss_scale_kinds.as_loss_scale(scale)
    if drop_overflow_update is None:
        drop = kind.drop_overflow_update
    else:
        drop = check_bool(drop_overflow_update, "drop_overflow_update")
    backend = check_backend(backend)  # type: ignore[assignment]
    # "ffi" asks for the native update-scale operator (Ascend's, say); the
    # fused gradient pass exists on CPU only, so it stays "auto" there.
    unscale_backend: Backend = "reference" if backend == "reference" else "auto"
    inner = optax.with_extra_args_support(inner)

    def init_fn(params: Any) -> LossScaledState:
        return LossScaledState(
            scale=kind,
            inner_state=inner.init(params),
            found_inf=jnp.array(False),
            skipped_steps=jnp.zeros((), jnp.int32),
            total_steps=jnp.zeros((), jnp.int32),
        )

    def update_fn(
        updates: Any, state: LossScaledState, params: Any = None, **extra_args: Any
    ) -> tuple[Any, LossScaledState]:
        if not isinstance(state, LossScaledState):
            raise TypeError(f"state must be a LossScaledState, got {type(state).__name__}")
        grads, found = state.scale.unscale_and_check(updates, backend=unscale_backend)
        found = or_across(found, axis_name)
        new_scale = state.scale.adjust(found, backend=backend)
        skipped = state.skipped_steps
        if drop:
            calls = helpers.fused_pass_calls(updates, unscale_backend)
            by_select = not state.scale.is_identity and calls > 0
            new_updates, new_inner = _update_unless(
                found,
                inner,
                grads,
                state.inner_state,
                params,
                extra_args,
                by_select=by_select,
                flag_in_memory=calls == 1 and axis_name is None,
            )
            skipped = skipped + found.astype(jnp.int32)
        else:
            new_updates, new_inner = inner.update(grads, state.inner_state, params, **extra_args)
        return new_updates, LossScaledState(
            scale=new_scale,
            inner_state=new_inner,
            found_inf=found,
            skipped_steps=skipped,
            total_steps=state.total_steps + 1,
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
