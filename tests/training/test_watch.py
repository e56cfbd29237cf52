"""`watch_amax`: identity forward, the cotangent passed on unchanged, and the
cotangent's finite amax as the probe's gradient, against NumPy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_amp_scale as jas
from tests import jax_compat

DTYPES = [jnp.float16, jnp.bfloat16, jnp.float32]


def bits(x) -> bytes:
    return np.asarray(x).tobytes()


def numpy_amax(ct) -> np.float32:
    """The independent oracle: max |ct| over finite entries, 0 for none, as float32."""
    a = np.abs(np.asarray(ct).astype(np.float64))  # exact for float16/bfloat16/float32
    finite = a[np.isfinite(a)]
    return np.float32(finite.max() if finite.size else 0.0)


def cotangent(dtype, shape=(7, 33), seed=0, specials=True):
    """Random values across many binades, with inf, -inf and NaN mixed in."""
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 12, shape)
    if specials:
        flat = v.reshape(-1)
        flat[[3, 13, 23]] = [np.inf, -np.inf, np.nan]
    return jnp.asarray(v, dtype)


def vjp(x, ct, *, dtype=None):
    """(forward output, cotangent of x, gradient of the probe) for cotangent `ct`."""
    out, f = jax.vjp(lambda x, p: jas.watch_amax(x, p, dtype=dtype), x, jnp.float32(0))
    return (out, *f(ct))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cast", [None, jnp.float16, jnp.bfloat16, jnp.float32])
def test_forward_is_the_identity_or_the_cast_bit_for_bit(dtype, cast):
    x = cotangent(dtype, seed=1)
    y = jas.watch_amax(x, jnp.float32(0), dtype=cast)
    want = x if cast is None else x.astype(cast)
    assert y.dtype == want.dtype and bits(y) == bits(want)
    y = jax.jit(lambda x, p: jas.watch_amax(x, p, dtype=cast))(x, jnp.float32(0))
    assert y.dtype == want.dtype and bits(y) == bits(want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cast", [None, jnp.float16, jnp.float32])
def test_cotangent_passes_unchanged_and_probe_gets_its_finite_amax(dtype, cast):
    x = cotangent(dtype, seed=2, specials=False)
    out_dtype = dtype if cast is None else cast
    for seed in range(3):
        ct = cotangent(out_dtype, seed=10 + seed)
        _, ct_x, g = vjp(x, ct, dtype=cast)
        assert ct_x.dtype == x.dtype and bits(ct_x) == bits(ct.astype(x.dtype))
        assert g.dtype == jnp.float32 and g.shape == ()
        # measured on the cotangent as it arrives, before the cast back
        assert bits(g) == bits(numpy_amax(ct)), (g, numpy_amax(ct))


def test_amax_is_taken_before_the_cast_back():
    # A float32 cotangent narrowed to float16 at a float16 -> float32 cast: the
    # probe sees 70000 (above 65504), the float16 cotangent is inf.
    x = jnp.ones((3,), jnp.float16)
    ct = jnp.array([1.0, -70000.0, 3.0], jnp.float32)
    _, ct_x, g = vjp(x, ct, dtype=jnp.float32)
    assert float(g) == 70000.0
    assert ct_x.dtype == jnp.float16 and np.isinf(np.asarray(ct_x)[1])


@pytest.mark.parametrize(
    ("ct", "want"),
    [
        ([np.inf, -np.inf, np.nan], 0.0),  # no finite entry: 0
        ([np.nan, -2.5, np.inf], 2.5),
        ([-0.0, 0.0], 0.0),
        ([], 0.0),  # no entry: 0
        ([2.0**-24], 2.0**-24),  # a float16 subnormal
    ],
)
def test_non_finite_entries_are_left_out(ct, want):
    ct = jnp.asarray(ct, jnp.float16)
    _, _, g = vjp(jnp.zeros(ct.shape, jnp.float16), ct)
    assert bits(g) == bits(np.float32(want))


def test_scaled_units_and_jit():
    # The probe reports the cotangent as the backward pass holds it: scaled.
    w = jnp.array([[0.5, -3.0], [2.0, 1.0]], jnp.float32)
    x = jnp.ones((2, 2), jnp.float16)

    def loss(x, probes, scale):
        h = jas.watch_amax(x, probes[0], dtype=jnp.float32)  # cotangent: w * scale
        y = jas.watch_amax(h @ w, probes[1])  # cotangent: scale
        return jnp.sum(y) * scale

    for f in (jax.grad(loss, argnums=1), jax.jit(jax.grad(loss, argnums=1))):
        g = f(x, jas.watch_probes(2), jnp.float32(1024.0))
        ct_h = np.ones((2, 2)) @ np.asarray(w).T * 1024.0
        np.testing.assert_array_equal(g, [np.abs(ct_h).max(), 1024.0])


def test_vmap_shared_probe_is_the_max_over_the_batch_not_the_sum():
    xb = jnp.asarray(cotangent(jnp.float32, (5, 6), seed=3, specials=False))
    w = jnp.asarray(cotangent(jnp.float32, (5, 6), seed=4))

    def shared(p):
        y = jax.vmap(lambda x: jas.watch_amax(x, p))(xb)
        return jnp.sum(y * jnp.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0))

    def per_example(ps):
        y = jax.vmap(lambda x, p: jas.watch_amax(x, p))(xb, ps)
        return jnp.sum(y * jnp.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0))

    w_np = np.nan_to_num(np.asarray(w), nan=0.0, posinf=0.0, neginf=0.0)
    assert float(jax.grad(shared)(jnp.float32(0))) == numpy_amax(w_np)
    got = jax.jit(jax.grad(per_example))(jnp.zeros(5))
    np.testing.assert_array_equal(got, [numpy_amax(row) for row in w_np])


def test_vmap_keeps_non_finite_entries_out_and_nests():
    ct = np.asarray(cotangent(jnp.float32, (3, 4, 5), seed=5))
    x = jnp.zeros((3, 4, 5))

    _, f = jax.vjp(
        lambda x, pb: jax.vmap(lambda xo: jax.vmap(jas.watch_amax)(xo, pb))(x), x, jnp.zeros(4)
    )
    _, g = f(jnp.asarray(ct))
    np.testing.assert_array_equal(g, [numpy_amax(ct[:, i]) for i in range(4)])
    # The batched cotangent of x passes unchanged.
    ct_x, _ = f(jnp.asarray(ct))
    assert bits(ct_x) == bits(ct)


def test_grad_of_grad_sees_the_cotangent_path_and_not_the_amax():
    x = jnp.array([0.5, -2.0, 3.0])

    def f(x, p):
        return jnp.sum(jnp.sin(jas.watch_amax(x, p)) ** 2)

    def plain(x):
        return jnp.sum(jnp.sin(x) ** 2)

    hess = jax.hessian(lambda x: f(x, jnp.float32(0)))(x)
    np.testing.assert_allclose(hess, jax.hessian(plain)(x), rtol=1e-6)
    # The probe's gradient is a statistic: its derivative is zero.
    d = jax.grad(lambda x: jax.grad(f, argnums=1)(x, jnp.float32(0)))(x)
    np.testing.assert_array_equal(d, np.zeros(3))


def test_remat_and_a_probe_used_twice_sums():
    x = jnp.array([1.0, -4.0])

    def f(x, p):
        y = jax.checkpoint(lambda x: jas.watch_amax(x, p) * 2.0)(x)
        return jnp.sum(jas.watch_amax(y, p) * 3.0)  # the same probe again

    # cotangents: 3 (second watch) and 6 (first): the probe's gradient is 3 + 6
    assert float(jax.grad(f, argnums=1)(x, jnp.float32(0))) == 9.0


@pytest.mark.xfail(jax_compat.BEFORE_0_7, reason=jax_compat.GRAD_OF_VARYING_LOSS, strict=True)
def test_shard_map_on_one_device_runs():
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))

    def loss(x, p):
        return jnp.sum(jas.watch_amax(x, p) * jnp.array([1.0, -5.0]))

    f = jax_compat.shard_map(  # jax.shard_map from 0.7 on, the experimental one before
        jax.grad(loss, argnums=1),
        mesh=mesh,
        in_specs=(jax.sharding.PartitionSpec("data"), jax.sharding.PartitionSpec()),
        out_specs=jax.sharding.PartitionSpec(),
    )
    assert float(jax.jit(f)(jnp.ones(2), jnp.float32(0))) == 5.0


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((jnp.arange(3), jnp.float32(0)), {}, r"watch_amax: x must be a floating array.*int32"),
        (("abc", jnp.float32(0)), {}, r"watch_amax: x must be a floating array"),
        ((jnp.ones(3), jnp.zeros(2)), {}, r"watch_amax: probe must be a float32 scalar.*\(2,\)"),
        ((jnp.ones(3), jnp.float16(0)), {}, r"watch_amax: probe must be a float32 scalar.*float16"),
        ((jnp.ones(3), None), {}, r"watch_amax: probe must be a float32 scalar"),
        ((jnp.ones(3), jnp.float32(0)), {"dtype": jnp.int32}, r"watch_amax: dtype must be"),
        ((jnp.ones(3), jnp.float32(0)), {"dtype": "nope"}, r"watch_amax: dtype must be"),
    ],
)
def test_bad_arguments_are_named_at_trace_time(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        jas.watch_amax(*args, **kwargs)
    x, p = args
    if isinstance(x, jax.Array) and isinstance(p, jax.Array):
        with pytest.raises(ValueError, match=match):  # while tracing, before running anything
            jax.jit(lambda x, p: jas.watch_amax(x, p, **kwargs)).trace(x, p)


def test_watch_probes():
    p = jas.watch_probes(3)
    assert p.shape == (3,) and p.dtype == jnp.float32 and not np.any(np.asarray(p))
    for bad in (0, -1, True, 2.0, "3"):
        with pytest.raises(ValueError, match=r"watch_probes: n must be an int >= 1"):
            jas.watch_probes(bad)


def test_exported_at_top_level():
    assert {"watch_amax", "watch_probes"} <= set(jas.__all__)


def test_under_scan_one_probe_per_iteration_gives_each_amax():
    # Issue 51: a probe shared by scan's iterations gets the sum of their
    # amaxes (JAX adds a constant's cotangents); the docstring says so and
    # says to pass one probe per iteration as xs, whose max is the max.
    xs = jnp.array([[1.0, -6.0], [2.0, 3.0], [-4.0, 0.5]])

    def shared(p):
        def body(c, x):
            return c + jnp.sum(jas.watch_amax(x, p)), None

        return jax.lax.scan(body, 0.0, xs)[0]

    def per_iteration(ps):
        def body(c, xp):
            x, p = xp
            return c + jnp.sum(jas.watch_amax(x, p)), None

        return jax.lax.scan(body, 0.0, (xs, ps))[0]

    # every cotangent entry is 1: each iteration's amax is 1 (sum: 3)
    assert float(jax.grad(shared)(jnp.float32(0))) == 3.0
    g = jax.grad(per_iteration)(jas.watch_probes(3))
    np.testing.assert_array_equal(g, [1.0, 1.0, 1.0])

    def scaled(ps):  # cotangents x itself: amaxes 6, 3, 4
        def body(c, xp):
            x, p = xp
            return c + jnp.sum(jas.watch_amax(x, p) * jax.lax.stop_gradient(x)), None

        return jax.lax.scan(body, 0.0, (xs, ps))[0]

    g = jax.grad(scaled)(jas.watch_probes(3))
    np.testing.assert_array_equal(g, [6.0, 3.0, 4.0])
    assert float(jnp.max(g)) == 6.0
    assert "pass one per iteration, as ``xs``" in " ".join(jas.watch_amax.__doc__.split())
