"""The CANN kernel model of tests/_cann_rule.py against the spec's stated facts and torch's rule."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests._cann_rule import cann_guarded, cann_kernel
from tests._rule import rule


def test_float16_growth_to_65536_is_stored_as_inf_by_the_kernel():
    # The spec's example: 32768 * 2 = 65536 is finite in float32 (the test),
    # infinite in float16 (the store).
    s, t = cann_kernel(np.float16(32768), 1999, np.float16(0), 2.0, 0.5, 2000)
    assert np.isposinf(s) and s.dtype == np.float16 and t == 0
    s, t = cann_guarded(np.float16(32768), 1999, np.float16(0), 2.0, 0.5, 2000)
    assert s == np.float16(32768) and t == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_defaults_give_torch_bits(dtype):
    # Factors 2 and 0.5 are exact in float32: one rounding either way, except
    # where the kernel stores an infinity the guard refuses.
    rng = np.random.default_rng(0)
    width = np.dtype(dtype).itemsize * 8
    bits = rng.integers(0, 2**width, 3000, dtype=np.uint64).astype(f"uint{width}")
    for x in bits.view(dtype):
        for tracker, found in ((1999, 0), (5, 1)):
            want = rule(x, tracker, found, 2.0, 0.5, 2000)
            got = cann_guarded(x, tracker, np.asarray(found, dtype), 2.0, 0.5, 2000)
            assert np.asarray(got[0]).tobytes() == np.asarray(want[0]).tobytes() or (
                np.isnan(np.float32(got[0])) and np.isnan(np.float32(want[0]))
            ), (x, tracker, found, got, want)
            assert got[1] == want[1]


def test_factors_not_exact_in_float32_differ_from_torch_in_the_last_bit():
    # Spec: for 1.1 and 0.3, a quarter to a half of float32 scales differ.
    rng = np.random.default_rng(1)
    scales = np.float32(2.0) ** rng.uniform(-20, 20, 2000).astype(np.float32)
    for factor in (1.1, 0.3):
        differ = [
            cann_kernel(s, 0, np.float32(1), 2.0, factor, 2000)[0]
            != rule(s, 0, 1, 2.0, factor, 2000)[0]
            for s in scales
        ]
        assert 0.15 < np.mean(differ) < 0.6, (factor, np.mean(differ))
