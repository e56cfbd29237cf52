"""Populations: `jax.vmap` over many independent models, each with its own scale.

A batched `ScaleState` (leaves with a leading population axis) goes through
`update_scale` under `vmap`; with no axis name every member follows its own
found_inf, with both backends (the FFI handler takes the whole batch in one
call).  With ``vmap(axis_name=...)`` and the same `axis_name` the members
instead share one decision.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_amp_scale as jas
from tests.population import STEPS, N, expected_member, population, random_founds, run_population

BACKENDS = ["reference", "ffi"]


@pytest.mark.parametrize("shape", [(), (1,)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16], ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_members_follow_their_own_trajectories(backend, dtype, shape):
    states, founds = population(dtype=dtype, shape=shape), random_founds()
    scales, trackers = map(np.asarray, run_population(backend)(states, founds))
    assert scales.shape == (STEPS, N, *shape) and scales.dtype == dtype
    member0 = jax.tree.map(lambda a: a[0], states)
    for m in range(N):
        want = expected_member(member0, founds[:, m])
        np.testing.assert_array_equal(np.asarray(scales[:, m]), np.stack([w[0] for w in want]))
        np.testing.assert_array_equal(np.asarray(trackers[:, m]), np.stack([w[1] for w in want]))
    # Same start, own flags, own end: the members really diverged.
    assert len({float(np.asarray(s, np.float32).ravel()[0]) for s in scales[-1]}) >= 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_members_with_different_starts(backend):
    one = jas.init_scale_state(1.0, growth_interval=3)
    states = jas.ScaleState(
        scale=jnp.asarray([2.0**k for k in range(N)], jnp.float32),
        growth_tracker=jnp.asarray(np.arange(N) % 3, jnp.int32),
        growth_factor=one.growth_factor,
        backoff_factor=one.backoff_factor,
        growth_interval=one.growth_interval,
    )
    founds = random_founds(seed=1)
    scales, trackers = map(np.asarray, run_population(backend)(states, founds))
    for m in range(N):
        member = jax.tree.map(lambda a, m=m: a[m], states)
        want = expected_member(member, founds[:, m])
        np.testing.assert_array_equal(np.asarray(scales[:, m]), np.stack([w[0] for w in want]))
        np.testing.assert_array_equal(np.asarray(trackers[:, m]), np.stack([w[1] for w in want]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_axis_name_makes_the_population_share_one_decision(backend):
    founds = random_founds(seed=2, p=0.05)
    assert 0 < founds.any(axis=1).sum() < STEPS and not founds.all(axis=1).any()
    scales = np.asarray(run_population(backend, axis_name="pop")(population(), founds)[0])
    member0 = jax.tree.map(lambda a: a[0], population())
    want = expected_member(member0, founds.any(axis=1))
    for m in range(N):
        np.testing.assert_array_equal(np.asarray(scales[:, m]), np.stack([w[0] for w in want]))


def _loss(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


def _member_step(backend):
    def step(state, w, x, y):
        grads = jax.grad(lambda w: _loss(w, x, y) * state.scale)(w) / state.scale
        found = ~jnp.all(jnp.isfinite(grads))
        return jas.update_scale(state, found, backend), jnp.where(found, w, w - 0.1 * grads)

    return step


@pytest.mark.parametrize("backend", BACKENDS)
def test_population_of_models_skips_per_member(backend):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((N, 4, 2)).astype(np.float32)
    x = rng.standard_normal((N, 8, 4)).astype(np.float32)
    y = rng.standard_normal((N, 8, 2)).astype(np.float32)
    bad = [3, 11]
    x[bad, 0, 0] = np.inf  # those members' data only
    states = population()
    new_states, new_w = jax.jit(jax.vmap(_member_step(backend)))(states, w, x, y)
    step = jax.jit(_member_step("reference"))
    for m in range(N):
        member = jax.tree.map(lambda a, m=m: a[m], states)
        want_state, want_w = step(member, w[m], x[m], y[m])
        if m in bad:
            assert new_states.scale[m] == 512.0 and new_states.growth_tracker[m] == 0
            np.testing.assert_array_equal(np.asarray(new_w[m]), w[m])
        else:
            assert new_states.scale[m] == 1024.0 and new_states.growth_tracker[m] == 1
            assert not np.array_equal(np.asarray(new_w[m]), w[m])
        assert new_states.scale[m] == want_state.scale
        np.testing.assert_allclose(np.asarray(new_w[m]), np.asarray(want_w), rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_population_of_loss_scaled_optimizers(backend):
    # vmap over optax states: every member has its own loss_scaled state,
    # skips its own overflow steps and counts them.
    optax = pytest.importorskip("optax")
    import jax_amp_scale.optax
    from jax_amp_scale.optax import get_loss_scaled_state

    tx = jax_amp_scale.optax.loss_scaled(
        optax.sgd(0.1), jas.dynamic_scaler(2.0**10, growth_interval=2), backend=backend
    )
    rng = np.random.default_rng(8)
    n, steps = 8, 5
    w = rng.standard_normal((n, 4, 2)).astype(np.float32)
    x = rng.standard_normal((steps, n, 8, 4)).astype(np.float32)
    y = rng.standard_normal((steps, n, 8, 2)).astype(np.float32)
    bad = rng.random((steps, n)) < 0.3
    x[bad, 0, 0] = np.inf
    assert bad.sum(axis=0).max() > 0 and bad.sum(axis=0).min() == 0  # members differ

    def member_step(w, opt_state, x, y):
        grads = jax.grad(lambda w: jas.scale_loss(_loss(w, x, y), opt_state))(w)
        updates, opt_state = tx.update(grads, opt_state, w)
        return optax.apply_updates(w, updates), opt_state

    step = jax.jit(jax.vmap(member_step))
    ws, opt_states = w, jax.vmap(tx.init)(w)
    for t in range(steps):
        ws, opt_states = step(ws, opt_states, x[t], y[t])
    opt = get_loss_scaled_state(opt_states)
    np.testing.assert_array_equal(np.asarray(opt.skipped_steps), bad.sum(axis=0))
    np.testing.assert_array_equal(np.asarray(opt.total_steps), np.full(n, steps))
    one_step = jax.jit(member_step)
    for m in range(n):
        wm, sm = w[m], tx.init(w[m])
        for t in range(steps):
            wm, sm = one_step(wm, sm, x[t, m], y[t, m])
        sm = get_loss_scaled_state(sm)
        assert opt.scale_state.scale[m] == sm.scale_state.scale
        assert opt.scale_state.growth_tracker[m] == sm.scale_state.growth_tracker
        np.testing.assert_allclose(np.asarray(ws[m]), np.asarray(wm), rtol=1e-6)
    assert len(set(np.asarray(opt.scale_state.scale).tolist())) >= 2
