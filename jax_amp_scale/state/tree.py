"""Pytree and array helpers every layer shares, each written once."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

T = TypeVar("T")


def is_float_leaf(x: Any) -> bool:
    """Whether `x` is an array with a floating dtype (float0 excluded)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return False
    dtype = np.dtype(dtype)
    return dtype != jax.dtypes.float0 and jnp.issubdtype(dtype, jnp.floating)


def compute_dtype(dtype: Any) -> Any:
    """float16/bfloat16 leaves are computed in float32 (one rounding back to
    the leaf dtype), float64 leaves in float64."""
    return jnp.promote_types(dtype, jnp.float32)


def varying_axes(x: Any) -> frozenset[Hashable]:
    """The manual axes `x` varies over inside ``shard_map`` (empty where JAX
    does not track them: outside shard_map, check_vma=False, pmap, vmap)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)  # jax >= 0.10
    return frozenset(getattr(mat, "varying", None) or getattr(aval, "vma", None) or ())


def instances(tree: Any, cls: type[T]) -> list[T]:
    """Every node of type `cls` in `tree`, outermost first, by a plain pytree walk."""
    nodes = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, cls))
    return [x for x in nodes if isinstance(x, cls)]


def typed_as(value: Any, like: Any) -> jax.Array:
    """`value` (an array or a Python number) in `like`'s dtype and shape."""
    out = jnp.asarray(value)
    if out.dtype != like.dtype:
        out = out.astype(like.dtype)
    if out.shape != like.shape:
        out = jnp.broadcast_to(out, like.shape)
    return out


def select(flag: Any, on_true: Any, on_false: Any) -> jax.Array:
    """``where(flag, on_true, on_false)`` for a scalar bool, typed as `on_false`,
    as one ``lax.select`` (``jnp.where`` stages a nested jit for every leaf)."""
    on_false = jnp.asarray(on_false)  # optax allows Python scalars in a state
    return jax.lax.select(jnp.asarray(flag), typed_as(on_true, on_false), on_false)


# Bit masks of everything but the sign, per float width: a float is "found"
# when any of these bits is set (nonzero, subnormal, inf or NaN).  Comparing
# with `!= 0` instead would let XLA:CPU's denormals-are-zero read a subnormal
# found_inf as zero under jit, and as nonzero eagerly.
_MAGNITUDE_BITS = {
    2: (np.uint16, 0x7FFF),
    4: (np.uint32, 0x7FFFFFFF),
    8: (np.uint64, (1 << 63) - 1),
}


def nonzero_bits(x: jax.Array) -> jax.Array:
    """`x != 0` read from the bits: subnormals and NaN count, -0.0 does not.

    Exact under jit on every backend (no float comparison, so no
    flush-to-zero); bool and integer arrays compare as usual.
    """
    dtype = jnp.dtype(x.dtype)
    if dtype == jnp.bool_:
        return x
    if not jnp.issubdtype(dtype, jnp.floating):
        return x != 0
    uint, mask = _MAGNITUDE_BITS[dtype.itemsize]
    bits = jax.lax.bitcast_convert_type(x, uint)
    return (bits & jnp.asarray(mask, uint)) != 0
