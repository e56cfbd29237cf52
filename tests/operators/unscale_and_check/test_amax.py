"""The amax the gradient pass measures in the same pass (`unscale_check_amax`).

The native pass (``jas_unscale_check_amax_v1``) against the reference and
against NumPy computing the same statistic its own way (|x| of the finite
entries, in float64), over every float16 and bfloat16 pattern, float32
samples with subnormals, infinities and NaNs, and many leaves (several
native calls); its unscaled leaves and flag equal `unscale_and_check`'s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_amp_scale.operators.unscale_and_check import unscale_and_check, unscale_check_amax
from tests._budget import tiered


def numpy_amax(x: np.ndarray) -> float:
    """The statistic, written independently: float64 |x| over finite entries."""
    with np.errstate(invalid="ignore"):  # NaN payloads widen with a warning
        wide = np.asarray(x).astype(np.float64)
    finite = np.abs(wide[np.isfinite(wide)])
    return float(finite.max()) if finite.size else 0.0


def every_pattern(dtype) -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint16).view(dtype)


TREES = {
    "float16": {"w": every_pattern(np.float16)},
    "bfloat16": {"w": every_pattern(ml_dtypes.bfloat16)},
    "float32": {
        "w": np.random.default_rng(0)
        .integers(0, 1 << 32, 200_003, dtype=np.uint64)
        .astype(np.uint32)
        .view(np.float32),
        "tiny": np.asarray([1e-45, -3e-45, 0.0, -0.0], np.float32),  # subnormals
    },
    "many leaves": {f"l{k}": np.full((k + 1,), float(k) - 70.0, np.float32) for k in range(70)},
}


@pytest.mark.parametrize(
    ("name", "backend"),
    tiered(
        [(n, b) for b in ("reference", "ffi") for n in sorted(TREES)],
        keep=[
            (n, b)
            for b in ("reference", "ffi")
            for n in sorted(TREES)
            if (n, b) != ("many leaves", "reference")
        ],
    ),
)
def test_amax_equals_numpy_and_the_pass_is_unchanged(name, backend):
    tree = TREES[name]
    scale = jnp.float32(1024.0)
    out, found, amax = jax.jit(lambda t: unscale_check_amax(t, scale, backend))(tree)
    want = [numpy_amax(x) for x in jax.tree_util.tree_leaves(tree)]
    assert np.asarray(amax).dtype == np.float32
    np.testing.assert_array_equal(np.asarray(amax, np.float64), np.asarray(want, np.float32))
    plain, plain_found = jax.jit(lambda t: unscale_and_check(t, scale, backend))(tree)
    assert bool(found) == bool(plain_found)
    for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(plain), strict=True):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def test_amax_reads_the_scaled_input_and_skips_non_leaves():
    tree = {"g": jnp.asarray([3.0, -5.0, jnp.inf, jnp.nan], jnp.float16), "n": jnp.int32(9)}
    _, found, amax = unscale_check_amax(tree, jnp.float32(4.0))
    assert bool(found)
    np.testing.assert_array_equal(np.asarray(amax), [5.0])  # scaled units, one float leaf


def test_identity_scale_and_empty_trees():
    _, found, amax = unscale_check_amax({"g": jnp.asarray([2.0, -7.0])}, None)
    assert not bool(found) and float(amax[0]) == 7.0
    _, found, amax = unscale_check_amax({"n": jnp.int32(1)}, jnp.float32(2.0))
    assert not bool(found) and amax.shape == (0,)


@pytest.mark.slow
@pytest.mark.trimmed
def test_vmap_and_grad():
    scale = jnp.float32(2.0)
    batch = {"g": jnp.arange(12.0).reshape(3, 4) - 6.0}
    amax = jax.vmap(lambda t: unscale_check_amax(t, scale)[2])(batch)
    np.testing.assert_array_equal(np.asarray(amax)[:, 0], [6.0, 2.0, 5.0])
    g = jax.grad(lambda t: unscale_check_amax(t, scale)[0]["g"].sum())({"g": jnp.ones(3)})
    np.testing.assert_array_equal(np.asarray(g["g"]), [0.5, 0.5, 0.5])
