"""The power-of-two fast path of scale * factor equals the exact integer product.

`floats.torch_product` takes exponent arithmetic (a few integer ops, fast
to compile) when the static factor is a power of two, and the exact 77-bit
integer product otherwise (``fast=False``: always).  Compared bit for
bit with the exact path over every float16 and bfloat16 bit pattern and a
large float32 sample (random bits plus every exponent with edge
significands: zeros, subnormals, the normal/subnormal boundary, max, inf,
NaN payloads), and against NumPy's float64 product rounded to the scale dtype,
which is torch's rule by definition.
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import export

from jax_amp_scale.mechanisms import floats
from tests._budget import tiered

POW2 = [2.0, 0.5, 4.0, 0.25, 2.0**-10, 2.0**24, 2.0**-149, 2.0**200, 2.0**-1074, 2.0**1023]
# Beyond the usual: products under float32's normal range, past its max, and
# under float64's normal range (flushed by XLA:CPU, 0 in float32 either way).
OTHER = [1.1, 0.3, 1.5, 3.0, 1e-3, 0.999999, 7.3e-40, 3 * 2.0**-149, 1e300, 1e-300]
DTYPES = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}
NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@functools.cache
def kernel(dtype_name, factor, path):
    dtype = DTYPES[dtype_name]
    return jax.jit(
        lambda b: (floats.torch_product if path == "dispatch" else floats.limb_product)(
            b, dtype, factor
        )
    )


def all_bits_16():
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def float32_sample(n=1 << 20, seed=0):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    exps = np.arange(256, dtype=np.uint32) << 23
    sigs = np.array([0, 1, 2, 3, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFE, 0x7FFFFF], np.uint32)
    edge = (exps[:, None] | sigs[None, :]).ravel()
    edge = np.concatenate([edge, edge | np.uint32(0x80000000)])
    return np.concatenate([edge, raw])


def sample(dtype_name):
    return float32_sample() if dtype_name == "float32" else all_bits_16()


def test_power_of_two_exponent():
    assert floats.power_of_two_exponent(2.0) == 1
    assert floats.power_of_two_exponent(0.5) == -1
    assert floats.power_of_two_exponent(2.0**-1074) == -1074
    assert floats.power_of_two_exponent(3 * 2.0**-1074) is None
    assert floats.power_of_two_exponent(1.1) is None


# Other factors with a float16/bfloat16 scale take the exact path itself:
# nothing to compare there (test_matches_float64_product_rounded covers them).
@pytest.mark.parametrize(
    ("dtype_name", "factor"),
    tiered(
        [(d, f) for d in DTYPES for f in POW2] + [("float32", f) for f in OTHER],
        keep=[
            ("float32", 2.0**-149),
            ("float32", 1.1),
            ("float16", 2.0**24),
            ("bfloat16", 2.0**-10),
        ],
    ),
)
def test_fast_path_equals_exact_path(dtype_name, factor):
    bits = sample(dtype_name)
    fast = np.asarray(kernel(dtype_name, factor, "dispatch")(bits))
    exact = np.asarray(kernel(dtype_name, factor, "exact")(bits))
    bad = np.nonzero(fast != exact)[0]
    assert bad.size == 0, (bits[bad[:5]], fast[bad[:5]], exact[bad[:5]])


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
@pytest.mark.parametrize(
    "factor", tiered(POW2 + OTHER, keep=[2.0, 2.0**-149, 2.0**1023, 1.1, 7.3e-40, 1e300])
)
def test_matches_float64_product_rounded(dtype_name, factor):
    """NumPy: the correctly rounded float64 product, then to the scale dtype."""
    np_dtype = NP_DTYPES[dtype_name]
    bits = sample(dtype_name)
    x = bits.view(np_dtype)
    with np.errstate(all="ignore"):
        want = (x.astype(np.float64) * factor).astype(np_dtype)
    got = np.asarray(kernel(dtype_name, factor, "dispatch")(bits)).view(np_dtype)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    # NaN in: the input with its quiet bit set (sign and payload kept).
    quiet = np.uint32(0x00400000 if dtype_name == "float32" else 0x0200)
    bits_t = bits.dtype
    np.testing.assert_array_equal(got.view(bits_t)[nan], bits[nan] | bits_t.type(quiet))
    np.testing.assert_array_equal(got.view(bits_t)[~nan], want.view(bits_t)[~nan])


@pytest.mark.parametrize("factor", [f for f in POW2 if 2.0**-140 <= f <= 2.0**127])
def test_bfloat16_power_of_two_matches_numpy(factor):
    """Exact in float64 and float32 here, so one rounding to bfloat16."""
    bits = all_bits_16()
    x = bits.view(ml_dtypes.bfloat16)
    with np.errstate(all="ignore"):
        want = (x.astype(np.float32) * np.float32(factor)).astype(ml_dtypes.bfloat16)
    got = np.asarray(kernel("bfloat16", factor, "dispatch")(bits)).view(ml_dtypes.bfloat16)
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


@pytest.mark.slow
@pytest.mark.trimmed
def test_product_eager_vmapped_and_exported_for_several_platforms():
    """The product outside jit, under vmap, and in a program exported for
    CPU and TPU at once, against NumPy."""
    bits = np.array([0x3F800000, 1, 0x007FFFFF, 0x7F7FFFFF, 0x80000003, 0x00800000], np.uint32)
    with np.errstate(over="ignore"):
        want = (bits.view(np.float32).astype(np.float64) * 1.1).astype(np.float32).view(np.uint32)

    def fn(b):
        return floats.torch_product(b, jnp.float32, 1.1)

    np.testing.assert_array_equal(np.asarray(fn(jnp.asarray(bits))), want)
    batched = jax.vmap(jax.jit(fn))(jnp.asarray(bits).reshape(2, 3))
    np.testing.assert_array_equal(np.asarray(batched).ravel(), want)
    spec = jax.ShapeDtypeStruct(bits.shape, jnp.uint32)
    exported = export.export(jax.jit(fn), platforms=("cpu", "tpu"))(spec)
    np.testing.assert_array_equal(np.asarray(exported.call(jnp.asarray(bits))), want)
