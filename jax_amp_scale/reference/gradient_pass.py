"""Unscale and check gradient leaves in jax.numpy: the reference gradient pass."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jax_amp_scale.reference.inverse import multiply_by_inverse
from jax_amp_scale.state.tree import compute_dtype, is_float_leaf


def unscale_leaf(x: Any, inv: jax.Array | None) -> Any:
    """`x * inv` in `compute_dtype`, rounded once to `x`'s dtype; non-floats pass.

    `inv` is a float32 inverse scale (`inverse_scale`), subnormal ones
    included: the product is exact at every scale (`multiply_by_inverse`).
    """
    if inv is None or not is_float_leaf(x):
        return x
    dt = compute_dtype(x.dtype)
    return multiply_by_inverse(x.astype(dt), inv).astype(x.dtype)


def leaf_finite(x: Any) -> jax.Array:
    """True (bool scalar) when every value of `x` is finite."""
    # min over a uint8 mask, not all() over a bool one: same answer, but
    # XLA:CPU reduces uint8 with its vectorized (YNNPACK) reduction while it
    # rewrites a pred reduction into slower reduce-window passes (measured:
    # about 1.6x less time for unscale_and_check on CPU).
    if x.size == 0:
        return jnp.array(True)
    return jnp.min(jnp.isfinite(x).astype(jnp.uint8)) == 1


def reference_pass(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
    """``(found_inf, unscaled_leaves)`` for floating `leaves` and float32 `inv`."""
    # Each leaf's check is a reduction over the very expression that produces
    # its unscaled value: the shape a multi-output fusion (XLA:GPU) turns into
    # one pass.  XLA:CPU never fuses a reduction with its producer: there each
    # leaf costs one kernel writing the unscaled leaf and one writing a 1-byte
    # finiteness mask (then a vectorized reduction); tests/test_scaling.py
    # pins that structure.
    outs = [unscale_leaf(x, inv) for x in leaves]
    finite = jnp.all(jnp.stack([leaf_finite(u) for u in outs]))
    return jnp.logical_not(finite), outs
