"""jax-amp-scale: dynamic loss scaling for JAX mixed-precision training."""

import importlib
from typing import Any

# The public surface, re-exported; nothing is defined here, and importing
# registers nothing (native handlers load at the first trace that needs them).
from jax_amp_scale._version import __version__ as __version__
from jax_amp_scale.dispatch.backends import auto_backend, available_backends
from jax_amp_scale.ops.update_scale import amp_update_scale, update_scale
from jax_amp_scale.state.scale_state import ScaleState, init_scale_state
from jax_amp_scale.training.helpers import (
    all_finite,
    clip_by_global_norm,
    find_scale_state,
    global_norm,
    nonfinite_leaves,
    nonfinite_paths,
    scale_loss,
    unscale,
    unscale_and_check,
    value_and_grad,
)
from jax_amp_scale.training.loss_scale_kinds import (
    DynamicScale,
    LossScale,
    NoOpScale,
    StaticScale,
    as_loss_scale,
    dynamic_scale,
    no_op_scale,
    static_scale,
)
from jax_amp_scale.training.policy import Policy, get_policy, loss_scale_for

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
    "clip_by_global_norm",
    "dynamic_scale",
    "find_scale_state",
    "get_policy",
    "global_norm",
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


def __getattr__(name: str) -> Any:
    # Trainer needs optax, an optional extra; the submodules load on first use.
    if name == "Trainer":
        from jax_amp_scale.training.trainer import Trainer

        return Trainer
    if name in ("optax", "plugin", "interop", "policy"):
        return importlib.import_module(f"jax_amp_scale.{name}")
    raise AttributeError(f"module 'jax_amp_scale' has no attribute {name!r}")
