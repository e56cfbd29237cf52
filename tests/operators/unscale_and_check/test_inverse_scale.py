"""Unscaling at every finite scale, against torch (issue 24 item 3).

Above 2**126 torch's inverse scale, ``float32(1 / float64(scale))``, is a
float32 subnormal; XLA's flush-to-zero used to turn it into 0 and every
gradient with it.  Oracle: ``torch._amp_foreach_non_finite_check_and_unscale_``
(the op ``GradScaler.unscale_`` runs) and ``GradScaler`` itself.

Comparison rule: bit for bit, except where torch's result is itself a
float32 subnormal (or rounds up to 2**-126 from one): XLA returns the zero of
the same sign there, at every scale (its flush-to-zero; documented in the
README).  float32 and float16 NaNs compare by bits; a bfloat16 NaN is any
NaN (XLA's conversion canonicalises it, torch's does not).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_amp_scale as jas
from jax_amp_scale.mechanisms.floats import inverse_factors, inverse_scale
from jax_amp_scale.operators.unscale_and_check import unscale_and_check_leaves
from tests.jax_compat import enable_x64

torch = pytest.importorskip("torch")

POW2_SCALES = [2.0**k for k in range(100, 128)]
OTHER_SCALES = [3 * 2.0**125, 1.7 * 2.0**127, 1.1 * 2.0**126, 1e38, 3.4e38, 65536.0, 12345.678]
SCALES = POW2_SCALES + OTHER_SCALES
BACKENDS = ["reference", "ffi"]


def _torch_inverse(scale):
    return torch.tensor(np.float32(scale)).double().reciprocal().float()


def _bits(x):
    x = np.asarray(x)
    return x.view({8: np.uint64, 4: np.uint32, 2: np.uint16}[x.dtype.itemsize])


def _torch_unscale(grads: np.ndarray, scale) -> tuple[np.ndarray, bool]:
    if grads.dtype == ml_dtypes.bfloat16:
        t = torch.from_numpy(grads.view(np.uint16).copy()).view(torch.bfloat16)
    else:
        t = torch.from_numpy(grads.copy())
    found = torch.zeros(())
    torch._amp_foreach_non_finite_check_and_unscale_([t], found, _torch_inverse(scale))
    if grads.dtype == ml_dtypes.bfloat16:
        return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16), bool(found)
    return t.numpy(), bool(found)


def _assert_torch_bits(got, want):
    g, w = _bits(got), _bits(want)
    mismatch = g != w
    magnitude = 0x7FFFFFFF if g.dtype == np.uint32 else 0x7FFF
    # torch's subnormal (or from-subnormal) results: ours is the signed zero
    flushed = ((g & magnitude) == 0) & (np.abs(want.astype(np.float64)) <= 2.0**-126)
    flushed &= (g >> (8 * g.itemsize - 1)) == (w >> (8 * w.itemsize - 1))
    if got.dtype == ml_dtypes.bfloat16:
        # bfloat16 NaNs: XLA (and so the library) stores the canonical quiet
        # NaN, torch's vectorised conversion 0xFFFF: any NaN for a NaN.
        flushed |= np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
    bad = np.nonzero(mismatch & ~flushed)[0]
    assert bad.size == 0, (bad[:5], g[bad[:5]], w[bad[:5]])


def _gradients(dtype, n=65536):
    """Every exponent of the dtype: random bit patterns (normal, subnormal,
    inf, NaN) plus the specials spelled out."""
    rng = np.random.default_rng(24)
    if dtype == np.float32:
        bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
        x = bits.view(np.float32)
        x[:8] = [0.5 * 2.0**127, 3.0e38, -np.inf, np.nan, 1e-45, -1e-40, 2.0**-126, 1.0]
        return x
    return np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dtype)  # every pattern


def test_inverse_scale_is_torchs_inverse_bit_for_bit():
    rng = np.random.default_rng(0)
    scales = np.concatenate(
        [
            rng.integers(0, 2**23, 20000) | (253 << 23),  # [2**126, 2**127)
            rng.integers(0, 2**23, 20000) | (254 << 23),  # [2**127, 2**128)
            rng.integers(1, 2**23, 2000),  # subnormal scales
            rng.integers(1 << 23, 0x7F800000, 5000),  # every normal exponent
            [0x7F800000, 0, 0x3F800000, 0x7F7FFFFF, 0x00800000],
        ]
    ).astype(np.uint32)
    scales = np.concatenate([scales, scales[:100] | np.uint32(0x80000000)]).view(np.float32)
    got = _bits(jax.jit(inverse_scale)(scales))
    want = _bits(torch.from_numpy(scales.copy()).double().reciprocal().float().numpy())
    np.testing.assert_array_equal(got, want)


def test_inverse_factors_multiply_back_exactly():
    # m * p == inv for every subnormal inverse (checked in float64, exact).
    bits = np.arange(1, 2**23, 997, dtype=np.uint32)
    inv = bits.view(np.float32)
    m, p = jax.jit(jax.vmap(inverse_factors))(inv)
    m, p = np.asarray(m), np.asarray(p)
    assert (np.abs(m) >= 2.0**-126).all()
    np.testing.assert_array_equal(m.astype(np.float64) * p, inv.astype(np.float64))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_unscale_and_check_equals_torch_at_every_scale(backend, dtype):
    grads = _gradients(dtype)
    run = jax.jit(lambda inv, g: unscale_and_check_leaves(inv, [g], backend))
    for scale in SCALES:
        want, want_found = _torch_unscale(grads, scale)
        found, (got,) = run(inverse_scale(jnp.float32(scale)), jnp.asarray(grads))
        assert bool(found) == want_found, scale
        _assert_torch_bits(np.asarray(got), want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_below_scale_one_a_subnormal_gradient_counts_as_zero(backend, dtype):
    # At a scale below 1 the inverse is above 1 and torch can lift a float32
    # subnormal gradient into the normal range; XLA:CPU reads a subnormal
    # operand as zero (docs/operator.md).  Every other bit is torch's, the
    # flushed subnormal results aside.
    grads = _gradients(dtype)
    scale = 0.375
    want, want_found = _torch_unscale(grads, scale)
    run = jax.jit(lambda inv, g: unscale_and_check_leaves(inv, [g], backend))
    found, (got,) = run(inverse_scale(jnp.float32(scale)), jnp.asarray(grads))
    assert bool(found) == want_found
    g = _bits(np.asarray(got))
    operand = (np.abs(grads.astype(np.float64)) < 2.0**-126) & (grads != 0)
    lifted = operand & (np.abs(want.astype(np.float64)) >= 2.0**-126)
    assert lifted.any()  # the case exists in these gradients
    magnitude = 0x7FFFFFFF if g.dtype == np.uint32 else 0x7FFF
    assert ((g[lifted] & magnitude) == 0).all()  # ours: a zero
    keep = ~lifted
    _assert_torch_bits(np.asarray(got)[keep], want[keep])


@pytest.mark.parametrize("backend", BACKENDS)
def test_at_scale_one_a_signaling_nan_comes_back_quiet(backend):
    # torch skips the multiply when the inverse is 1 and returns a signaling
    # NaN's bits as they were; the multiply by 1 here quiets it: still a NaN,
    # still flagged (docs/operator.md).
    grads = np.array([0x7FB9C06F, 0xFF800001, 0x3F800000], np.uint32).view(np.float32)
    want, want_found = _torch_unscale(grads, 1.0)
    run = jax.jit(lambda inv, g: unscale_and_check_leaves(inv, [g], backend))
    found, (got,) = run(inverse_scale(jnp.float32(1.0)), jnp.asarray(grads))
    assert bool(found) and want_found
    np.testing.assert_array_equal(_bits(want), _bits(grads))
    np.testing.assert_array_equal(_bits(np.asarray(got)), [0x7FF9C06F, 0xFFC00001, 0x3F800000])


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_issue_example(backend):
    state = jas.init_scale_state(2.0**127)
    g = {"g": jnp.float32(0.5 * 2.0**127)}
    out, found = jas.unscale_and_check(g, state, backend=backend)
    assert float(out["g"]) == 0.5 and not bool(found)
    assert float(jas.unscale(g, state)["g"]) == 0.5


def test_a_compile_time_constant_scale_is_not_folded_to_zero():
    # The scale closed over as a constant: XLA folds what it can, and must
    # not fold (x * m) * p into x * (m * p) (a flushed subnormal).
    f = jax.jit(lambda g: jas.unscale(g, jas.init_scale_state(2.0**127)))
    assert float(f(jnp.float32(3.0 * 2.0**126))) == 1.5


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_gradients(backend):
    with enable_x64(True):
        g = np.array([0.5 * 2.0**127, 1e300, 3.0, -1e-300], np.float64)
        for scale in [2.0**127, 1.7 * 2.0**127, 3 * 2.0**125]:
            t = torch.from_numpy(g.copy())
            found = torch.zeros(())
            torch._amp_foreach_non_finite_check_and_unscale_([t], found, _torch_inverse(scale))
            fnd, (got,) = jax.jit(lambda inv, x: unscale_and_check_leaves(inv, [x], backend))(
                inverse_scale(jnp.float32(scale)), jnp.asarray(g)
            )
            np.testing.assert_array_equal(_bits(got), _bits(t.numpy()))
            assert bool(fnd) == bool(found)


def _jax_run(steps, w0, targets, backend):
    """The GradScaler loop with the library's free functions: scale the loss
    gradient, unscale and check, skip or step (SGD), update the scale."""
    lr = np.float32(0.01)

    @jax.jit
    def step(w, state, t):
        g = (w - t) * state.scale  # d/dw of scale * 0.5 * |w - t|^2
        (g,), found = jas.unscale_and_check([g], state, backend=backend)
        w = jnp.where(found, w, w - lr * g)
        return w, jas.update_scale(state, found), found

    state = jas.init_scale_state(2.0**16, growth_interval=1)
    w, scales = jnp.asarray(w0), []
    for k in range(steps):
        w, state, _ = step(w, state, targets[k])
        scales.append(float(state.scale))
    return np.asarray(w), scales


def _torch_run(steps, w0, targets):
    w = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = torch.optim.SGD([w], lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=1)
    scales = []
    for k in range(steps):
        opt.zero_grad()
        t = torch.from_numpy(targets[k])
        # the same gradient as the JAX side, bit for bit: (w - t) * scale
        w.grad = scaler.scale(w.detach() - t)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return w.detach().numpy(), scales


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_long_run_reaches_2_to_127_and_matches_torch_gradscaler(backend):
    # growth_interval=1: the scale doubles every finite step, reaches 2**127
    # after 111 and stays there (2**128 is inf: growth refused) until an
    # overflow backs it off; targets far from w overflow at the top scales.
    steps = 3000
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal(64).astype(np.float32)
    targets = (rng.standard_normal((steps, 64)) * rng.choice([0.5, 4.0], (steps, 1))).astype(
        np.float32
    )
    got_w, got_scales = _jax_run(steps, w0, targets, backend)
    want_w, want_scales = _torch_run(steps, w0, targets)
    assert got_scales == want_scales
    assert sum(s == 2.0**127 for s in want_scales) > 100  # the regime of the bug
    np.testing.assert_array_equal(_bits(got_w), _bits(want_w))
