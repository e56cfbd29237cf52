"""Data parallelism over a named axis: the gradient mean and the shared flag.

`mean_gradients` is what ``axis_name=`` means in `loss_scaled` and `Trainer`:
torch DDP's update, the mean of the per-replica gradients.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax

from jax_amp_scale.ops.update_scale import or_across

PyTree = Any

__all__ = ["mean_gradients", "or_across"]


def mean_gradients(grads: PyTree, axis_name: Hashable | None) -> PyTree:
    """The mean over `axis_name` of per-replica gradients (identity for None)."""
    if axis_name is None:
        return grads
    return jax.lax.pmean(grads, axis_name)
