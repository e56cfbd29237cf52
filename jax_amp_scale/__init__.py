"""jax-amp-scale: dynamic loss scaling for JAX mixed-precision training."""

from jax_amp_scale._core import (
    amp_update_scale,
    auto_backend,
    available_backends,
    update_scale,
)

# Training layer (scaling helpers, scale kinds, trainer, policies).
from jax_amp_scale._kinds import (
    DynamicScale,
    LossScale,
    NoOpScale,
    StaticScale,
    as_loss_scale,
    dynamic_scale,
    no_op_scale,
    static_scale,
)
from jax_amp_scale._scaling import (
    all_finite,
    find_scale_state,
    nonfinite_leaves,
    nonfinite_paths,
    scale_loss,
    unscale,
    unscale_and_check,
    value_and_grad,
)
from jax_amp_scale._state import ScaleState, init_scale_state

__version__ = "0.1.0"

__all__ = [
    # training layer
    "DynamicScale",
    "LossScale",
    "NoOpScale",
    # core
    "ScaleState",
    "StaticScale",
    "all_finite",
    "amp_update_scale",
    "as_loss_scale",
    "auto_backend",
    "available_backends",
    "dynamic_scale",
    "find_scale_state",
    "init_scale_state",
    "no_op_scale",
    "nonfinite_leaves",
    "nonfinite_paths",
    "scale_loss",
    "static_scale",
    "unscale",
    "unscale_and_check",
    "update_scale",
    "value_and_grad",
]
