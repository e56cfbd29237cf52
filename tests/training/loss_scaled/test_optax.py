"""jax_amp_scale.optax.loss_scaled with optax transformations, chains and wrappers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale.optax import LossScaledState, get_loss_scaled_state, loss_scaled
from jax_amp_scale.training.scalers import as_scaler
from tests._budget import tiered
from tests._rule import rule

OVERFLOW = {2, 3, 7}
STEPS = 10


def params0():
    return {"w": jnp.array([[0.5, -1.0], [2.0, 0.25]]), "b": jnp.array([0.1, -0.2])}


def grads_at(t):
    # deterministic, step-dependent gradients
    return {
        "w": jnp.array([[1.0, -2.0], [0.5, 3.0]]) * (1 + t) / 4,
        "b": jnp.array([0.25, -0.75]) * (t % 3 - 1),
    }


def tree_equal(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def run(inner, *, overflow=OVERFLOW, scale=None, extra=None):
    """Runs loss_scaled(inner) and the inner optimizer alone on the finite steps."""
    extra = extra or {}
    tx = loss_scaled(inner, scale)
    p, ref_p = params0(), params0()
    st, ref_st = tx.init(p), inner.init(ref_p)
    upd = jax.jit(tx.update)
    ref_upd = jax.jit(inner.update)
    for t in range(STEPS):
        g = grads_at(t)
        s = st.scale
        sg = jax.tree_util.tree_map(lambda x, s=s: x * s, g)
        if t in overflow:
            sg["w"] = sg["w"].at[0, 0].set(jnp.inf if t % 2 else jnp.nan)
        before = st
        u, st = upd(sg, st, p, **extra)
        p = optax.apply_updates(p, u)
        if t in overflow:
            tree_equal(st.inner_state, before.inner_state)  # untouched, counts too
            assert all(float(jnp.max(jnp.abs(x))) == 0.0 for x in jax.tree_util.tree_leaves(u))
            assert bool(st.found_inf)
        else:
            ru, ref_st = ref_upd(g, ref_st, ref_p, **extra)
            ref_p = optax.apply_updates(ref_p, ru)
            assert not bool(st.found_inf)
        for a, b in zip(
            jax.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(ref_p), strict=True
        ):
            np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)
    assert int(st.skipped_steps) == len(overflow)
    assert int(st.total_steps) == STEPS
    return st, ref_st


INNERS = {
    "sgd": lambda: optax.sgd(0.1, momentum=0.9),
    "adam": lambda: optax.adam(1e-2),
    "adamw": lambda: optax.adamw(1e-2, weight_decay=1e-2),
    "lion": lambda: optax.lion(1e-3),
    "clip+adam": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2)),
    "chain": lambda: optax.chain(
        optax.scale_by_adam(), optax.add_decayed_weights(1e-3), optax.scale(-1e-2)
    ),
    "multisteps": lambda: optax.MultiSteps(optax.adam(1e-2), every_k_schedule=3),
    "inject_hyperparams": lambda: optax.inject_hyperparams(optax.adam)(
        learning_rate=optax.linear_schedule(1e-2, 1e-3, 8)
    ),
    "schedule": lambda: optax.adam(optax.exponential_decay(1e-2, 2, 0.5)),
    "contrib.schedule_free": lambda: optax.contrib.schedule_free_adamw(1e-2),
    "contrib.prodigy": lambda: optax.contrib.prodigy(1.0),
    "masked": lambda: optax.masked(optax.adam(1e-2), {"w": True, "b": False}),
}


@pytest.mark.parametrize(
    "name", tiered(list(INNERS), keep=["adam", "multisteps", "masked", "contrib.schedule_free"])
)
def test_matches_inner_on_finite_steps_and_skips_overflow(name):
    st, ref_st = run(INNERS[name]())
    # the inner state advanced exactly as often as the reference (finite steps)
    for a, b in zip(
        jax.tree_util.tree_leaves(st.inner_state), jax.tree_util.tree_leaves(ref_st), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=2e-6, atol=1e-7
        )


def test_scale_follows_core_rule():
    kind = jas.dynamic_scaler(2.0**8, 2.0, 0.5, 2)
    st, _ = run(optax.adam(1e-2), scale=kind)
    assert isinstance(st, LossScaledState)
    core = (np.float32(2.0**8), 0)  # replayed by tests/_rule.py, not the library
    for t in range(STEPS):
        core = rule(*core, t in OVERFLOW, 2.0, 0.5, 2)
    assert float(st.scale) == float(core[0])
    assert int(st.scale_state.growth_tracker) == core[1]


@pytest.mark.parametrize(
    "scale", [jas.static_scaler(64.0), jas.no_op_scaler(), jas.init_scale_state(512.0)]
)
def test_other_kinds(scale):
    st, _ = run(optax.adam(1e-2), scale=scale)
    assert type(st.scaler) is type(as_scaler(scale))


def test_state_holds_exactly_one_scale_state():
    tx = optax.chain(optax.clip(1.0), loss_scaled(optax.adam(1e-3)))
    state = tx.init(params0())
    leaves = jax.tree_util.tree_leaves(state, is_leaf=lambda x: isinstance(x, jas.ScaleState))
    assert sum(isinstance(x, jas.ScaleState) for x in leaves) == 1
    ls = get_loss_scaled_state(state)
    assert isinstance(ls, LossScaledState)
    assert jas.find_scale_state(state) is ls.scale_state
    assert float(jas.scale_loss(jnp.float32(1.0), state)) == 2.0**16
    assert float(jas.scale_loss(jnp.float32(1.0), ls)) == 2.0**16
    assert ls.found_inf.dtype == jnp.bool_
    assert ls.skipped_steps.dtype == jnp.int32 and ls.total_steps.dtype == jnp.int32
    with pytest.raises(ValueError, match="exactly one"):
        get_loss_scaled_state((ls, ls))


def test_drop_overflow_update_false_applies_update():
    tx = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(drop_overflow_update=False))
    p = {"w": jnp.ones(2)}
    st = tx.init(p)
    u, st2 = tx.update({"w": jnp.array([jnp.inf, 65536.0])}, st, p)
    assert bool(jnp.isinf(u["w"][0])) and float(u["w"][1]) == -1.0
    assert bool(st2.found_inf) and int(st2.skipped_steps) == 0 and int(st2.total_steps) == 1
    assert float(st2.scale) == 2.0**15  # the scale still backs off


def test_the_scaler_says_whether_to_drop():
    p = {"w": jnp.ones(1)}
    for scaler, dropped in (
        (jas.static_scaler(4.0, drop_overflow_update=False), False),
        (jas.static_scaler(4.0), True),
        (jas.no_op_scaler(drop_overflow_update=False), False),
    ):
        tx = loss_scaled(optax.sgd(1.0), scaler)
        u, st = tx.update({"w": jnp.array([jnp.nan])}, tx.init(p), p)
        assert (float(u["w"][0]) == 0.0) == dropped and int(st.skipped_steps) == int(dropped)
        assert bool(st.found_inf)


def test_extra_args_forwarded():
    inner = optax.chain(optax.sgd(1.0), optax.contrib.reduce_on_plateau(patience=0, factor=0.5))
    tx = loss_scaled(inner, jas.static_scaler(2.0))
    p = {"w": jnp.ones(1)}
    st, inner_st = tx.init(p), inner.init(p)
    for _ in range(3):
        u, st = tx.update({"w": jnp.array([2.0])}, st, p, value=jnp.float32(1.0))
        # The oracle: optax itself on the unscaled gradient, same extra args.
        want, inner_st = inner.update({"w": jnp.array([1.0])}, inner_st, p, value=jnp.float32(1.0))
        np.testing.assert_array_equal(np.asarray(u["w"]), np.asarray(want["w"]))
    # the plateau transform saw the value: with patience 0 it has cut the lr
    assert -1.0 < float(u["w"][0]) < 0.0


def test_axis_name_replicas_agree():
    tx = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(8.0), axis_name="r")
    p = {"w": jnp.ones(1)}
    st = tx.init(p)
    g = {"w": jnp.array([[8.0], [jnp.inf], [16.0]])}
    u, st2 = jax.vmap(lambda g: tx.update(g, st, p), axis_name="r")(g)
    np.testing.assert_array_equal(st2.found_inf, [True, True, True])
    np.testing.assert_array_equal(st2.scale, [4.0, 4.0, 4.0])
    np.testing.assert_array_equal(u["w"], np.zeros((3, 1)))


def test_backends_agree():
    outs = []
    for backend in ("reference", "ffi"):
        tx = loss_scaled(
            optax.sgd(1.0), jas.dynamic_scaler(8.0, growth_interval=1), backend=backend
        )
        p = {"w": jnp.ones(1)}
        st = tx.init(p)
        for g in (1.0, jnp.inf, 2.0):
            _, st = jax.jit(tx.update)({"w": jnp.array([g])}, st, p)
        outs.append(float(st.scale))
    assert outs[0] == outs[1] == 16.0


def test_bad_input():
    with pytest.raises(TypeError, match="inner"):
        loss_scaled(lambda g: g)
    with pytest.raises(TypeError, match="scaler must be"):
        loss_scaled(optax.sgd(1.0), 1024.0)
    with pytest.raises(TypeError, match="positional"):
        loss_scaled(optax.sgd(1.0), None, True)
    with pytest.raises(ValueError, match="backend"):
        loss_scaled(optax.sgd(1.0), backend="cuda")
    tx = loss_scaled(optax.sgd(1.0))
    with pytest.raises(TypeError, match="LossScaledState"):
        tx.update({"w": jnp.ones(1)}, optax.EmptyState())


@pytest.mark.parametrize("found", [False, True])
def test_skip_zeros_every_leaf_in_its_own_type(found):
    """Leaves of one shape in several dtypes, and of several shapes in one
    dtype (the skip shares one zeros array per type): a skipped step's
    updates are zeros of each leaf's own shape and dtype and the inner state
    is the old one bit for bit; an applied step is the inner update, bit for bit."""
    params = {
        "a": jnp.full((3,), 0.5, jnp.float32),
        "b": jnp.full((3,), -0.25, jnp.float32),
        "c": jnp.full((3,), 0.75, jnp.bfloat16),
        "d": jnp.full((2, 3), 1.5, jnp.float32),
        "e": jnp.float32(2.0),
    }
    grads = jax.tree.map(lambda p: (p * 3 + 1).astype(p.dtype), params)
    inner = optax.chain(optax.clip(1.0), optax.sgd(0.1, momentum=0.9))
    tx = loss_scaled(inner, jas.no_op_scaler(), skip_nonfinite_updates=False)
    st = tx.update(grads, tx.init(params), params)[1]  # nonzero momentum
    want_u, want_s = jax.jit(inner.update)(grads, st.inner_state, params)
    g = jax.tree.map(lambda x: x.at[0].set(jnp.nan) if x.ndim else x, grads) if found else grads
    u, st2 = jax.jit(tx.update)(g, st, params)
    for k in params:
        assert u[k].shape == params[k].shape and u[k].dtype == want_u[k].dtype
    if found:
        tree_equal(u, jax.tree.map(jnp.zeros_like, want_u))
        tree_equal(st2.inner_state, st.inner_state)
    else:
        tree_equal(u, want_u)
        tree_equal(st2.inner_state, want_s)


def test_skip_reads_one_flag_whatever_the_tree_size():
    """No kernel of the step grows with the tree: the skip's flag is one
    value in memory (the scalar cond's result) that every leaf's select
    reads; 320 leaves make several native calls whose flags are OR-ed, and
    if XLA copied that OR into each leaf's kernel, each would take all of them."""
    import re

    n = 320
    params = [jnp.ones((8,), jnp.float32) * i for i in range(n)]
    tx = loss_scaled(optax.sgd(1e-3, momentum=0.9), jas.init_scale_state(4.0))
    state = tx.init(params)
    text = jax.jit(tx.update).lower(params, state, params).compile().as_text()
    heads = re.findall(r"^%fused\S* \((.*)\) -> ", text, flags=re.M)
    assert heads, "no fusions: the test no longer looks at the step"
    wide = [h for h in heads if h.count("pred[]") >= 2]
    assert len(wide) <= 1, f"{len(wide)} kernels read several flags (only the OR's may)"


def test_state_has_five_fields_whatever_the_options():
    p = params0()
    structures = {
        jax.tree_util.tree_structure(
            loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(), **kw).init(p)
        )
        for kw in (
            {},
            {"skip_nonfinite_updates": True},
            {"max_consecutive_overflows": 3},
            {"host_reports": False},
            {"axis_name": "i"},
            {"backend": "reference"},
        )
    }
    assert len(structures) == 1
    assert LossScaledState._fields == (
        "scaler",
        "inner_state",
        "consecutive_overflows",
        "skipped_steps",
        "total_steps",
    )


