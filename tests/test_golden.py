"""Golden cases from the spec's rule: each branch and edge case, each dtype, each backend."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_amp_scale as jas

BACKENDS = ["reference", "ffi", "auto"]
DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16]
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


def step(backend, scale, tracker, found, gf=2.0, bf=0.5, gi=2000, shape=()):
    fn = jax.jit(
        lambda s, t, f: jas.amp_update_scale(
            s,
            t,
            f,
            growth_factor=gf,
            backoff_factor=bf,
            growth_interval=gi,
            backend=backend,
        )
    )
    dtype = scale.dtype if hasattr(scale, "dtype") else jnp.float32
    s = jnp.full(shape, scale, dtype)
    t = jnp.full(shape, tracker, jnp.int32)
    out_s, out_t = fn(s, t, found)
    assert out_s.shape == shape and out_t.shape == shape
    assert out_s.dtype == s.dtype and out_t.dtype == jnp.int32
    return np.asarray(out_s).reshape(()), int(np.asarray(out_t).reshape(()))


def S(v, dtype):
    return np.asarray(v, dtype=jnp.dtype(dtype))[()]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,)])
class TestBranches:
    def test_found_inf_backs_off_and_resets(self, backend, dtype, shape):
        s, t = step(backend, S(1024.0, dtype), 5, True, shape=shape)
        assert float(s) == 512.0 and t == 0

    def test_found_inf_priority_over_growth(self, backend, dtype, shape):
        # tracker+1 == interval, but found_inf wins: back off, no growth.
        s, t = step(backend, S(1024.0, dtype), 1999, 1.0, shape=shape)
        assert float(s) == 512.0 and t == 0

    def test_finite_step_counts(self, backend, dtype, shape):
        s, t = step(backend, S(1024.0, dtype), 7, False, shape=shape)
        assert float(s) == 1024.0 and t == 8

    def test_growth_at_interval(self, backend, dtype, shape):
        s, t = step(backend, S(1024.0, dtype), 1999, 0, shape=shape)
        assert float(s) == 2048.0 and t == 0

    def test_growth_overflow_keeps_scale_and_resets(self, backend, dtype, shape):
        big = float(jnp.finfo(dtype).max)
        s, t = step(backend, S(big, dtype), 1999, 0, shape=shape)
        assert float(s) == big and t == 0

    def test_interval_one_grows_every_finite_step(self, backend, dtype, shape):
        s, t = step(backend, S(4.0, dtype), 0, 0, gi=1, shape=shape)
        assert float(s) == 8.0 and t == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_found_inf_counts_as_found(backend, dtype):
    s, t = step(backend, S(8.0, dtype), 3, float("nan"))
    assert float(s) == 4.0 and t == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("zero", [0.0, -0.0, 0, False, np.float16(-0.0)])
def test_signed_zeros_do_not_count(backend, zero):
    s, t = step(backend, S(8.0, jnp.float32), 3, zero)
    assert float(s) == 8.0 and t == 4


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "found", [1, -1, 2.5, True, np.int8(3), jnp.array(1e-30, jnp.float32), float("inf")]
)
def test_nonzero_found_inf_of_any_kind(backend, found):
    # 1e-30 would round to 0 in float16: the decision is taken before any cast.
    s, t = step(backend, S(8.0, jnp.float16), 3, found)
    assert float(s) == 4.0 and t == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_tracker_past_interval_keeps_counting_and_wraps(backend):
    s, t = step(backend, S(8.0, jnp.float32), 5000, 0, gi=2000)
    assert float(s) == 8.0 and t == 5001
    s, t = step(backend, S(8.0, jnp.float32), INT32_MAX, 0, gi=2000)
    assert float(s) == 8.0 and t == INT32_MIN
    # interval INT32_MAX is reachable: tracker INT32_MAX - 1 grows.
    s, t = step(backend, S(8.0, jnp.float32), INT32_MAX - 1, 0, gi=INT32_MAX)
    assert float(s) == 16.0 and t == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_tracker(backend):
    s, t = step(backend, S(8.0, jnp.float32), -5, 0, gi=1)
    assert float(s) == 8.0 and t == -4


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nonfinite_current_scale(backend, dtype):
    inf = S(np.inf, dtype)
    s, t = step(backend, inf, 1999, 0)  # growth refused: inf stays, tracker resets
    assert np.isposinf(np.float32(s)) and t == 0
    s, t = step(backend, inf, 0, 1)  # inf * backoff = inf
    assert np.isposinf(np.float32(s)) and t == 0
    nan = S(np.nan, dtype)
    s, t = step(backend, nan, 1999, 0)
    assert np.isnan(np.float32(s)) and t == 0
    s, t = step(backend, nan, 3, 0)
    assert np.isnan(np.float32(s)) and t == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_float16_growth_refused_at_half_max(backend):
    # 40000 * 2 = 80000 overflows float16 (max 65504) though it fits float32.
    s, t = step(backend, S(40000.0, jnp.float16), 1999, 0)
    assert float(s) == 40000.0 and t == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_rounding_of_product(backend):
    # 1.5 * 1.0078125 (bf16: 1 + 2**-7) = 1.51171875 -> rounds to even in bf16.
    x = S(1.0078125, jnp.bfloat16)
    s, _ = step(backend, x, 0, 0, gf=1.5, gi=1)
    expected = np.asarray(np.float32(1.0078125) * np.float32(1.5)).astype(ml_dtypes.bfloat16)
    assert np.asarray(s).view(np.uint16) == expected.view(np.uint16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scale_can_reach_zero(backend):
    # No floor in the operator (the training layer adds one): repeated
    # backoff underflows to 0.
    s = S(np.finfo(np.float32).smallest_subnormal, jnp.float32)
    s2, _ = step(backend, s, 0, 1)
    assert float(s2) == 0.0


def test_sequence_of_steps_matches_spec_trace():
    # A hand-computed trajectory: interval 3, factors 2 / 0.5.
    found = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1]
    expect_scale = [8, 8, 16, 8, 8, 8, 16, 16, 8, 4]
    expect_tracker = [1, 2, 0, 0, 1, 2, 0, 1, 0, 0]
    for backend in ["reference", "ffi"]:
        st = jas.init_scale_state(8.0, growth_interval=3)
        for f, es, et in zip(found, expect_scale, expect_tracker, strict=True):
            st = jas.update_scale(st, f, backend=backend)
            assert float(st.scale) == es and int(st.growth_tracker) == et
