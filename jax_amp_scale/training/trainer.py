"""`Trainer`: one jit-compatible mixed-precision step for functional code.

Usage::

    trainer = jas.Trainer(optax.adam(1e-3), jas.dynamic_scale(), policy=jas.get_policy("O2"))
    state = trainer.init(params)
    step = jax.jit(trainer.step, static_argnums=3)
    for batch in data:
        params, state, metrics = step(params, state, batch, loss_fn)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp

from jax_amp_scale.state.validation import Backend, check_bool
from jax_amp_scale.training import helpers, replicas
from jax_amp_scale.training.policy import Policy

PyTree = Any


@dataclasses.dataclass(frozen=True, eq=False)
class Trainer:
    """Scales the loss, differentiates, unscales, checks, updates, skips.

    Attributes:
      optimizer: an optax transformation (or ``optax.MultiSteps``); it sees
        unscaled, finite gradients only.
      scale: a scale kind (`dynamic_scale()`, `static_scale(x)`,
        `no_op_scale()`) or a `ScaleState`; default ``dynamic_scale()``.
      policy: optional `Policy`: the loss function then gets
        ``policy.cast_to_compute(params)`` and ``policy.cast_to_compute(batch)``
        and its loss is cast with ``cast_to_output``; parameters (and their
        updates) stay in their own dtype.
      has_aux: the loss function returns ``(loss, aux)``.
      axis_name: optional mapped axis for data parallelism: gradients and the
        loss are averaged over it (``lax.pmean``) and found_inf is OR-reduced,
        so every replica takes the same step.
      drop_overflow_update: None (the kind's choice), True or False.
      accumulate, skip_nonfinite_updates, max_consecutive_overflows,
        grad_norm, clip_grad_norm, overflow_callbacks: as in `loss_scaled` (each `step` call is
        then one micro-batch; params change on every `accumulate`-th call).
      backend: the core `update_scale` backend, as in `loss_scaled`.

    ``init(params)`` returns the optimizer state, a
    `jax_amp_scale.optax.LossScaledState`.  ``step(params, state, batch,
    loss_fn)`` returns ``(params, state, metrics)``; ``loss_fn(params, batch)``
    returns a floating scalar loss (or ``(loss, aux)``).  ``metrics`` holds
    ``loss`` (the unscaled loss, float32), ``scale`` (the scale this step's
    loss was multiplied by), ``skipped`` (bool: the optimizer step was
    dropped, for an overflow or a non-finite update), ``found_inf`` (bool),
    ``reason`` (int32 `SkipReason`: 0 applied, 1 overflow, 2 non-finite
    update, 3 accumulating), ``consecutive_overflows``, ``skipped_steps`` and
    ``total_steps`` (int32, after this step), ``grad_norm`` (float32, with
    ``grad_norm=True`` or ``clip_grad_norm``) and ``aux`` with ``has_aux``.
    Whenever the update is not applied the returned params are the input
    params, bit for bit.
    """

    optimizer: Any
    scale: Any = None
    policy: Policy | None = None
    has_aux: bool = False
    axis_name: Hashable | None = None
    drop_overflow_update: bool | None = None
    backend: Backend = "auto"
    accumulate: int = 1
    skip_nonfinite_updates: bool | None = None
    max_consecutive_overflows: int | None = None
    grad_norm: bool = False
    clip_grad_norm: float | None = None
    overflow_callbacks: bool = True
    tx: Any = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        try:  # optax is an optional extra
            from jax_amp_scale.training.optax import loss_scaled
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                f"Trainer needs optax ({e}); install it with pip install 'jax-amp-scale[optax]'"
            ) from e

        if self.policy is not None and not isinstance(self.policy, Policy):
            raise TypeError(f"policy must be a Policy or None, got {type(self.policy).__name__}")
        check_bool(self.has_aux, "has_aux")
        tx = loss_scaled(
            self.optimizer,
            self.scale,
            self.drop_overflow_update,
            axis_name=self.axis_name,
            backend=self.backend,
            accumulate=self.accumulate,
            skip_nonfinite_updates=self.skip_nonfinite_updates,
            max_consecutive_overflows=self.max_consecutive_overflows,
            grad_norm=self.grad_norm,
            clip_grad_norm=self.clip_grad_norm,
            overflow_callbacks=self.overflow_callbacks,
        )
        object.__setattr__(self, "tx", tx)

    def init(self, params: PyTree) -> Any:
        """The initial optimizer state for `params`."""
        return self.tx.init(params)

    def step(
        self,
        params: PyTree,
        state: Any,
        batch: Any,
        loss_fn: Callable[..., Any],
    ) -> tuple[PyTree, Any, dict[str, Any]]:
        """One training step; see the class docstring."""
        import optax

        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        policy = self.policy
        has_aux = self.has_aux

        def scaled(p: PyTree) -> tuple[jax.Array, tuple[jax.Array, Any]]:
            b = batch
            if policy is not None:
                p, b = policy.cast_to_compute(p), policy.cast_to_compute(batch)
            out = loss_fn(p, b)
            loss, aux = out if has_aux else (out, None)
            if policy is not None:
                loss = policy.cast_to_output(loss)
            helpers.check_scalar_loss(loss, "loss_fn", has_aux)
            return helpers.scale_loss(loss, state), (loss, aux)

        grads, (loss, aux) = jax.grad(scaled, has_aux=True)(params)
        if self.axis_name is not None:
            grads = replicas.mean_gradients(grads, self.axis_name)
            loss = jax.lax.pmean(loss, self.axis_name)
        scale_used = helpers.scale_value(state)
        updates, new_state = self.tx.update(grads, state, params)
        skipped = new_state.skipped_steps > state.skipped_steps
        held = new_state.reason != 0  # SkipReason.APPLIED
        new_params = optax.apply_updates(params, updates)
        # Zero updates would still turn -0.0 into +0.0: keep the input bits.
        new_params = jax.tree_util.tree_map(
            lambda old, new: jnp.where(held, old, new), params, new_params
        )
        metrics = {
            "loss": loss.astype(jnp.float32),
            "scale": scale_used,
            "skipped": skipped,
            "found_inf": new_state.found_inf,
            "reason": new_state.reason,
            "consecutive_overflows": new_state.consecutive_overflows,
            "skipped_steps": new_state.skipped_steps,
            "total_steps": new_state.total_steps,
        }
        if new_state.grad_norm is not None:
            metrics["grad_norm"] = new_state.grad_norm
        if has_aux:
            metrics["aux"] = aux
        return new_params, new_state, metrics
