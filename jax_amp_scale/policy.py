"""Precision policies (O0-O3 and jmp policy strings): `Policy`, `get_policy`, `scaler_for`."""

from jax_amp_scale.training.policy import LEVELS, Policy, get_policy, scaler_for

__all__ = ["LEVELS", "Policy", "get_policy", "scaler_for"]
