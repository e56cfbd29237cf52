"""jax-amp-scale: dynamic loss scaling for JAX mixed-precision training."""

# Ascend / PJRT plugins: importing it installs automatic registration on plugin discovery.
from jax_amp_scale import plugin as plugin
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
from jax_amp_scale.policy import Policy, get_policy, loss_scale_for

__version__ = "0.1.0"

__all__ = [
    # training layer
    "DynamicScale",
    "LossScale",
    "NoOpScale",
    "Policy",
    # core
    "ScaleState",
    "StaticScale",
    "Trainer",
    "all_finite",
    "amp_update_scale",
    "as_loss_scale",
    "auto_backend",
    "available_backends",
    "dynamic_scale",
    "find_scale_state",
    "get_policy",
    "init_scale_state",
    "loss_scale_for",
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


def __getattr__(name: str):  # Trainer needs optax, an optional extra: import it lazily
    if name == "Trainer":
        from jax_amp_scale._trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'jax_amp_scale' has no attribute {name!r}")
