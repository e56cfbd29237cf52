"""optax integration (needs optax: ``pip install optax``).

The core: `loss_scaled(inner, scaler)`, the `LossScaled` transformation it
returns, and its state `LossScaledState`.
Pieces that compose with it: `accumulate_gradients` (outside: torch
``GradScaler``'s accumulation), `clip_grad_norm` (inside: clipping after
unscaling), `optimizer_step` (torch's ``scaler.step(opt)`` for a hand-written
loop), `get_loss_scaled_state`, and `SkipReason` (`Trainer`'s metric).
"""

from jax_amp_scale.training.optax import (
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
