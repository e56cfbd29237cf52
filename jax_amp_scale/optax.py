"""optax integration (``pip install "jax-amp-scale[optax]"``): `loss_scaled`."""

from jax_amp_scale.training.optax import LossScaledState, get_loss_scaled_state, loss_scaled

__all__ = ["LossScaledState", "get_loss_scaled_state", "loss_scaled"]
