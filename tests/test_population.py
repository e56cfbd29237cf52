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
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_amp_scale as jas
from tests._rule import rule

BACKENDS = ["reference", "ffi"]
N = 16
STEPS = 20


def _population(n=N, dtype=jnp.float32, shape=(), init_scale=2.0**10):
    one = jas.init_scale_state(init_scale, growth_interval=3, dtype=dtype, shape=shape)
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (n, *a.shape)), one)


def _found(seed=0, n=N, p=0.2):
    return np.random.default_rng(seed).random((STEPS, n)) < p


def _expected_member(state, founds):
    """One member alone, step by step, by the plain-Python rule (tests/_rule.py)."""
    s = np.asarray(state.scale).reshape(-1)[0]
    g = int(np.asarray(state.growth_tracker).reshape(-1)[0])
    shape = np.shape(state.scale)
    out = []
    for f in founds:
        s, g = rule(s, g, bool(f), state.growth_factor, state.backoff_factor, state.growth_interval)
        out.append((np.full(shape, s), np.full(shape, g, np.int32)))
    return out


def _run_population(backend, axis_name=None):
    def step(states, found):
        new = jax.vmap(
            lambda s, f: jas.update_scale(s, f, backend, axis_name=axis_name),
            axis_name=axis_name,
        )(states, found)
        return new, (new.scale, new.growth_tracker)

    @jax.jit
    def run(states, founds):
        return jax.lax.scan(step, states, founds)[1]

    return run


@pytest.mark.parametrize("shape", [(), (1,)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16], ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_members_follow_their_own_trajectories(backend, dtype, shape):
    states, founds = _population(dtype=dtype, shape=shape), _found()
    scales, trackers = map(np.asarray, _run_population(backend)(states, founds))
    assert scales.shape == (STEPS, N, *shape) and scales.dtype == dtype
    member0 = jax.tree.map(lambda a: a[0], states)
    for m in range(N):
        want = _expected_member(member0, founds[:, m])
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
    founds = _found(seed=1)
    scales, trackers = map(np.asarray, _run_population(backend)(states, founds))
    for m in range(N):
        member = jax.tree.map(lambda a, m=m: a[m], states)
        want = _expected_member(member, founds[:, m])
        np.testing.assert_array_equal(np.asarray(scales[:, m]), np.stack([w[0] for w in want]))
        np.testing.assert_array_equal(np.asarray(trackers[:, m]), np.stack([w[1] for w in want]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_axis_name_makes_the_population_share_one_decision(backend):
    founds = _found(seed=2, p=0.05)
    assert 0 < founds.any(axis=1).sum() < STEPS and not founds.all(axis=1).any()
    scales = np.asarray(_run_population(backend, axis_name="pop")(_population(), founds)[0])
    member0 = jax.tree.map(lambda a: a[0], _population())
    want = _expected_member(member0, founds.any(axis=1))
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
    states = _population()
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


_needs_8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (tests/conftest.py)")
MODES = [AxisType.Explicit, AxisType.Auto]


def _pop_mesh(mode):
    return jax.make_mesh((8,), ("pop",), axis_types=(mode,))


def _one_step(backend):
    return jax.jit(jax.vmap(lambda s, f: jas.update_scale(s, f, backend)))


_FFI_UNPARTITIONED = (
    "XLA cannot partition the jas_update_scale custom call: under jit it "
    "all-gathers a sharded population and returns it replicated, which in "
    "explicit mode changes the type of the state. Use shard_map (test below)."
)


@_needs_8
@pytest.mark.parametrize(
    ("mode", "backend"),
    [
        (AxisType.Explicit, "reference"),
        (AxisType.Auto, "reference"),
        pytest.param(
            AxisType.Explicit,
            "ffi",
            marks=pytest.mark.xfail(strict=True, raises=ValueError, reason=_FFI_UNPARTITIONED),
        ),
        (AxisType.Auto, "ffi"),
    ],
    ids=str,
)
def test_population_sharded_over_devices(mode, backend):
    # Members spread over the mesh (2 per device): the same trajectories.
    states, founds = _population(), _found(seed=4)[:6]
    want = [_expected_member(jax.tree.map(lambda a: a[0], states), founds[:, m]) for m in range(N)]
    step = _one_step(backend)
    mesh = _pop_mesh(mode)
    with jax.set_mesh(mesh):
        states = jax.device_put(states, NamedSharding(mesh, P("pop")))
        for t, found in enumerate(founds):
            states = step(states, jax.device_put(found, NamedSharding(mesh, P("pop"))))
            np.testing.assert_array_equal(np.asarray(states.scale), [w[t][0] for w in want])
            np.testing.assert_array_equal(
                np.asarray(states.growth_tracker), [w[t][1] for w in want]
            )


def _collectives(text):
    ops = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")
    return [line for line in text.splitlines() if any(f" {op}(" in line for op in ops)]


def _stays_sharded(mode, backend):
    mesh = _pop_mesh(mode)
    with jax.set_mesh(mesh):
        sharding = NamedSharding(mesh, P("pop"))
        states = jax.device_put(_population(), sharding)
        found = jax.device_put(_found(seed=4)[0], sharding)
        out = _one_step(backend)(states, found)
        text = _one_step(backend).lower(states, found).compile().as_text()
    assert out.scale.sharding.is_equivalent_to(sharding, 1), out.scale.sharding
    assert _collectives(text) == []


@_needs_8
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_sharded_population_stays_sharded_reference(mode):
    _stays_sharded(mode, "reference")


@_needs_8
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=_FFI_UNPARTITIONED)
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_sharded_population_stays_sharded_ffi(mode):
    _stays_sharded(mode, "ffi")


@_needs_8
@pytest.mark.parametrize(
    "backend",
    [
        "reference",
        "ffi",
    ],
)
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_sharded_population_under_shard_map(mode, backend):
    # Each device updates its own members (vmap inside shard_map): no
    # collective, the population stays where it is, and the trajectories are
    # those of the members alone.
    states, founds = _population(), _found(seed=5)
    want_scales, want_trackers = _run_population("reference")(states, founds)
    mesh = _pop_mesh(mode)
    with jax.set_mesh(mesh):
        run = jax.jit(
            jax.shard_map(
                _run_population(backend),
                mesh=mesh,
                in_specs=(P("pop"), P(None, "pop")),
                out_specs=P(None, "pop"),
            )
        )
        args = (
            jax.device_put(states, NamedSharding(mesh, P("pop"))),
            jax.device_put(founds, NamedSharding(mesh, P(None, "pop"))),
        )
        scales, trackers = run(*args)
        assert _collectives(run.lower(*args).compile().as_text()) == []
    np.testing.assert_array_equal(np.asarray(scales), np.asarray(want_scales))
    np.testing.assert_array_equal(np.asarray(trackers), np.asarray(want_trackers))


@pytest.mark.parametrize("backend", BACKENDS)
def test_population_of_loss_scaled_optimizers(backend):
    # vmap over optax states: every member has its own loss_scaled state,
    # skips its own overflow steps and counts them.
    optax = pytest.importorskip("optax")
    import jax_amp_scale.optax
    from jax_amp_scale.optax import get_loss_scaled_state

    tx = jax_amp_scale.optax.loss_scaled(
        optax.sgd(0.1), jas.dynamic_scale(2.0**10, growth_interval=2), backend=backend
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
