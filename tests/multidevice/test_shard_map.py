"""Per-replica code under `shard_map` and `pmap`: `axis_name` keeps replicas in lockstep.

Inside `shard_map`/`pmap` every device computes found_inf from its own shard
of the gradients; `update_scale`, `value_and_grad` and `loss_scaled` take an
`axis_name` (a name or a tuple of names) and OR-reduce it so every replica
takes the same decision.  The state enters as a replicated scalar (``P()``)
on every device, and the FFI handler runs once per device on it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_amp_scale as jas
from tests._rule import rule
from tests.jax_compat import BEFORE_0_7, GRAD_OF_VARYING_LOSS, pcast_varying, set_mesh, shard_map

MODES = [AxisType.Explicit, AxisType.Auto]
# shard_map's replication check, as jax >= 0.7 and jax 0.6 word it.
MISSING_MODEL_AXIS = (
    r"out_specs.*varying over \{model\}|could only infer replication over \{data\}, "
    r"which is missing the required axes model"
)
OLD_GRAD = pytest.mark.xfail(BEFORE_0_7, reason=GRAD_OF_VARYING_LOSS, strict=True)
BACKENDS = ["reference", "ffi"]
# mesh shape, axis names; found_inf is reduced over all of them (a tuple
# axis_name for the 2-D mesh).
MESHES = {"1d": ((8,), ("data",)), "2d": ((4, 2), ("data", "model"))}
STEPS = 12


def _mesh(name, mode):
    shape, names = MESHES[name]
    return jax.make_mesh(shape, names, axis_types=(mode,) * len(names))


def _axis(names):
    return names[0] if len(names) == 1 else names


def _pattern(seed=0):
    """found_inf per (step, device): True on some steps for single devices."""
    rng = np.random.default_rng(seed)
    pattern = np.zeros((STEPS, 8), dtype=bool)
    for t, d in zip(
        rng.choice(STEPS, size=5, replace=False), rng.integers(0, 8, size=5), strict=True
    ):
        pattern[t, d] = True
    return pattern


def _expected(state, pattern):
    """Trajectory by the plain-Python rule (tests/_rule.py), found = OR over devices."""
    s, g = np.asarray(state.scale)[()], int(state.growth_tracker)
    scales, trackers = [], []
    for found in pattern.any(axis=1):
        s, g = rule(s, g, found, state.growth_factor, state.backoff_factor, state.growth_interval)
        scales.append(s)
        trackers.append(g)
    return np.asarray(scales, dtype=state.scale.dtype), np.asarray(trackers, np.int32)


def _local_steps(backend, axis_name):
    """Per device: STEPS updates driven by this device's column of found flags."""

    def run(state, found_local):  # found_local: (STEPS, 1) bool, this device's
        def body(state, found):
            state = jas.update_scale(state, found[0], backend, axis_name=axis_name)
            return state, (state.scale, state.growth_tracker)

        _, (scales, trackers) = jax.lax.scan(body, state, found_local)
        return scales, trackers

    return run


def _all_shards(x):
    return [np.asarray(s.data) for s in x.addressable_shards]


# Every mode x backend x mesh in float32; the narrow dtypes on one mesh.
_LOCKSTEP_CASES = [
    (mode, backend, mesh, jnp.float32) for mode in MODES for backend in BACKENDS for mesh in MESHES
] + [(AxisType.Explicit, b, "2d", dt) for b in BACKENDS for dt in (jnp.float16, jnp.bfloat16)]


