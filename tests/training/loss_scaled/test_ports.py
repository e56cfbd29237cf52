"""Ports that read naturally with the new names.

1. jmp's own loss-scale tests (jmp/_src/loss_scale_test.py), rewritten for
   scalers: jmp's ``adjust(grads_finite)`` is ``update(~grads_finite)`` here.
2. torch's ``GradScaler`` training loop, line by line, with torch 2.13 (CPU)
   as the oracle.
3. The training pytrees under ``jax.export`` serialization.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale.optax import loss_scaled, optimizer_step

# ------------------------------------------------------------------ jmp


def test_no_op_scaler_returns_the_tree_itself():
    scaler = jas.no_op_scaler()
    tree = {"a": jnp.ones([])}
    assert scaler.scale_loss(tree) is tree
    assert scaler.unscale(tree) is tree


@pytest.mark.parametrize("make", [jas.static_scaler, jas.dynamic_scaler])
@pytest.mark.parametrize("scale", [2.0, 3.0, 4.0])
def test_scale_loss_and_unscale(make, scale):
    scaler = make(scale)
    tree = {"a": jnp.array(1.0)}
    scaled = {"a": jnp.array(1.0 * scale)}
    assert scaler.scale_loss(tree) == scaled
    assert scaler.unscale(scaled) == tree


def test_static_scaler_leaves_are_its_scale_state():
    # jmp's static scale has no leaves; here every scaler holds one ScaleState.
    leaves = jax.tree_util.tree_leaves(jas.static_scaler(2.0))
    assert len(leaves) == 2 and float(leaves[0]) == 2.0 and int(leaves[1]) == 0


def test_dynamic_scaler_no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jas.dynamic_scaler(2.0**15)


def test_dynamic_scaler_tree():
    scaler = jas.dynamic_scaler(1.0, growth_interval=2000, growth_factor=2.0)
    s = scaler.scale_state
    assert jax.tree_util.tree_leaves(scaler) == [s.scale, s.growth_tracker, scaler.hysteresis_left]
    assert jax.tree_util.tree_map(lambda x: x, scaler) == scaler


@pytest.mark.parametrize("period, factor", [(20, 2.0), (30, 3.0)])
def test_dynamic_scaler_grows_on_finite(period, factor):
    grads_finite = jnp.bool_(True)
    scaler = jas.dynamic_scaler(10.0, factor, 1 / factor, period)
    for i in range(1, period):
        scaler = scaler.update(~grads_finite)
        assert scaler.scale == 10
        assert scaler.scale_state.growth_tracker == i
        assert scaler.scale_state.growth_interval == period
        assert scaler.scale_state.growth_factor == factor
    scaler = scaler.update(~grads_finite)  # the tracker wraps
    assert scaler.scale == 10 * factor
    assert scaler.scale_state.growth_tracker == 0


@pytest.mark.parametrize(
    "period, factor, min_scale",
    [(20, 2.0, 1.0), (30, 3.0, 1.0), (20, 2.0, 0.3125), (30, 3.0, 0.37)],
)
def test_dynamic_scaler_backs_off_to_its_minimum(period, factor, min_scale):
    grads_finite = jnp.bool_(False)
    init = 10.0
    scaler = jas.dynamic_scaler(init, factor, 1 / factor, period, min_scale=min_scale)
    assert init / factor**100 < 1, "should cover max(min_scale, S)"
    for i in range(100):
        scaler = scaler.update(~grads_finite)
        np.testing.assert_allclose(
            scaler.scale, max(min_scale, init / factor ** (i + 1)), rtol=1e-5
        )
        assert scaler.scale_state.growth_tracker == 0


def test_dynamic_scaler_without_minimum_goes_on_down():
    scaler = jas.dynamic_scaler(10.0, 2.0, 0.5, 5)
    for i in range(100):
        scaler = scaler.update(True)
        np.testing.assert_allclose(scaler.scale, 10.0 / 2 ** (i + 1), rtol=1e-5)


def test_integer_scale_is_refused():
    # jmp warns on an integer loss scale; a scaler refuses it.
    with pytest.raises(TypeError, match="dtype"):
        jas.dynamic_scaler(1.0, dtype=jnp.int32)


@pytest.mark.parametrize("non_finite", [jnp.inf, jnp.nan])
def test_all_finite(non_finite):
    assert jas.all_finite(None)
    assert jas.all_finite({})
    assert not jas.all_finite({"a": jnp.array(non_finite)})
    assert not jas.all_finite({"a": jnp.ones([]), "b": jnp.array(non_finite)})
    assert not jas.all_finite({"a": jnp.array(non_finite), "b": jnp.ones([])})
    assert jas.all_finite({"a": jnp.ones([]), "b": jnp.ones([])})


def _with_minimum(minimum):
    return jas.dynamic_scaler(4.0, 2.0, 0.5, 3, min_scale=minimum)


@pytest.mark.parametrize("minimum", [0.125, 4.0])
def test_jit_update_matches_eager(minimum):
    update = jax.jit(lambda s, found: s.update(found))
    eager = compiled = _with_minimum(minimum)
    for finite in (False, False, False, True, True, True, False):
        eager = eager.update(jnp.array(not finite))
        compiled = update(compiled, jnp.array(not finite))
        assert compiled.scale == eager.scale and compiled.min_scale == minimum
        assert compiled.scale_state.growth_tracker == eager.scale_state.growth_tracker


def test_scan_matches_eager():
    finite = jnp.array([False, False, False, True, True, True, False])
    scaler = _with_minimum(4.0)

    def step(s, grads_finite):
        s = s.update(~grads_finite)
        return s, s.scale

    expected, state = [], scaler
    for flag in finite:
        state = state.update(~flag)
        expected.append(float(state.scale))
    for run in (
        lambda s: jax.lax.scan(step, s, finite),
        jax.jit(lambda s: jax.lax.scan(step, s, finite)),
    ):
        final, values = run(scaler)
        np.testing.assert_array_equal(values, expected)
        assert final.scale == state.scale and final.min_scale == 4.0


def test_vmap_updates_a_population():
    base = jas.dynamic_scaler(8.0, min_scale=2.0)
    population = jax.tree_util.tree_map(lambda x: jnp.stack([x] * 4), base)
    found = jnp.array([True, False, True, True])
    out = jax.jit(jax.vmap(lambda s, f: s.update(f)))(population, found)
    np.testing.assert_array_equal(out.scale, [4.0, 8.0, 4.0, 4.0])
    np.testing.assert_array_equal(out.scale_state.growth_tracker, [0, 1, 0, 0])


# ----------------------------------------------------------------- torch


def test_torch_gradscaler_loop_line_by_line():
    """torch's documented AMP loop with clipping, ported line by line."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((12, 16, 3)).astype(np.float32)
    ys = rng.standard_normal((12, 16)).astype(np.float32)
    xs[[2, 5, 6], 0, 0] = np.inf  # overflowing steps
    w0 = np.array([0.5, -0.25, 1.0], np.float32)

    # torch
    w = torch.tensor(w0, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    t_w, t_scale = [], []
    for x, y in zip(xs, ys, strict=True):
        opt.zero_grad()
        loss = ((torch.from_numpy(x) @ w - torch.from_numpy(y)) ** 2).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_([w], 1.0)
        scaler.step(opt)
        scaler.update()
        t_w.append(w.detach().numpy().copy())
        t_scale.append(scaler.get_scale())

    # here
    def loss_fn(w, x, y):
        return jnp.mean((x @ w - y) ** 2)

    params = jnp.asarray(w0)
    tx = optax.sgd(0.05, momentum=0.9)
    opt_state = tx.init(params)
    scaler = jas.dynamic_scaler(1024.0, growth_interval=2)

    @jax.jit
    def step(params, opt_state, scaler, x, y):
        grads = jax.grad(lambda p: scaler.scale_loss(loss_fn(p, x, y)))(params)
        grads, found = scaler.unscale_and_check(grads)
        grads, _ = jas.clip_by_global_norm(grads, 1.0)
        params, opt_state = optimizer_step(tx, grads, opt_state, params, found)
        scaler = scaler.update(found)
        return params, opt_state, scaler

    for t, (x, y) in enumerate(zip(xs, ys, strict=True)):
        params, opt_state, scaler = step(params, opt_state, scaler, x, y)
        np.testing.assert_allclose(np.asarray(params), t_w[t], rtol=1e-5, atol=1e-7)
        assert float(scaler.scale) == t_scale[t]


def test_torch_gradscaler_loop_as_loss_scaled():
    """The same loop with loss_scaled and clip_grad_norm inside it."""
    torch = pytest.importorskip("torch")
    from jax_amp_scale.optax import clip_grad_norm

    rng = np.random.default_rng(8)
    xs = rng.standard_normal((10, 16, 3)).astype(np.float32)
    ys = rng.standard_normal((10, 16)).astype(np.float32)
    xs[[1, 4], 0, 0] = np.inf
    w0 = np.array([0.5, -0.25, 1.0], np.float32)
    w = torch.tensor(w0, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=3)
    t_w = []
    for x, y in zip(xs, ys, strict=True):
        opt.zero_grad()
        loss = ((torch.from_numpy(x) @ w - torch.from_numpy(y)) ** 2).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_([w], 0.5)
        scaler.step(opt)
        scaler.update()
        t_w.append(w.detach().numpy().copy())

    tx = loss_scaled(
        optax.chain(clip_grad_norm(0.5), optax.sgd(0.05, momentum=0.9)),
        jas.dynamic_scaler(256.0, growth_interval=3),
    )
    params = jnp.asarray(w0)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x, y):
        loss = lambda p: jas.scale_loss(jnp.mean((x @ p - y) ** 2), opt_state)  # noqa: E731
        updates, opt_state = tx.update(jax.grad(loss)(params), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for t, (x, y) in enumerate(zip(xs, ys, strict=True)):
        params, opt_state = step(params, opt_state, x, y)
        np.testing.assert_allclose(np.asarray(params), t_w[t], rtol=1e-5, atol=1e-7)
    assert float(opt_state.scale) == scaler.get_scale()
    assert int(opt_state.skipped_steps) == 2 and int(opt_state.total_steps) == 10


# ---------------------------------------------------------------- export


def test_training_pytrees_are_registered_for_export():
    """Each training node round-trips through jax.export serialization under
    its ``jax_amp_scale.<name>``.  (The nodes hold plain arrays here: the
    operator's ScaleState is registered by the state layer.)"""
    from jax import export

    from jax_amp_scale.optax import AccumulationState, ClipGradNormState, LossScaledState
    from jax_amp_scale.training.scalers import DynamicScaler, NoOpScaler, StaticScaler

    one = jnp.float32(1.0)
    tree = (
        DynamicScaler(one, jnp.int32(1), 2.0, None, 3, False),
        StaticScaler(one, drop_overflow_update=False),
        NoOpScaler(one),
        LossScaledState(one, {"m": one}, jnp.int32(0), jnp.int32(0), jnp.int32(0)),
        AccumulationState(one, jnp.int32(0), [one]),
        ClipGradNormState(one),
    )
    exp = export.export(jax.jit(lambda t: t))(tree)
    back = export.deserialize(exp.serialize())
    out = back.call(tree)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(tree)
    assert out[0].max_scale is None and out[0].hysteresis == 3 and not out[1].drop_overflow_update
