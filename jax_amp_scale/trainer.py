"""`Trainer`: one jit-compatible mixed-precision step for functional code
(docs/guide/training.md shows it in a loop)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp

from jax_amp_scale.operators.scale_state import check_bool, check_int
from jax_amp_scale.operators.unscale_and_check import PyTree
from jax_amp_scale.policy import Policy
from jax_amp_scale.training import replicas, scaling
from jax_amp_scale.training.amax_scaler import AmaxScaler
from jax_amp_scale.training.scaling import instances


class Trainer:
    """Scales the loss, differentiates, averages over replicas, steps or skips:
    a thin loop over `loss_scaled`, like torch's ``GradScaler`` around an optimizer.

    For a new float16 run, pass `amax_scaler()`; keep the default
    `dynamic_scaler()` where the run must take torch's `GradScaler`
    decisions step for step.

    Args:
      optimizer: an optax transformation, wrapped as ``loss_scaled(optimizer,
        scaler)`` (and in `accumulate_gradients` with ``accumulate > 1``); or
        one that `loss_scaled` already built, for its options, with `scaler`
        and `accumulate` left out.  Clipping goes inside:
        ``optax.chain(clip_grad_norm(1.0), optax.adam(1e-3))``.
      scaler: `dynamic_scaler()` (default), `static_scaler(x)`,
        `amax_scaler()`, `no_op_scaler()` or a `ScaleState`.
      policy: optional `Policy`: the loss function gets
        ``policy.cast_to_compute(params)`` and ``cast_to_compute(batch)``
        and its loss is cast with ``cast_to_output``; parameters (and their
        updates) stay in their own dtype.
      has_aux: the loss function returns ``(loss, aux)``.
      axis_name: data parallelism over a mapped axis, as torch DDP: the
        gradients are averaged over it (`replicas.mean_gradients`) before
        the optimizer step, and so is the reported loss.
      accumulate: micro-batches per optimizer step (each `step` call is one;
        parameters change on every `accumulate`-th call).

    `step` returns ``(params, state, metrics)``; ``metrics``: ``loss``
    (unscaled, float32), ``scale`` (the scale this step's loss was multiplied
    by), ``skipped`` (bool: the optimizer step was dropped), ``found_inf``
    (bool, False inside a window), ``reason`` (int32 `SkipReason`),
    ``consecutive_overflows``, ``skipped_steps`` and ``total_steps`` (int32
    optimizer steps, after this call), ``grad_norm`` (when a `clip_grad_norm`
    is in the optimizer), ``amax`` and ``headroom_used`` (float32, with
    `amax_scaler`) and ``aux`` with ``has_aux``.  With no update applied the
    params come back bit for bit.
    """

    def __init__(
        self,
        optimizer: Any,
        scaler: Any = None,
        *,
        policy: Policy | None = None,
        has_aux: bool = False,
        axis_name: Hashable | None = None,
        accumulate: int = 1,
    ) -> None:
        try:  # optax is an optional extra
            import optax  # noqa: F401

            from jax_amp_scale.training import loss_scaled as ls
            from jax_amp_scale.training import pieces
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                f"Trainer needs optax ({e}); install it with pip install optax"
            ) from e
        if policy is not None and not isinstance(policy, Policy):
            raise TypeError(f"policy must be a Policy or None, got {type(policy).__name__}")
        k = check_int(accumulate, "accumulate", 1, None)
        if isinstance(optimizer, ls.LossScaled):
            if scaler is not None or k != 1:
                raise ValueError(
                    "optimizer is already loss-scaled: set the scaler in loss_scaled(...) and "
                    "the accumulation with accumulate_gradients(...), not in Trainer"
                )
            tx = optimizer
        else:
            tx = ls.loss_scaled(optimizer, scaler)
            if k > 1:
                tx = pieces.accumulate_gradients(tx, k)
        self.optimizer = optimizer
        self.policy = policy
        self.has_aux = check_bool(has_aux, "has_aux")
        self.axis_name = axis_name
        self.tx = tx

    def init(self, params: PyTree) -> Any:
        """The initial optimizer state for `params`.

        Args:
          params: the parameters, a pytree of arrays (what `step` takes).
        """
        return self.tx.init(params)

    def step(
        self,
        params: PyTree,
        state: Any,
        batch: Any,
        loss_fn: Callable[..., Any],
    ) -> tuple[PyTree, Any, dict[str, Any]]:
        """One training step (one micro-batch with ``accumulate``); see the class.

        Args:
          params: the parameters, a pytree of arrays.
          state: the optimizer state, from `init` or the previous `step`.
          batch: what ``loss_fn`` takes as its second argument, any pytree
            (with a ``policy``, passed through ``policy.cast_to_compute``).
          loss_fn: ``loss_fn(params, batch)`` returning a floating scalar
            loss, or ``(loss, aux)`` with ``has_aux``; a ``TypeError`` if it
            is not callable, its loss is not a floating scalar, or with
            ``has_aux`` it does not return a pair.
        """
        import optax

        from jax_amp_scale.training import loss_scaled as ls
        from jax_amp_scale.training import pieces

        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        scaled = self._scaled_loss(loss_fn, batch, state)
        grads, (loss, aux) = jax.grad(scaled, has_aux=True)(params)
        if self.axis_name is not None:
            grads = replicas.mean_gradients(grads, self.axis_name, loss=loss)
            loss = jax.lax.pmean(loss, self.axis_name)
        updates, new_state = self.tx.update(grads, state, params)
        metrics = {"loss": loss.astype(jnp.float32), "scale": scaling.scale_value(state)}
        metrics.update(_outcome(state, new_state))
        scaler = ls.get_loss_scaled_state(new_state).scaler
        if isinstance(scaler, AmaxScaler):  # its telemetry, beside the skip's reason
            metrics["amax"], metrics["headroom_used"] = scaler.amax, scaler.headroom_used
        held = metrics["reason"] != int(ls.SkipReason.APPLIED)
        new_params = optax.apply_updates(params, updates)
        # Zero updates would still turn -0.0 into +0.0: keep the input bits.
        new_params = ls.keep_where(held, params, new_params)
        norms = instances(new_state, pieces.ClipGradNormState)
        if norms:
            metrics["grad_norm"] = norms[0].norm
        if self.has_aux:
            metrics["aux"] = aux
        return new_params, new_state, metrics

    def _scaled_loss(
        self, loss_fn: Callable[..., Any], batch: Any, state: Any
    ) -> Callable[[PyTree], tuple[jax.Array, tuple[jax.Array, Any]]]:
        """``params -> (scaled loss, (loss, aux))``: `loss_fn` under the policy,
        its result checked, for ``jax.grad(..., has_aux=True)``."""
        policy, has_aux = self.policy, self.has_aux

        def scaled(p: PyTree) -> tuple[jax.Array, tuple[jax.Array, Any]]:
            b = batch
            if policy is not None:
                p, b = policy.cast_to_compute(p), policy.cast_to_compute(batch)
            out = loss_fn(p, b)
            if has_aux and not (isinstance(out, tuple | list) and len(out) == 2):
                raise TypeError("with has_aux=True, loss_fn must return a pair (loss, aux)")
            loss, aux = out if has_aux else (out, None)
            if policy is not None:
                loss = policy.cast_to_output(loss)
            scaling.check_scalar_loss(loss, "loss_fn", has_aux)
            return scaling.scale_loss(loss, state), (loss, aux)

        return scaled


def _outcome(state: Any, new_state: Any) -> dict[str, jax.Array]:
    """The step's metrics read from the two optimizer states' counters."""
    from jax_amp_scale.training import loss_scaled as ls

    old, new = ls.get_loss_scaled_state(state), ls.get_loss_scaled_state(new_state)
    stepped = new.total_steps > old.total_steps
    skipped = new.skipped_steps > old.skipped_steps
    found = stepped & new.found_inf
    why = ls.SkipReason
    reason = jnp.select(
        [~stepped, skipped & found, skipped],
        [why.ACCUMULATING, why.OVERFLOW, why.NONFINITE_UPDATE],
        why.APPLIED,
    ).astype(jnp.int32)
    return {
        "skipped": skipped,
        "found_inf": found,
        "reason": reason,
        "consecutive_overflows": new.consecutive_overflows,
        "skipped_steps": new.skipped_steps,
        "total_steps": new.total_steps,
    }