@pytest.mark.parametrize(("mode", "backend", "mesh_name", "dtype"), _LOCKSTEP_CASES, ids=str)
def test_shard_map_replicas_stay_in_lockstep(mode, backend, mesh_name, dtype):
    mesh = _mesh(mesh_name, mode)
    names = mesh.axis_names
    state = jas.init_scale_state(2.0**10, growth_interval=3, dtype=dtype)
    pattern = _pattern()
    want_scales, want_trackers = _expected(state, pattern)
    assert len(set(want_scales.astype(np.float32).tolist())) >= 3  # not vacuous

    fn = shard_map(
        _local_steps(backend, _axis(names)),
        mesh=mesh,
        in_specs=(P(), P(None, names)),
        out_specs=P(),  # shard_map checks these are replicated (check_vma)
    )
    with set_mesh(mesh):
        found = jax.device_put(pattern, NamedSharding(mesh, P(None, names)))
        scales, trackers = jax.jit(fn)(state, found)
    assert scales.dtype == dtype
    for shard in _all_shards(scales):  # every device holds the same values
        np.testing.assert_array_equal(shard, want_scales)
    for shard in _all_shards(trackers):
        np.testing.assert_array_equal(shard, want_trackers)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_shard_map_training_step_skips_on_every_device(mode, backend):
    mesh = _mesh("2d", mode)
    axes = ("data", "model")
    rng = np.random.default_rng(3)
    params = rng.standard_normal((8, 4)).astype(np.float32)
    grads = rng.standard_normal((8, 4)).astype(np.float32)
    grads_bad = grads.copy()
    grads_bad[5, 3] = np.inf  # one element, on one device

    def step(state, p, g):
        found = ~jnp.all(jnp.isfinite(g))  # this device's shard only
        state = jas.update_scale(state, found, backend, axis_name=axes)
        skipped = state.growth_tracker == 0  # growth_interval > steps taken
        return state, jnp.where(skipped, p, p - 0.5 * g)

    fn = jax.jit(
        shard_map(step, mesh=mesh, in_specs=(P(), P(*axes), P(*axes)), out_specs=(P(), P(*axes)))
    )
    state = jas.init_scale_state(2.0**10, growth_interval=100)
    with set_mesh(mesh):
        put = lambda a: jax.device_put(a, NamedSharding(mesh, P(*axes)))  # noqa: E731
        bad_state, bad_params = fn(state, put(params), put(grads_bad))
        ok_state, ok_params = fn(state, put(params), put(grads))
    assert sum(not np.all(np.isfinite(s)) for s in _all_shards(put(grads_bad))) == 1
    for s in _all_shards(bad_state.scale):
        assert s == 512.0
    np.testing.assert_array_equal(np.asarray(bad_params), params)
    for s in _all_shards(ok_state.scale):
        assert s == 1024.0
    np.testing.assert_allclose(np.asarray(ok_params), params - 0.5 * grads, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_the_axis_name_replicas_diverge(backend):
    # The control for the tests above: the reduction is what keeps replicas
    # in lockstep.  check_vma=False lets each device return its own state.
    mesh = _mesh("1d", AxisType.Explicit)
    pattern = _pattern()
    state = jas.init_scale_state(2.0**10, growth_interval=3)

    def per_device(axis_name):
        fn = shard_map(
            lambda s, f: tuple(x[None] for x in _local_steps(backend, axis_name)(s, f)),
            mesh=mesh,
            in_specs=(P(), P(None, "data")),
            out_specs=P("data"),
            check_vma=False,
        )
        with set_mesh(mesh):
            scales, _ = jax.jit(fn)(
                state, jax.device_put(pattern, NamedSharding(mesh, P(None, "data")))
            )
        return np.asarray(scales)  # (8, STEPS)

    together, apart = per_device("data"), per_device(None)
    assert all(np.array_equal(row, together[0]) for row in together)
    assert not all(np.array_equal(row, apart[0]) for row in apart)
    # Each device alone follows its own column of found flags.
    for d in range(8):
        np.testing.assert_array_equal(apart[d], _expected(state, pattern[:, d : d + 1])[0])


def _missing_axis(backend):
    """Reduces over 'data' only while found_inf varies over 'model' too."""
    mesh = _mesh("2d", AxisType.Explicit)
    spec = P(None, ("data", "model"))
    fn = shard_map(
        lambda s, f: jas.update_scale(s, f[0, 0], backend, axis_name="data").scale,
        mesh=mesh,
        in_specs=(P(), spec),
        out_specs=P(),
    )
    found = np.zeros((1, 8), dtype=bool)
    found[0, 3] = True  # the device at data=1, model=1
    with set_mesh(mesh):
        found = jax.device_put(found, NamedSharding(mesh, spec))
        return jax.jit(fn)(jas.init_scale_state(2.0**10), found)


def test_missing_axis_is_caught_by_shard_map_reference():
    # The state would differ across 'model': shard_map refuses to call it
    # replicated (out_specs=P()), at trace time.
    with pytest.raises(ValueError, match=MISSING_MODEL_AXIS):
        _missing_axis("reference")


def test_missing_axis_is_caught_by_shard_map_ffi():
    with pytest.raises(ValueError, match=MISSING_MODEL_AXIS):
        _missing_axis("ffi")


# --- pmap ---------------------------------------------------------------------


def _replicate(tree, n=8):
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (n, *a.shape)), tree)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pmap_replicas_stay_in_lockstep(backend):
    state = jas.init_scale_state(2.0**10, growth_interval=3)
    pattern = _pattern(seed=5)
    want_scales, want_trackers = _expected(state, pattern)
    run = jax.pmap(_local_steps(backend, "replica"), axis_name="replica")
    scales, trackers = run(_replicate(state), pattern.T[:, :, None])
    for d in range(8):
        np.testing.assert_array_equal(np.asarray(scales[d]), want_scales)
        np.testing.assert_array_equal(np.asarray(trackers[d]), want_trackers)
    # Without the axis name each replica follows its own flags.
    scales, _ = jax.pmap(_local_steps(backend, None))(_replicate(state), pattern.T[:, :, None])
    for d in range(8):
        np.testing.assert_array_equal(
            np.asarray(scales[d]), _expected(state, pattern[:, d : d + 1])[0]
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_pmap_training_step_skips_on_every_replica(backend):
    rng = np.random.default_rng(4)
    params = rng.standard_normal((8, 3)).astype(np.float32)
    grads = rng.standard_normal((8, 3)).astype(np.float32)
    grads[6, 1] = np.nan  # replica 6 only

    def step(state, p, g):
        found = ~jnp.all(jnp.isfinite(g))
        new_state = jas.update_scale(state, found, backend, axis_name="i")
        skip = new_state.scale < state.scale
        return new_state, jnp.where(skip, p, p - 0.5 * g)

    state, new_params = jax.pmap(step, axis_name="i")(
        _replicate(jas.init_scale_state(2.0**10)), params, grads
    )
    np.testing.assert_array_equal(np.asarray(state.scale), np.full(8, 512.0, np.float32))
    np.testing.assert_array_equal(np.asarray(new_params), params)


# --- the training layer: value_and_grad and loss_scaled take axis_name -------

ROWS = 16  # global batch: 2 rows per device on the 1-D mesh


def _batches(bad_step, bad_row=5, steps=4):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((steps, ROWS, 4)).astype(np.float32)
    x[bad_step, bad_row, 0] = np.inf  # row 5: device 2 only
    return x


def _loss(w, x):
    return jnp.mean((x @ w - 1.0) ** 2)


def _varying(tree, axis):
    # Typed as varying, replicated params get this device's gradient; typed
    # replicated, shard_map would hand back the gradient already summed.
    return jax.tree.map(lambda a: pcast_varying(a, axis), tree)


@pytest.mark.parametrize("mode", MODES, ids=str)
@OLD_GRAD
def test_gradients_of_replicated_params_come_back_summed(mode):
    # Why _varying exists (README): shard_map transposes the implicit
    # broadcast of a replicated param into a sum over the axis.
    mesh = _mesh("1d", mode)
    w = np.ones((4,), np.float32)
    x = _batches(0)[1]

    def fn(cast):
        def local(w, x):
            g = jax.grad(_loss)(_varying(w, "data") if cast else w, x)
            return g[None]

        return shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data"))

    with set_mesh(mesh):
        xd = jax.device_put(x, NamedSharding(mesh, P("data")))
        local_grads = np.asarray(jax.jit(fn(True))(w, xd))
        summed = np.asarray(jax.jit(fn(False))(w, xd))
    want_local = np.stack([jax.grad(_loss)(w, x[2 * d : 2 * d + 2]) for d in range(8)])
    np.testing.assert_allclose(local_grads, want_local, rtol=1e-6)
    for row in summed:
        np.testing.assert_allclose(row, want_local.sum(axis=0), rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=str)
@OLD_GRAD
def test_value_and_grad_axis_name_under_shard_map(mode, backend):
    mesh = _mesh("1d", mode)
    w = np.ones((4,), np.float32)
    state = jas.init_scale_state(2.0**10, growth_interval=3)

    def local(axis_name):
        def fn(state, w, x):
            _, grads, found = jas.value_and_grad(_loss, state, axis_name=axis_name)(
                _varying(w, "data"), x
            )
            local_found = ~jnp.all(jnp.isfinite(grads))
            return jas.update_scale(state, found, backend), found, local_found[None]

        return shard_map(
            fn, mesh=mesh, in_specs=(P(), P(), P("data")), out_specs=(P(), P(), P("data"))
        )

    with set_mesh(mesh):
        x = jax.device_put(_batches(0)[0], NamedSharding(mesh, P("data")))
        new, found, local_found = jax.jit(local("data"))(state, w, x)
        with pytest.raises(ValueError, match="out_specs"):  # the control
            jax.jit(local(None))(state, w, x)
    np.testing.assert_array_equal(np.asarray(local_found), [d == 2 for d in range(8)])
    for copy in _all_shards(found):
        assert copy
    for copy in _all_shards(new.scale):
        assert copy == 512.0


def _loss_scaled(backend, axis_name):
    optax = pytest.importorskip("optax")
    import jax_amp_scale.optax

    return jax_amp_scale.optax.loss_scaled(
        optax.sgd(0.1),
        jas.dynamic_scaler(2.0**10, growth_interval=3),
        axis_name=axis_name,
        backend=backend,
    )


def _loss_scaled_run(tx, step, w, xs):
    opt_state = tx.init(w)
    for x in xs:
        w, opt_state = step(w, opt_state, x)
    from jax_amp_scale.optax import get_loss_scaled_state

    return w, get_loss_scaled_state(opt_state)


def _global_loss_scaled(backend):
    """The same training on the global batch, no mapping: the oracle."""
    import optax

    tx = _loss_scaled(backend, None)

    @jax.jit
    def step(w, opt_state, x):
        # Mean of the 8 per-device losses = mean over the global batch.
        grads = jax.grad(lambda w: jas.scale_loss(_loss(w, x), opt_state))(w)
        updates, opt_state = tx.update(grads, opt_state, w)
        return optax.apply_updates(w, updates), opt_state

    return tx, step


def _check_loss_scaled(w, opt, want_w, want_opt, copies):
    # One overflow (step 1, one device) -> one skip everywhere.
    assert int(want_opt.skipped_steps) == 1 and int(want_opt.total_steps) == 4
    for leaf in ("skipped_steps", "total_steps", "found_inf"):
        for copy in copies(getattr(opt, leaf)):
            assert copy == np.asarray(getattr(want_opt, leaf)), leaf
    for copy in copies(opt.scale_state.scale):
        assert copy == 512.0
    for copy in copies(opt.scale_state.growth_tracker):
        assert copy == 2
    np.testing.assert_allclose(np.asarray(w), np.asarray(want_w), rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=str)
@OLD_GRAD
def test_loss_scaled_axis_name_under_shard_map(mode, backend):
    import optax

    mesh = _mesh("1d", mode)
    tx = _loss_scaled(backend, "data")
    xs = _batches(bad_step=1)

    def local(w, opt_state, x):
        # LOCAL scaled gradients in: loss_scaled reduces found_inf itself.
        grads = jax.grad(lambda w: jas.scale_loss(_loss(w, x), opt_state))(_varying(w, "data"))
        updates, opt_state = tx.update(grads, opt_state, w)
        # sgd is linear: the mean of local updates is the update of the mean.
        updates = jax.lax.pmean(updates, "data")
        return optax.apply_updates(w, updates), opt_state

    step = jax.jit(
        shard_map(local, mesh=mesh, in_specs=(P(), P(), P("data")), out_specs=(P(), P()))
    )
    w0 = np.ones((4,), np.float32)
    with set_mesh(mesh):
        w, opt = _loss_scaled_run(
            tx, step, w0, [jax.device_put(x, NamedSharding(mesh, P("data"))) for x in xs]
        )
    want_w, want_opt = _loss_scaled_run(*_global_loss_scaled("reference"), w0, xs)
    _check_loss_scaled(w, opt, want_w, want_opt, _all_shards)


@pytest.mark.parametrize("backend", BACKENDS)
def test_value_and_grad_and_loss_scaled_under_pmap(backend):
    import optax

    tx = _loss_scaled(backend, "i")
    xs = _batches(bad_step=1).reshape(4, 8, ROWS // 8, 4)  # (steps, replica, rows, 4)

    def local(w, opt_state, x):
        _, grads, found = jas.value_and_grad(_loss, opt_state, axis_name="i")(w, x)
        scaled = jas.scale_loss(grads, opt_state)  # loss_scaled wants scaled grads
        updates, opt_state = tx.update(scaled, opt_state, w)
        updates = jax.lax.pmean(updates, "i")
        return optax.apply_updates(w, updates), opt_state, found

    step = jax.pmap(local, axis_name="i")
    w = _replicate(jnp.ones((4,), np.float32))
    opt_state = _replicate(tx.init(jnp.ones((4,), np.float32)))
    founds = []
    for x in xs:
        w, opt_state, found = step(w, opt_state, x)
        founds.append(np.asarray(found))
    np.testing.assert_array_equal(np.stack(founds), np.repeat([[0], [1], [0], [0]], 8, axis=1))
    from jax_amp_scale.optax import get_loss_scaled_state

    want_w, want_opt = _loss_scaled_run(
        *_global_loss_scaled("reference"), np.ones((4,), np.float32), _batches(bad_step=1)
    )
    for d in range(8):
        opt = jax.tree.map(lambda a, d=d: a[d], get_loss_scaled_state(opt_state))
        _check_loss_scaled(w[d], opt, want_w, want_opt, lambda a: [np.asarray(a)])
