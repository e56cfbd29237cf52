"""Interop: torch ``GradScaler`` state dicts, and checkpoints of whole training states."""

from jax_amp_scale.interop.state_dicts import (
    TORCH_KEYS,
    from_state_dict,
    from_torch_state_dict,
    to_state_dict,
    to_torch_state_dict,
)

__all__ = [
    "TORCH_KEYS",
    "from_state_dict",
    "from_torch_state_dict",
    "to_state_dict",
    "to_torch_state_dict",
]
