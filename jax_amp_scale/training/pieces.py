"""The optax pieces that compose with `loss_scaled`: `accumulate_gradients`
(outside it) and `clip_grad_norm` (inside it, on unscaled gradients)."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_amp_scale.mechanisms.floats import is_float_leaf, widened
from jax_amp_scale.operators.scale_state import check_int
from jax_amp_scale.training import scaling, serialization
from jax_amp_scale.training.loss_scaled import LossScaled, strongly_typed, typed_as


@serialization.register_namedtuple
class AccumulationState(NamedTuple):
    """State of `accumulate_gradients`.

    Attributes:
      inner_state: the wrapped transformation's state (a `LossScaledState`
        when it wraps `loss_scaled`); changed only on the k-th call.
      mini_step: int32 position inside the window, 0 to k - 1.
      acc_grads: the sum of this window's scaled gradients so far (floating
        leaves in the parameters' dtypes; other leaves hold a placeholder).
    """

    inner_state: Any
    mini_step: jax.Array
    acc_grads: Any


@serialization.register_namedtuple
class ClipGradNormState(NamedTuple):
    """State of `clip_grad_norm`: ``norm``, the float32 global norm of the
    gradients of the last applied step, before clipping (torch's return value)."""

    norm: jax.Array


def _mean(tree: Any, k: int) -> Any:
    """Floating leaves divided by `k` in `compute_dtype`, rounded once back."""
    if k == 1:
        return tree
    return scaling.map_floats(lambda x: widened(lambda w: w / k, x), tree)


def _wait(step: Any, operands: tuple[Any, Any]) -> tuple[Any, Any]:
    """Zero updates and the inner state as it is, typed as `step`'s results."""
    # Types from an abstract trace: the inner step must not run here (its
    # host reports would fire on a half window).
    shapes = jax.eval_shape(step, operands)
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[0])
    return zeros, jax.tree_util.tree_map(typed_as, operands[1], shapes[1])


def _zero_sums(params: Any) -> Any:
    """A window's empty sums: zeros like each floating leaf, a placeholder
    int32 0 for the others."""
    return jax.tree_util.tree_map(
        lambda p: jnp.zeros_like(p) if is_float_leaf(p) else jnp.zeros((), jnp.int32), params
    )


def _add(acc: Any, updates: Any) -> Any:
    """The window's sums after `updates`, in the sums' dtypes (torch's ``.grad``);
    a leaf that is not floating is passed as it comes."""
    return jax.tree_util.tree_map(
        lambda a, g: (a + g).astype(a.dtype) if is_float_leaf(g) else g, acc, updates
    )


def _restart(emit: jax.Array, acc: Any, total: Any) -> Any:
    """The next window's sums: zeros after the k-th call (a select, not a
    product, so no NaN survives), else `total`."""
    return jax.tree_util.tree_map(
        lambda a, t: jax.lax.select(emit, jnp.zeros_like(a), t) if is_float_leaf(a) else a,
        acc,
        total,
    )


def accumulate_gradients(
    inner: optax.GradientTransformation, k: int
) -> optax.GradientTransformationExtraArgs:
    """Gradient accumulation over `k` calls with torch ``GradScaler``'s semantics.

    Wrap the loss-scaled optimizer: ``accumulate_gradients(loss_scaled(inner),
    k)``, and feed every micro-batch's *scaled* gradients.  They are summed in
    the parameters' dtypes (torch's ``.grad``); on the k-th call their mean
    goes to `inner`, which unscales and checks it, steps or skips, and
    updates the scale once per window (an overflow in any micro-batch skips
    the whole window).  The other calls return zero updates and leave
    `inner`'s state untouched.  Divide nothing yourself; room for the larger
    micro-batch gradients: ``amax_scaler(micro_batches=k)``
    (:doc:`/guide/accumulation`).

    Args:
      inner: the optax transformation that gets each window's mean, usually
        ``loss_scaled(...)`` (a ``TypeError`` if it is not an optax
        ``GradientTransformation``).
      k: calls (micro-batches) per window, an int >= 1 (a ``ValueError``
        for one below, a ``TypeError`` for what is not an int); with 1, every
        call is an optimizer step.
    """
    k_ = check_int(k, "k", 1, None)
    if not isinstance(inner, optax.GradientTransformation):
        raise TypeError(
            f"inner must be an optax GradientTransformation, got {type(inner).__name__}"
        )
    # Trainer takes a LossScaled as the whole optimizer: only when it is one.
    kind = LossScaled if isinstance(inner, LossScaled) else optax.GradientTransformationExtraArgs
    inner = optax.with_extra_args_support(inner)

    def init_fn(params: Any) -> AccumulationState:
        return AccumulationState(inner.init(params), jnp.zeros((), jnp.int32), _zero_sums(params))

    def update_fn(
        updates: Any, state: AccumulationState, params: Any = None, **extra_args: Any
    ) -> tuple[Any, AccumulationState]:
        if not isinstance(state, AccumulationState):
            raise TypeError(f"state must be an AccumulationState, got {type(state).__name__}")
        total = _add(state.acc_grads, updates)
        emit = state.mini_step == k_ - 1

        def step(operands: tuple[Any, Any]) -> tuple[Any, Any]:
            g, st = operands
            return strongly_typed(inner.update(_mean(g, k_), st, params, **extra_args))

        wait = functools.partial(_wait, step)
        new_updates, new_inner = jax.lax.cond(emit, step, wait, (total, state.inner_state))
        acc = _restart(emit, state.acc_grads, total)
        mini = jnp.where(emit, 0, state.mini_step + 1).astype(jnp.int32)
        return new_updates, AccumulationState(new_inner, mini, acc)

    return kind(init_fn, update_fn)


def clip_grad_norm(max_norm: float | None) -> optax.GradientTransformation:
    """torch's ``clip_grad_norm_`` as an optax transformation; records the norm.

    Floating leaves are multiplied by ``min(1, max_norm / (norm + 1e-6))``,
    ``norm`` being the float32 global norm (the norm of the per-leaf norms),
    which the state keeps (`ClipGradNormState`).  ``max_norm=None`` records
    the norm without clipping.  Put it inside `loss_scaled` so that it sees
    unscaled gradients: ``loss_scaled(optax.chain(clip_grad_norm(1.0),
    optax.adam(1e-3)))``; a skipped step keeps the previous norm.

    Args:
      max_norm: as in `jax_amp_scale.clip_by_global_norm`, or None to record
        the norm without clipping.
    """
    limit = None if max_norm is None else scaling.check_max_norm(max_norm, "max_norm")

    def update_fn(
        updates: Any, state: ClipGradNormState, params: Any = None
    ) -> tuple[Any, ClipGradNormState]:
        del params
        norm = scaling.global_norm(updates)
        if limit is not None:
            updates = scaling.clip_to_norm(updates, norm, limit)
        return updates, ClipGradNormState(norm)

    return optax.GradientTransformation(
        lambda params: ClipGradNormState(jnp.zeros((), jnp.float32)), update_fn
    )