def test_an_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="accumulate"):
        loss_scaled(optax.sgd(1.0), accumulate=2)  # type: ignore[call-arg]


def test_float16_gradients_unscale_in_their_own_dtype():
    """docs/loss-scaling.md (O3): a float16 gradient is unscaled in float16, as
    torch's _amp_foreach_non_finite_check_and_unscale_ does, so an unscaled
    value under float16's smallest subnormal (2**-24) becomes 0; cast to
    float32 before `update` and it survives exactly."""
    params = {"w": jnp.zeros((2,), jnp.float16)}
    tx = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(2.0**16))
    st = tx.init(params)
    scaled = {"w": jnp.array([2.0**-10, 2.0**-4], jnp.float16)}  # unscaled: 2**-26, 2**-20
    u16, _ = jax.jit(tx.update)(scaled, st, params)
    assert u16["w"].dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(u16["w"], np.float32), [0.0, -(2.0**-20)])
    as32 = jax.tree.map(lambda g: g.astype(jnp.float32), scaled)
    u32, _ = jax.jit(tx.update)(as32, st, params)
    np.testing.assert_array_equal(np.asarray(u32["w"]), [-(2.0**-26), -(2.0**-20)])
    torch = pytest.importorskip("torch")
    t = torch.tensor([2.0**-10, 2.0**-4], dtype=torch.float16)
    torch._amp_foreach_non_finite_check_and_unscale_([t], torch.zeros(1), torch.tensor([2.0**-16]))
    np.testing.assert_array_equal(-t.float().numpy(), np.asarray(u16["w"], np.float32))
