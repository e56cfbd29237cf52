"""amax_scaler(measure=...): only the marked leaves' gradients set the amax.

A float32-only leaf (a LayerNorm, an embedding kept in float32) cannot
overflow float16; left in the statistic it holds the scale lower than the
float16-path leaves need.  The expected scales are worked out here from the
rule's target line, 65504 / 2**margin, by trying powers of two.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale.optax import get_loss_scaled_state, loss_scaled


def _largest_power_of_two_under(amax: float, target: float) -> float:
    e = 0
    while amax * 2.0 ** (e + 1) <= target:
        e += 1
    while amax * 2.0**e > target:
        e -= 1
    return 2.0**e


PARAMS = {"ln": jnp.ones(4), "w": jnp.ones((4, 4)), "step": jnp.zeros((), jnp.int32)}
# The LayerNorm's gradient is 2**6 times the matrix's: it alone sets today's amax.
GRADS = {"ln": jnp.full(4, 64.0), "w": jnp.full((4, 4), 1.0), "step": jnp.zeros((), jnp.int32)}
MASK = {"ln": False, "w": True, "step": False}


def _first_scale(scaler):
    tx = loss_scaled(optax.sgd(0.1), scaler)
    state = tx.init(PARAMS)
    _, state = jax.jit(tx.update)(GRADS, state, PARAMS)  # at scale 1: the grads as they are
    return float(get_loss_scaled_state(state).scale)


def test_the_marked_leaves_set_the_scale():
    target = 65504.0 / 2**5
    assert _first_scale(jas.amax_scaler()) == _largest_power_of_two_under(64.0, target) == 2.0**4
    got = _first_scale(jas.amax_scaler(measure=MASK))
    assert got == _largest_power_of_two_under(1.0, target) == 2.0**10


def test_found_inf_still_checks_every_leaf():
    tx = loss_scaled(optax.sgd(0.1), jas.amax_scaler(measure=MASK))
    state = tx.init(PARAMS)
    bad = {**GRADS, "ln": GRADS["ln"].at[0].set(jnp.inf)}
    updates, state = jax.jit(tx.update)(bad, state, PARAMS)
    assert int(state.skipped_steps) == 1
    np.testing.assert_array_equal(updates["w"], 0.0)


def test_the_statistic_equals_the_marked_leaves_amax_under_jit():
    scaler = jas.amax_scaler(measure=MASK)
    g = {"ln": jnp.array([3.0, -900.0, 1, 1]), "w": jnp.arange(16.0).reshape(4, 4) - 20.0,
         "step": jnp.zeros((), jnp.int32)}  # fmt: skip
    _, _, nxt = jax.jit(lambda s, g: s.unscale_and_update(g))(scaler, g)
    assert float(nxt.amax) == 20.0  # |w| at most 20; the LayerNorm's 900 left out


@pytest.mark.parametrize(
    ("measure", "match"),
    [
        ({"ln": 1, "w": True, "step": False}, "pytree of bools"),
        ({"ln": False, "w": False, "step": False}, "at least one leaf"),
    ],
)
def test_bad_measure_names_the_argument(measure, match):
    with pytest.raises(ValueError, match=match):
        jas.amax_scaler(measure=measure)


def test_a_mask_of_another_tree_is_refused_at_trace_time():
    scaler = jas.amax_scaler(measure={"w": True})
    with pytest.raises(ValueError, match=r"measure=\.\.\.\) was built for a tree with leaves at"):
        jax.jit(lambda s, g: s.unscale_and_update(g)).lower(scaler, GRADS)


def test_a_mask_of_another_structure_with_the_same_leaf_count_is_refused():
    # Issue 51: matched by flatten position, this mask measured the LayerNorm.
    grads = {"dense": {"w": jnp.ones((2, 2))}, "ln": {"scale": jnp.full(2, 1000.0)}}
    scaler = jas.amax_scaler(measure=[False, True])
    with pytest.raises(ValueError, match=r"measure=.*not in the gradients: \['\[0\]', '\[1\]'\]"):
        scaler.unscale_and_update(grads)
    per = jas.amax_scaler(per_leaf={"a": jnp.ones(2), "b": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"per_leaf=.*gradients have"):
        per.unscale_and_update(grads)  # leaf_report would name another tree's paths


def test_a_none_leaf_in_the_mask_is_refused_where_it_is_given():
    with pytest.raises(ValueError, match=r"pytree of bools.*NoneType"):
        jas.amax_scaler(measure={"w": True, "b": None})


def test_the_mask_survives_a_round_trip_through_the_pytree():
    scaler = jas.amax_scaler(measure=MASK)
    leaves, tree = jax.tree.flatten(scaler)
    want = (("['ln']", False), ("['step']", False), ("['w']", True))
    assert jax.tree.unflatten(tree, leaves).measured == want


def test_a_mask_marking_no_floating_leaf_is_refused_at_trace_time():
    # Only the int leaf marked: an empty amax would read 0 and grow the scale to its top.
    scaler = jas.amax_scaler(measure={"ln": False, "w": False, "step": True})
    with pytest.raises(ValueError, match="marks no floating leaf"):
        jax.jit(lambda s, g: s.unscale_and_update(g)).lower(scaler, GRADS)
