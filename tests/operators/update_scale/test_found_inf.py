"""found_inf of every kind, read by its bits: eagerly, under jit and under vmap.

The spec (and CANN's kernel, torch, the README): nonzero, subnormal and NaN
mean overflow; +0.0 and -0.0 do not.  XLA:CPU flushes subnormals to zero in
float comparisons under jit, so a `found_inf != 0` test would read a
subnormal as "no overflow" there and as overflow eagerly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_amp_scale as jas
from tests.jax_compat import enable_x64

BACKENDS = ["reference", "ffi", "auto"]

F32_SUB = float(np.finfo(np.float32).smallest_subnormal)  # 1e-45
F16_SUB = float(np.finfo(np.float16).smallest_subnormal)  # 2**-24
BF16_SUB = float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal)

# (value, overflow?) for values given as arrays of each dtype.
ARRAY_CASES = {
    jnp.float32: [
        (0.0, False),
        (-0.0, False),
        (F32_SUB, True),
        (-F32_SUB, True),
        (1e-30, True),
        (1.0, True),
        (np.inf, True),
        (np.nan, True),
    ],
    jnp.float16: [(0.0, False), (-0.0, False), (F16_SUB, True), (np.nan, True), (-np.inf, True)],
    jnp.bfloat16: [(0.0, False), (-0.0, False), (BF16_SUB, True), (np.nan, True)],
    jnp.int32: [(0, False), (1, True), (-1, True)],
    jnp.int8: [(0, False), (3, True)],
    jnp.bool_: [(False, False), (True, True)],
}
PYTHON_CASES = [
    (0, False),
    (0.0, False),
    (-0.0, False),
    (False, False),
    (1, True),
    (-1, True),
    (2.5, True),
    (True, True),
    (float("inf"), True),
    (float("nan"), True),
    (5e-324, True),  # a float64 subnormal
    (np.float16(-0.0), False),
    (np.int8(3), True),
    (np.float32(F32_SUB), True),
    (np.float64(5e-324), True),
    (np.array(F32_SUB, np.float32), True),
]


def _backed_off(scale) -> np.ndarray:
    # 1024 -> 512 on overflow, 1024 (tracker 4) otherwise: one bit of answer.
    return np.asarray(scale).reshape(-1) == 512.0


def _state():
    return jas.ScaleState(jnp.float32(1024.0), jnp.int32(3))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("found", "want"), PYTHON_CASES, ids=repr)
def test_python_and_numpy_values(backend, found, want):
    out = jas.update_scale(_state(), found, backend)
    assert _backed_off(out.scale).tolist() == [want]
    assert int(out.growth_tracker) == (0 if want else 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", list(ARRAY_CASES), ids=lambda d: jnp.dtype(d).name)
def test_arrays_eager_jit_and_vmap(backend, dtype):
    values, want = zip(*ARRAY_CASES[dtype], strict=True)
    founds = jnp.asarray(np.array(values, dtype=jnp.dtype(dtype)))
    one = jax.jit(lambda f: jas.update_scale(_state(), f, backend).scale)
    batched = jax.jit(jax.vmap(lambda f: jas.update_scale(_state(), f, backend).scale))
    eager = [_backed_off(jas.update_scale(_state(), f, backend).scale)[0] for f in founds]
    jitted = [_backed_off(one(f))[0] for f in founds]
    assert eager == list(want)
    assert jitted == list(want)
    assert _backed_off(batched(founds)).tolist() == list(want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_subnormal_under_x64(backend):
    with enable_x64(True):
        found = jnp.array([5e-324, -0.0, 0.0, 1e-310], jnp.float64)
        one = jax.jit(lambda f: jas.update_scale(_state(), f, backend).scale)
        got = [bool(_backed_off(one(f))[0]) for f in found]
        eager = [bool(_backed_off(jas.update_scale(_state(), f, backend).scale)[0]) for f in found]
    assert got == [True, False, False, True]
    assert eager == got


def test_scale_kinds_and_loss_scaled_read_the_bits_too():
    kind = jas.dynamic_scaler(1024.0)
    out = jax.jit(lambda k, f: k.update(f))(kind, jnp.float32(F32_SUB))
    assert float(out.scale) == 512.0
