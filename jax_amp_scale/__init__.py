"""jax-amp-scale: dynamic loss scaling for JAX mixed-precision training."""

# Ascend / PJRT plugins: importing it installs automatic registration on plugin discovery.
from jax_amp_scale import plugin as plugin
from jax_amp_scale._core import (
    amp_update_scale,
    auto_backend,
    available_backends,
    update_scale,
)
from jax_amp_scale._state import ScaleState, init_scale_state

__version__ = "0.1.0"

__all__ = [
    "ScaleState",
    "amp_update_scale",
    "auto_backend",
    "available_backends",
    "init_scale_state",
    "update_scale",
]
