"""torch._amp_update_scale_ as the oracle: float32 scales, any factor."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jax_amp_scale as jas
from tests._budget import examples

torch = pytest.importorskip("torch")

INT32_MAX = 2**31 - 1
N = 512


def torch_step(scales, trackers, found, gf, bf, gi):
    out_s, out_t = [], []
    for s, t, f in zip(scales, trackers, found, strict=True):
        ts = torch.tensor([s], dtype=torch.float32)
        tt = torch.tensor([t], dtype=torch.int32)
        tf = torch.tensor([f], dtype=torch.float32)
        torch._amp_update_scale_(ts, tt, tf, gf, bf, gi)
        out_s.append(ts.numpy()[0])
        out_t.append(tt.numpy()[0])
    return np.array(out_s, np.float32), np.array(out_t, np.int32)


@functools.cache
def ours(backend, gf, bf, gi):
    def one(s, t, f):
        return jas.amp_update_scale(
            s, t, f, growth_factor=gf, backoff_factor=bf, growth_interval=gi, backend=backend
        )

    return jax.jit(jax.vmap(one))


@settings(max_examples=examples(15), deadline=None)
@given(
    gf=st.one_of(st.sampled_from([2.0, 1.1, 3.0, 1.0001]), st.floats(1.0, 1e3)),
    bf=st.one_of(st.sampled_from([0.5, 0.3, 0.9, 0.1]), st.floats(1e-3, 1.0)),
    gi=st.sampled_from([1, 2, 3, 2000, INT32_MAX]),
    seed=st.integers(0, 2**32 - 1),
)
def test_matches_torch_bit_for_bit(gf, bf, gi, seed):
    rng = np.random.default_rng(seed)
    # Random bit patterns cover subnormals, huge values, inf and NaN.
    scales = rng.integers(0, 2**32, size=N, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scales[:6] = [65536.0, 1e-45, 3.4e38, np.inf, 0.0, 1.0]
    trackers = rng.choice([gi - 1, 0, gi - 2, INT32_MAX, -5], size=N).astype(np.int32)
    found = rng.choice(np.array([0.0, 1.0, np.nan], np.float32), size=N)

    want_s, want_t = torch_step(scales, trackers, found, gf, bf, gi)
    for backend in ("reference", "ffi"):
        got_s, got_t = ours(backend, gf, bf, gi)(scales, trackers, found)
        got_s = np.asarray(got_s)
        nan = np.isnan(want_s)
        np.testing.assert_array_equal(np.isnan(got_s), nan)
        np.testing.assert_array_equal(got_s[~nan].view(np.uint32), want_s[~nan].view(np.uint32))
        np.testing.assert_array_equal(np.asarray(got_t), want_t)
