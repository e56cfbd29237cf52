"""What ``axis_name=`` means in `loss_scaled` and `Trainer`: torch DDP's mean
of the per-replica gradients (each replica differentiates its own loss).

Under ``jax.shard_map`` with varying-axes checking on, the gradient of a
parameter invariant over the axis comes back already summed there (JAX
transposes its implicit broadcast into a ``psum``): it is divided by the axis
size.  Every other gradient is per-replica and averaged with ``pmean``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax

from jax_amp_scale.mechanisms.custom_call import varying_axes
from jax_amp_scale.operators.unscale_and_check import PyTree

__all__ = ["mean_gradients"]


def _size(name: Hashable) -> Any:
    if hasattr(jax.lax, "axis_size"):
        return jax.lax.axis_size(name)
    return jax.lax.psum(1, name)  # jax < 0.7


def mean_gradients(grads: PyTree, axis_name: Hashable | None, *, loss: Any = None) -> PyTree:
    """The mean over `axis_name` (a name or a tuple of names) of per-replica
    gradients: torch DDP's update.  Identity for None.

    Args:
      grads: each replica's ``jax.grad`` of its own loss.
      axis_name: the mapped axis (or axes) replicas live on.
      loss: optionally, the loss `grads` were taken of; one already reduced
        over a checked axis (its gradients would be averaged twice) is a
        ``ValueError`` at trace time.
    """
    if axis_name is None:
        return grads
    names = tuple(axis_name) if isinstance(axis_name, tuple | list) else (axis_name,)
    # The shard_map axes with varying-axes checking on: only there does the
    # index along the axis vary in its type.
    checked = tuple(n for n in names if n in varying_axes(jax.lax.axis_index(n)))
    if loss is not None:
        reduced = [n for n in checked if n not in varying_axes(loss)]
        if reduced:
            raise ValueError(
                f"mean_gradients: the loss is already reduced over axis {reduced[0]!r} "
                "(typed invariant there), so its gradients are a mean already and "
                "averaging them again would shrink the update; differentiate each "
                "replica's own loss (no lax.pmean/psum of the loss before jax.grad), "
                "as torch DDP does"
            )

    def mean(g: Any) -> Any:
        varying = varying_axes(g)
        # Per-replica over these axes: average them.
        per_replica = tuple(n for n in names if n not in checked or n in varying)
        # Invariant over a checked axis: JAX already summed it there.
        summed = tuple(n for n in checked if n not in varying)
        if per_replica:
            g = jax.lax.pmean(g, per_replica)
        for n in summed:
            g = g / _size(n)
        return g

    return jax.tree_util.tree_map(mean, grads)
