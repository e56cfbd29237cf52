"""optax integration (``pip install "jax-amp-scale[optax]"``): `loss_scaled`."""

from jax_amp_scale.training.optax import (
    LossScaledState,
    SkipReason,
    get_loss_scaled_state,
    loss_scaled,
    optimizer_step,
)

__all__ = [
    "LossScaledState",
    "SkipReason",
    "get_loss_scaled_state",
    "loss_scaled",
    "optimizer_step",
]
