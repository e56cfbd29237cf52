"""The package's lazy attributes: `Trainer`, the public submodules, old names.

Old names stay importable as deprecated aliases that warn
(``DeprecationWarning``) and say what replaced them.  None of them is in
``__all__`` or ``dir(jax_amp_scale)``.
"""

from __future__ import annotations

import importlib
import warnings

SUBMODULES = ("optax", "plugin", "interop", "policy")

# old name -> (module, new name)
ALIASES: dict[str, tuple[str, str]] = {
    "DynamicScale": ("jax_amp_scale.training.scalers", "DynamicScaler"),
    "StaticScale": ("jax_amp_scale.training.scalers", "StaticScaler"),
    "NoOpScale": ("jax_amp_scale.training.scalers", "NoOpScaler"),
    "LossScale": ("jax_amp_scale.training.scalers", "Scaler"),
    "dynamic_scale": ("jax_amp_scale.training.scalers", "dynamic_scaler"),
    "static_scale": ("jax_amp_scale.training.scalers", "static_scaler"),
    "no_op_scale": ("jax_amp_scale.training.scalers", "no_op_scaler"),
    "as_loss_scale": ("jax_amp_scale.training.scalers", "as_scaler"),
    "loss_scale_for": ("jax_amp_scale.training.policy", "scaler_for"),
    "global_norm": ("jax_amp_scale.training.helpers", "global_norm"),
}

_WHERE = {
    "as_scaler": "jax_amp_scale.training.scalers.as_scaler",
    "scaler_for": "jax_amp_scale.policy.scaler_for",
    "global_norm": "the norm clip_by_global_norm returns (or optax.global_norm)",
}


def getattr_with_aliases(name: str) -> object:
    """`jax_amp_scale.<name>` for the names not bound at import."""
    if name == "Trainer":
        from jax_amp_scale.training.trainer import Trainer

        return Trainer
    if name in SUBMODULES:
        return importlib.import_module(f"jax_amp_scale.{name}")
    if name in ALIASES:
        module, new = ALIASES[name]
        warnings.warn(
            f"jax_amp_scale.{name} is deprecated; use {_WHERE.get(new, 'jax_amp_scale.' + new)}",
            DeprecationWarning,
            stacklevel=3,
        )
        return getattr(importlib.import_module(module), new)
    raise AttributeError(f"module 'jax_amp_scale' has no attribute {name!r}")
