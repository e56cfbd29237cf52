"""Property tests: reference lowering vs FFI handler vs an independent NumPy rule.

Bit-for-bit over random scales (0, subnormals, max, inf, NaN with payloads),
random trackers (negative, INT32_MAX), intervals 1 and 2**31-1 and random
factors.  A vmapped batch goes through the handler in one call.
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jax_amp_scale as jas
from tests._budget import examples
from tests._rule import rule

INT32_MAX = 2**31 - 1
N = 256
BITS = {
    np.dtype(np.float32): np.uint32,
    np.dtype(np.float16): np.uint16,
    np.dtype(ml_dtypes.bfloat16): np.uint16,
}


@functools.cache
def batched(backend, gf, bf, gi):
    def one(s, t, f):
        return jas.amp_update_scale(
            s, t, f, growth_factor=gf, backoff_factor=bf, growth_interval=gi, backend=backend
        )

    return jax.jit(jax.vmap(one))


def special_values(dtype):
    fi = jnp.finfo(dtype)
    vals = [0.0, -0.0, float(fi.smallest_subnormal), float(fi.tiny), float(fi.max), 1.0, 2.0**16]
    vals += [np.inf, -np.inf, np.nan, float(fi.max) / 2, float(fi.max) * 0.75, -3.0]
    return np.array(vals, np.float32).astype(dtype)


def random_scales(rng, dtype):
    bits_t = BITS[np.dtype(dtype)]
    raw = rng.integers(0, np.iinfo(bits_t).max, size=N, dtype=bits_t, endpoint=True)
    x = raw.view(dtype)
    x[: len(special_values(dtype))] = special_values(dtype)
    return x


def random_trackers(rng, gi):
    near = [gi - 1, gi - 2, gi, 0, -1, INT32_MAX, INT32_MAX - 1, -(2**31)]
    t = rng.integers(-(2**31), INT32_MAX, size=N, dtype=np.int64, endpoint=True)
    t[: N // 2] = rng.choice(near, size=N // 2)
    return np.clip(t, -(2**31), INT32_MAX).astype(np.int32)


def random_found(rng):
    choices = np.array([0.0, -0.0, 1.0, np.nan, np.inf, 1e-30, -2.0], np.float32)
    return rng.choice(choices, size=N)


factors = st.one_of(
    st.sampled_from([2.0, 0.5, 1.5, 0.25, 1.0, 4.0, 1.1, 0.3, 1e-3, 1e10]),
    st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False),
)
intervals = st.one_of(st.sampled_from([1, 2, 2000, INT32_MAX]), st.integers(1, INT32_MAX))


@settings(max_examples=examples(30), deadline=None)
@given(
    dtype=st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16]),
    gf=factors,
    bf=factors,
    gi=intervals,
    seed=st.integers(0, 2**32 - 1),
)
@pytest.mark.slow  # 15 s: the default tier keeps the golden and torch-oracle checks
def test_reference_ffi_and_numpy_rule_agree_bitwise(dtype, gf, bf, gi, seed):
    rng = np.random.default_rng(seed)
    scales = random_scales(rng, dtype)
    trackers = random_trackers(rng, gi)
    found = random_found(rng)

    ref_s, ref_t = batched("reference", gf, bf, gi)(scales, trackers, found)
    ffi_s, ffi_t = batched("ffi", gf, bf, gi)(scales, trackers, found)
    bits = BITS[np.dtype(dtype)]
    np.testing.assert_array_equal(np.asarray(ref_s).view(bits), np.asarray(ffi_s).view(bits))
    np.testing.assert_array_equal(np.asarray(ref_t), np.asarray(ffi_t))

    for i in range(N):
        es, et = rule(scales[i], int(trackers[i]), found[i], gf, bf, gi)
        got = np.asarray(ref_s)[i]
        assert int(np.asarray(ref_t)[i]) == et, (i, scales[i], trackers[i], found[i])
        if np.isnan(np.float32(es)):
            assert np.isnan(np.float32(got))
        else:
            assert got.view(bits) == np.asarray(es, dtype).view(bits), (i, scales[i], found[i])


@pytest.mark.slow
@pytest.mark.trimmed
@settings(max_examples=examples(10), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), gi=intervals)
def test_scan_trajectories_agree(seed, gi):
    """Thousands of steps in lax.scan: both backends follow one trajectory."""
    rng = np.random.default_rng(seed)
    found = rng.random(3000) < 0.01
    gi = min(gi, 50)

    def run(backend):
        def body(state, f):
            state = jas.update_scale(state, f, backend=backend)
            return state, (state.scale, state.growth_tracker)

        st0 = jas.init_scale_state(1024.0, growth_interval=gi)
        return jax.jit(lambda s, f: jax.lax.scan(body, s, f))(st0, found)

    (_, (rs, rt)), (_, (fs, ft)) = run("reference"), run("ffi")
    np.testing.assert_array_equal(np.asarray(rs).view(np.uint32), np.asarray(fs).view(np.uint32))
    np.testing.assert_array_equal(np.asarray(rt), np.asarray(ft))
