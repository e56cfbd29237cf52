"""Trainer: one jitted step (scale, grad, unscale, check, update, skip)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas


def loss_fn(p, batch):
    pred = batch["x"] @ p["w"] + p["b"]
    return jnp.mean((pred.astype(jnp.float32) - batch["y"]) ** 2)


def setup(n=16):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)
    params = {"w": jnp.zeros(3), "b": jnp.zeros(())}
    return params, {"x": x, "y": y}


def test_matches_plain_optax_on_finite_steps():
    params, batch = setup()
    trainer = jas.Trainer(optax.sgd(0.1), jas.dynamic_scaler(2.0**10))
    state = trainer.init(params)
    step = jax.jit(trainer.step, static_argnums=3)
    ref_p, opt = params, optax.sgd(0.1)
    ref_s = opt.init(ref_p)
    for _ in range(5):
        params, state, m = step(params, state, batch, loss_fn)
        ref_loss, g = jax.value_and_grad(loss_fn)(ref_p, batch)
        u, ref_s = opt.update(g, ref_s)
        ref_p = optax.apply_updates(ref_p, u)
        assert float(m["loss"]) == pytest.approx(float(ref_loss), rel=1e-6)
    for k in params:
        np.testing.assert_allclose(params[k], ref_p[k], rtol=1e-6)
    assert m["loss"].dtype == jnp.float32
    assert float(m["scale"]) == 2.0**10 and not bool(m["skipped"])
    assert int(m["total_steps"]) == 5 and int(m["skipped_steps"]) == 0


def test_skip_keeps_params_bitwise_including_negative_zero():
    params = {"w": jnp.array([-0.0, 1.0]), "b": jnp.array(-0.0)}
    batch = {"x": np.ones((2, 2), np.float32), "y": np.array([np.inf, 0.0], np.float32)}
    trainer = jas.Trainer(optax.sgd(0.1), jas.dynamic_scaler(8.0))
    state = trainer.init(params)
    new, state2, m = jax.jit(trainer.step, static_argnums=3)(params, state, batch, loss_fn)
    assert bool(m["skipped"]) and bool(m["found_inf"]) and int(m["skipped_steps"]) == 1
    assert float(m["scale"]) == 8.0 and float(state2.scale) == 4.0
    for k in params:
        assert np.asarray(new[k]).tobytes() == np.asarray(params[k]).tobytes()


def test_policy_o2_float16_compute_float32_master():
    params, batch = setup()
    seen = {}

    def lf(p, b):
        seen["w"], seen["x"] = p["w"].dtype, b["x"].dtype
        return loss_fn(p, b)

    trainer = jas.Trainer(
        optax.adam(1e-2), jas.dynamic_scaler(2.0**10), policy=jas.get_policy("O2")
    )
    state = trainer.init(params)
    p2, state, m = trainer.step(params, state, batch, lf)
    assert seen == {"w": jnp.float16, "x": jnp.float16}
    assert p2["w"].dtype == jnp.float32 and m["loss"].dtype == jnp.float32
    assert not bool(m["skipped"]) and float(m["loss"]) > 0


def test_has_aux_and_static_and_noop():
    params, batch = setup()

    def lf(p, b):
        return loss_fn(p, b), {"n": jnp.int32(7)}

    for kind in (jas.static_scaler(128.0), jas.no_op_scaler()):
        trainer = jas.Trainer(optax.sgd(0.1), kind, has_aux=True)
        _, _st, m = trainer.step(params, trainer.init(params), batch, lf)
        assert int(m["aux"]["n"]) == 7 and float(m["scale"]) == float(kind.scale)


@pytest.mark.slow
@pytest.mark.trimmed
def test_axis_name_data_parallel():
    params, batch = setup(16)
    shards = jax.tree_util.tree_map(lambda a: a.reshape(4, 4, *a.shape[1:]), batch)
    trainer = jas.Trainer(optax.sgd(0.1), jas.dynamic_scaler(4.0), axis_name="d")
    state = trainer.init(params)
    p_dp, _, m = jax.vmap(lambda b: trainer.step(params, state, b, loss_fn), axis_name="d")(shards)
    single = jas.Trainer(optax.sgd(0.1), jas.dynamic_scaler(4.0))
    p1, _, _m1 = single.step(params, single.init(params), batch, loss_fn)
    for k in params:  # pmean of equal-size shard means = full-batch mean
        np.testing.assert_allclose(p_dp[k], np.broadcast_to(p1[k], p_dp[k].shape), rtol=1e-5)
    # one replica overflows: all skip
    bad = jax.tree_util.tree_map(np.array, shards)
    bad["y"][2, 0] = np.inf
    _, _, m = jax.vmap(lambda b: trainer.step(params, state, b, loss_fn), axis_name="d")(bad)
    np.testing.assert_array_equal(m["skipped"], [True] * 4)


def test_bad_input():
    params, batch = setup()
    with pytest.raises(TypeError, match="policy"):
        jas.Trainer(optax.sgd(0.1), policy="O2")
    with pytest.raises(TypeError, match="inner"):
        jas.Trainer(lambda g: g)
    trainer = jas.Trainer(optax.sgd(0.1))
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        trainer.step(params, trainer.init(params), batch, None)
    with pytest.raises(TypeError, match="floating scalar"):
        trainer.step(params, trainer.init(params), batch, lambda p, b: p["w"])


def test_has_aux_loss_fn_not_returning_a_pair():
    # Before: a raw unpacking error (a scalar, three items), or a two-element
    # loss vector silently split into loss and aux.
    params, batch = setup()
    trainer = jas.Trainer(optax.sgd(0.1), jas.static_scaler(8.0), has_aux=True)
    state = trainer.init(params)
    not_pairs = (
        loss_fn,
        lambda p, b: (loss_fn(p, b), 1, 2),
        lambda p, b: jnp.stack([loss_fn(p, b), 0.0]),
    )
    for lf in not_pairs:
        with pytest.raises(
            TypeError, match=r"with has_aux=True, loss_fn must return a pair \(loss, aux\)"
        ):
            trainer.step(params, state, batch, lf)
    # A list pair still works, as before (and as in jax.grad(has_aux=True)).
    _, _, m = trainer.step(params, state, batch, lambda p, b: [loss_fn(p, b), jnp.int32(7)])
    assert int(m["aux"]) == 7


def test_flax_linen_model():
    nn = pytest.importorskip("flax.linen")

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(8)(x)
            x = nn.LayerNorm()(x)
            return nn.Dense(1)(nn.relu(x))[:, 0]

    model = MLP()
    _params, batch = setup()
    variables = model.init(jax.random.PRNGKey(0), batch["x"])

    def lf(v, b):
        return jnp.mean((model.apply(v, b["x"]).astype(jnp.float32) - b["y"]) ** 2)

    trainer = jas.Trainer(optax.adam(1e-2), policy=jas.get_policy("O2"))
    state = trainer.init(variables)
    step = jax.jit(trainer.step, static_argnums=3)
    first = None
    for _ in range(30):
        variables, state, m = step(variables, state, batch, lf)
        first = first if first is not None else float(m["loss"])
    assert float(m["loss"]) < 0.5 * first
    ln = variables["params"]["LayerNorm_0"]["scale"]
    assert ln.dtype == jnp.float32


def test_flax_nnx_model():
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    _, batch = setup()

    def lf(p, b):
        m = nnx.merge(graphdef, p)
        return jnp.mean((m(b["x"])[:, 0].astype(jnp.float32) - b["y"]) ** 2)

    trainer = jas.Trainer(optax.adam(5e-2), policy=jas.get_policy("O2"))
    state = trainer.init(params)
    step = jax.jit(trainer.step, static_argnums=3)
    losses = []
    for _ in range(40):
        params, state, m = step(params, state, batch, lf)
        losses.append(float(m["loss"]))
    assert losses[-1] < 0.5 * losses[0]


def test_equinox_model():
    eqx = pytest.importorskip("equinox")
    model = eqx.nn.Linear(3, "scalar", key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    _, batch = setup()

    def lf(p, b):
        m = eqx.combine(p, static)
        return jnp.mean((jax.vmap(m)(b["x"]).astype(jnp.float32) - b["y"]) ** 2)

    trainer = jas.Trainer(optax.adam(5e-2), policy=jas.get_policy("O2"))
    state = trainer.init(params)
    step = jax.jit(trainer.step, static_argnums=3)
    losses = []
    for _ in range(40):
        params, state, m = step(params, state, batch, lf)
        losses.append(float(m["loss"]))
    assert losses[-1] < 0.5 * losses[0]
    assert eqx.combine(params, static).weight.dtype == jnp.float32
