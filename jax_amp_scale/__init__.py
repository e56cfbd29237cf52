"""jax-amp-scale: dynamic loss scaling for JAX mixed-precision training.

The names below are the whole top-level surface (``__all__``; ``dir()`` shows
nothing else).  The optax wrapper and its pieces live in `jax_amp_scale.optax`;
precision levels in `jax_amp_scale.policy`; torch and checkpoint interop in
`jax_amp_scale.interop`; plugin registration in `jax_amp_scale.plugin`.
"""

import importlib as _importlib

from jax_amp_scale._version import __version__ as __version__
from jax_amp_scale.mechanisms.handlers import auto_backend, available_backends
from jax_amp_scale.operators.scale_state import ScaleState, init_scale_state
from jax_amp_scale.operators.unscale_and_check import all_finite
from jax_amp_scale.operators.update_scale import amp_update_scale, update_scale
from jax_amp_scale.policy import Policy, get_policy
from jax_amp_scale.training.amax_scaler import AmaxScaler, amax_scaler
from jax_amp_scale.training.scalers import (
    DynamicScaler,
    NoOpScaler,
    Scaler,
    StaticScaler,
    dynamic_scaler,
    no_op_scaler,
    static_scaler,
)
from jax_amp_scale.training.scaling import (
    clip_by_global_norm,
    find_scale_state,
    nonfinite_leaves,
    nonfinite_paths,
    scale_loss,
    unscale,
    unscale_and_check,
    value_and_grad,
)
from jax_amp_scale.training.watch import watch_amax, watch_probes

__all__ = [
    "AmaxScaler",
    "DynamicScaler",
    "NoOpScaler",
    "Policy",
    "ScaleState",
    "Scaler",
    "StaticScaler",
    "Trainer",
    "all_finite",
    "amax_scaler",
    "amp_update_scale",
    "auto_backend",
    "available_backends",
    "clip_by_global_norm",
    "dynamic_scaler",
    "find_scale_state",
    "get_policy",
    "init_scale_state",
    "no_op_scaler",
    "nonfinite_leaves",
    "nonfinite_paths",
    "scale_loss",
    "static_scaler",
    "unscale",
    "unscale_and_check",
    "update_scale",
    "value_and_grad",
    "watch_amax",
    "watch_probes",
]


def __getattr__(name: str) -> object:
    # Trainer needs optax (an optional extra); the public submodules load on
    # first use.
    if name == "Trainer":
        from jax_amp_scale.trainer import Trainer

        return Trainer
    if name in ("optax", "plugin", "interop", "policy", "export"):
        return _importlib.import_module(f"jax_amp_scale.{name}")
    raise AttributeError(f"module 'jax_amp_scale' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
