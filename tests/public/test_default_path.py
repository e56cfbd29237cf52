"""The path users get: one CPU device, ``backend="auto"``, real defaults, end to end.

`loss_scaled` and `Trainer` are run for a sequence of steps with overflows
and growths, and every value is compared bit for bit with a plain-NumPy
replay: the scale by tests/_rule.py, the optimizer by optax's published
update (SGD with momentum: ``trace = g + m * trace``, ``update = -lr *
trace``).  Every number is a small dyadic rational, so each product and sum
is exact and the replay needs no tolerance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale.optax import loss_scaled
from tests._rule import rule

LR, MOMENTUM = 0.5, 0.5
INIT, INTERVAL = 2.0**4, 2
# Unscaled gradients per step; None is an overflow (inf in one leaf).
GRADS = [0.25, 0.5, None, 0.125, 0.25, 0.5, 0.25, None, None, 0.5]


def _replay():
    """(scale, tracker, params, trace, skipped) after each step, in NumPy."""
    scale, tracker = np.float32(INIT), 0
    w, trace, skipped = np.float32(1.0), np.float32(0.0), 0
    out = []
    for g in GRADS:
        found = g is None
        if not found:
            trace = np.float32(g) + np.float32(MOMENTUM) * trace
            w = w - np.float32(LR) * trace
        skipped += found
        scale, tracker = rule(scale, tracker, found, 2.0, 0.5, INTERVAL)
        out.append((scale, tracker, w, trace, skipped))
    return out


def _scaled_grads(g, scale):
    if g is None:
        return {"w": jnp.array([jnp.inf, 1.0], jnp.float32)}
    return {"w": jnp.full((2,), g * float(scale), jnp.float32)}


def test_default_backend_is_native_here():
    assert jax.device_count() == 1 and jas.auto_backend() == "ffi"


def test_loss_scaled_with_defaults_is_the_rule_and_optax():
    tx = loss_scaled(
        optax.sgd(LR, momentum=MOMENTUM), jas.dynamic_scaler(INIT, growth_interval=INTERVAL)
    )
    params = {"w": jnp.ones((2,), jnp.float32)}
    state = tx.init(params)
    update = jax.jit(tx.update)
    for t, (g, want) in enumerate(zip(GRADS, _replay(), strict=True)):
        updates, state = update(_scaled_grads(g, state.scale), state, params)
        params = optax.apply_updates(params, updates)
        scale, tracker, w, trace, skipped = want
        assert np.asarray(state.scale).tobytes() == np.float32(scale).tobytes(), t
        assert int(state.scale_state.growth_tracker) == tracker, t
        np.testing.assert_array_equal(np.asarray(params["w"]), [w, w], err_msg=str(t))
        # The inner state (the momentum trace) is untouched on an overflow.
        (trace_state, *_) = jax.tree_util.tree_leaves(state.inner_state)
        np.testing.assert_array_equal(np.asarray(trace_state), [trace, trace], err_msg=str(t))
        assert bool(state.found_inf) == (g is None), t
        assert int(state.skipped_steps) == skipped and int(state.total_steps) == t + 1


def test_trainer_with_defaults_is_the_rule_and_optax():
    trainer = jas.Trainer(
        optax.sgd(LR, momentum=MOMENTUM), jas.dynamic_scaler(INIT, growth_interval=INTERVAL)
    )
    params = {"w": jnp.ones((2,), jnp.float32)}
    state = trainer.init(params)
    step = jax.jit(trainer.step, static_argnums=3)

    def loss_fn(p, batch):  # d/dw = batch: the gradient is the batch itself
        return jnp.sum(p["w"] * batch)

    for t, (g, want) in enumerate(zip(GRADS, _replay(), strict=True)):
        batch = jnp.array([jnp.inf, 1.0]) if g is None else jnp.full((2,), g, jnp.float32)
        before = float(state.scale)
        params, state, metrics = step(params, state, batch, loss_fn)
        scale, tracker, w, _, skipped = want
        assert float(metrics["scale"]) == before and bool(metrics["skipped"]) == (g is None)
        assert float(state.scale) == scale and int(state.scale_state.growth_tracker) == tracker
        np.testing.assert_array_equal(np.asarray(params["w"]), [w, w], err_msg=str(t))
        assert int(state.skipped_steps) == skipped


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_unscale_and_check_default_matches_the_reference_bits(dtype):
    rng = np.random.default_rng(0)
    grads = {
        "a": jnp.asarray(rng.standard_normal((33, 7)) * 1e3, dtype),
        "b": jnp.asarray(rng.standard_normal(5), dtype),
    }
    default = jax.jit(jas.unscale_and_check)(grads, jnp.float32(3.0))
    reference = jax.jit(lambda g, s: jas.unscale_and_check(g, s, backend="reference"))(
        grads, jnp.float32(3.0)
    )
    for x, y in zip(jax.tree.leaves(default), jax.tree.leaves(reference), strict=True):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
