"""optax integration (needs optax: ``pip install optax``): `loss_scaled`, the
pieces that compose with it, and `optimizer_step` for hand-written loops.

The one place a user imports the optax layer from: it gathers
``training/loss_scaled.py`` and ``training/pieces.py``."""

from jax_amp_scale.training.loss_scaled import (
    LossScaled,
    LossScaledState,
    SkipReason,
    get_loss_scaled_state,
    loss_scaled,
    optimizer_step,
)
from jax_amp_scale.training.pieces import (
    AccumulationState,
    ClipGradNormState,
    accumulate_gradients,
    clip_grad_norm,
)

__all__ = [
    "AccumulationState",
    "ClipGradNormState",
    "LossScaled",
    "LossScaledState",
    "SkipReason",
    "accumulate_gradients",
    "clip_grad_norm",
    "get_loss_scaled_state",
    "loss_scaled",
    "optimizer_step",
]
