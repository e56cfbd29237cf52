"""Precision policies (O0-O3 and jmp policy strings): `Policy`, `get_policy`."""

from jax_amp_scale.training.policy import LEVELS, Policy, get_policy, loss_scale_for

__all__ = ["LEVELS", "Policy", "get_policy", "loss_scale_for"]
