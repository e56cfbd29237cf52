"""Data parallelism over a named axis: the gradient mean and the shared flag.

`mean_gradients` is what ``axis_name=`` means in `loss_scaled` and `Trainer`:
torch DDP's update, the mean of the per-replica gradients (for an equal
split of the batch, the full-batch gradient).  Each replica differentiates
its own loss (its shard's mean), as DDP does; the mean is taken here.

What a replica's gradient already is depends on how the axis is mapped:

- ``jax.shard_map`` with varying-axes checking on (the default): the
  gradient of a parameter replicated over the axis (``P()``, invariant)
  comes back already **summed** over it (JAX transposes the implicit
  broadcast of the parameter into a ``psum``), so the mean is that sum
  divided by the axis size, with no second collective; a parameter that
  varies over the axis has a per-replica gradient, averaged with ``pmean``.
- ``shard_map(..., check_vma=False)``, ``pmap``, ``vmap(axis_name=)``:
  every gradient is per-replica; ``pmean``.
- ``jit`` with a sharded batch and no ``axis_name``: the program is global
  and ``jax.grad`` already gives the full-batch gradient; nothing to do.

The two cases are told apart by JAX's types (``jax.typeof(x).vma``), which
checking-on shard_map keeps and the others do not.  One setup cannot be
decided from the gradients: a loss already reduced over the axis (for
example ``lax.pmean(loss, axis)`` before ``jax.grad``), whose gradients
are the mean already; pass the loss as `loss=` and it is refused at trace
time with what to change.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax

from jax_amp_scale.ops.operators import or_across
from jax_amp_scale.state.tree import varying_axes

PyTree = Any

__all__ = ["mean_gradients", "or_across"]


def _names(axis_name: Hashable) -> tuple[Hashable, ...]:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _checked(name: Hashable) -> bool:
    """Whether `name` is a shard_map axis with varying-axes checking on: only
    there does the index along it vary in its type."""
    return name in varying_axes(jax.lax.axis_index(name))


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
      loss: optionally, the loss `grads` were taken of; a loss already
        reduced over a checked axis is refused (its gradients would be
        averaged twice).

    Raises:
      ValueError: at trace time, when `loss` is already reduced over a
        checked axis.
    """
    if axis_name is None:
        return grads
    names = _names(axis_name)
    checked = tuple(n for n in names if _checked(n))
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
