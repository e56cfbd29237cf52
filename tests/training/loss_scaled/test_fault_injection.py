"""Injected NaN/inf gradients: params and inner state untouched, counters exact, scale by the rule."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale import demo
from tests._budget import tiered
from tests._rule import dynamic_kind_rule, rule

INJECT = {2, 5, 6, 11}
STEPS = 14


def bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(tree)]


FOUND = [t in INJECT for t in range(STEPS)]
# The scale each kind must hold after each step, from tests/_rule.py (the
# documented rules in plain Python), never from the library.
KINDS = {
    "dynamic": (
        jas.dynamic_scaler(2.0**12, growth_interval=3),
        [
            s
            for s, _, _ in dynamic_kind_rule(
                FOUND, init=2.0**12, gf=2.0, bf=0.5, gi=3, lo=None, hi=None, hyst=1
            )
        ],
    ),
    "dynamic-hyst-min": (
        jas.dynamic_scaler(2.0**12, growth_interval=2, hysteresis=2, min_scale=2.0**10),
        [
            s
            for s, _, _ in dynamic_kind_rule(
                FOUND, init=2.0**12, gf=2.0, bf=0.5, gi=2, lo=2.0**10, hi=None, hyst=2
            )
        ],
    ),
    "static": (jas.static_scaler(512.0), [512.0] * STEPS),
    "noop": (jas.no_op_scaler(), [1.0] * STEPS),
}


@pytest.mark.parametrize("name", tiered(list(KINDS), keep=["dynamic-hyst-min", "noop"]))
def test_injected_overflows_never_touch_params_or_inner_state(name):
    kind, want_scales = KINDS[name]
    x, y = demo.make_data(0, 512)
    params = demo.init_params(jax.random.PRNGKey(0))
    trainer = jas.Trainer(optax.adam(1e-3), kind, policy=jas.get_policy("O2"))
    state = trainer.init(params)
    step = jax.jit(trainer.step, static_argnums=3)
    used = float(kind.scale)
    rng = np.random.default_rng(0)
    for t in range(STEPS):
        idx = rng.integers(0, len(x), 64)
        batch = {"x": x[idx], "y": y[idx], "poison": np.bool_(t in INJECT)}
        before_p, before_inner = bits(params), bits(state.inner_state)
        params, state, m = step(params, state, batch, demo.loss_fn)
        assert bool(m["skipped"]) == (t in INJECT), t
        if t in INJECT:
            assert bits(params) == before_p
            assert bits(state.inner_state) == before_inner  # moments and count
        else:
            assert bits(params) != before_p
        assert float(m["scale"]) == used  # the scale this step's loss was scaled by
        used = want_scales[t]
        assert float(state.scale) == used
    assert int(state.skipped_steps) == len(INJECT)
    assert int(state.total_steps) == STEPS
    assert int(state.inner_state[0].count) == STEPS - len(INJECT)


def test_scale_trajectory_is_the_core_rule():
    # Without options the dynamic kind is the core rule: replay the rule of
    # tests/_rule.py on the same found_inf sequence.
    kind = jas.dynamic_scaler(2.0**12, growth_interval=3)
    tx = jas.Trainer(optax.sgd(1e-3), kind)
    params = {"w": jnp.ones(4)}
    state = tx.init(params)
    core = (np.float32(2.0**12), 0)
    step = jax.jit(tx.step, static_argnums=3)

    def lf(p, b):
        return jnp.sum(p["w"] * b)

    for t in range(STEPS):
        b = jnp.full(4, jnp.nan if t in INJECT else 1.0)
        params, state, _ = step(params, state, b, lf)
        core = rule(*core, t in INJECT, 2.0, 0.5, 3)
        assert float(state.scale) == float(core[0])
        assert int(state.scale_state.growth_tracker) == core[1]


def test_nonfinite_leaves_names_the_poisoned_leaf():
    grads = {"a": jnp.ones(3), "b": {"c": jnp.array([1.0, jnp.nan], jnp.float16)}}
    assert jas.nonfinite_paths(jax.jit(jas.nonfinite_leaves)(grads)) == ["['b']['c']"]
