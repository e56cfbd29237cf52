"""First contact: how users hold what `loss_scaled` returns (issue 30's five).

Each test here failed on 76111f9: a donated ``init`` state, a state whose
scaler disagrees with its transformation, ``optax.MultiSteps`` around the
wrapper (the runaway warning), and the exception types the docs promise.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale.optax import accumulate_gradients, loss_scaled
from tests._budget import tiered

SCALERS = {
    "dynamic": lambda: jas.dynamic_scaler(8.0, growth_interval=2),
    "static": lambda: jas.static_scaler(8.0),
    "no_op": lambda: jas.no_op_scaler(),
    "scale_state": lambda: jas.init_scale_state(8.0, growth_interval=2),
}
# An overflow at step 2; the other gradients are finite.
GRADS = [1.0, 2.0, float("inf"), -1.0, 0.5]


def _run(tx, donate: bool):
    params = {"w": jnp.ones(3), "b": jnp.zeros(())}

    def step(p, s, g):
        scale = jas.find_scale_state(s).scale
        grads = jax.tree.map(lambda x: jnp.full_like(x, g) * scale.astype(x.dtype), p)
        u, s = tx.update(grads, s, p)
        return optax.apply_updates(p, u), s

    step = jax.jit(step, donate_argnums=(0, 1) if donate else ())
    state = tx.init(params)
    p = jax.tree.map(jnp.copy, params)
    for g in GRADS:
        p, state = step(p, state, g)
    return p, state


@pytest.mark.parametrize("kind", sorted(SCALERS))
@pytest.mark.parametrize(
    "wrap", tiered(["loss_scaled", "accumulate", "clipped"], keep=["accumulate"])
)
def test_the_whole_state_donates_from_init_on(kind, wrap):
    def make():
        inner = optax.adam(0.1)
        if wrap == "clipped":
            inner = optax.chain(optax.clip_by_global_norm(1.0), inner)
        tx = loss_scaled(inner, SCALERS[kind]())
        return accumulate_gradients(tx, 1) if wrap == "accumulate" else tx

    tx = make()
    donated = _run(tx, donate=True)
    kept = _run(make(), donate=False)  # the oracle: the same run, nothing donated
    for a, b in zip(jax.tree.leaves(donated), jax.tree.leaves(kept), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # init again after a donation: the transformation handed out no array it keeps.
    again = _run(tx, donate=True)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(kept), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    skipped = jas.optax.get_loss_scaled_state(kept[1]).skipped_steps
    assert int(skipped) == 1  # the overflow at step 2


def test_init_returns_no_array_twice_nor_one_of_the_params():
    p = {"w": jnp.ones(3)}
    # optax.lookahead keeps the slow parameters: its init may hand them back.
    for inner in (optax.sgd(0.1), optax.adam(0.1), optax.lookahead(optax.sgd(0.1), 2, 0.5)):
        tx = loss_scaled(inner)
        first, second = tx.init(p), tx.init(p)  # both alive: ids stay unique
        ids = [id(x) for x in jax.tree.leaves(first)]
        assert len(ids) == len(set(ids))
        assert not set(ids) & {id(x) for x in jax.tree.leaves(p)}
        assert not set(ids) & {id(x) for x in jax.tree.leaves(second)}


def test_a_state_that_disagrees_with_its_transformation_is_refused():
    p = jnp.zeros(3)
    keep = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(drop_overflow_update=False))
    tx = loss_scaled(optax.sgd(1.0))  # drops overflow steps
    with pytest.raises(
        ValueError,
        match=r"(?s)state DynamicScaler\(.*drop_overflow_update=False.*transformation "
        r"DynamicScaler\(.*drop_overflow_update=True",
    ):
        jax.jit(tx.update)(jnp.full(3, jnp.inf), keep.init(p), p)
    # Other kinds and other factors disagree too.
    for other in (jas.static_scaler(4.0), jas.dynamic_scaler(growth_factor=4.0)):
        with pytest.raises(ValueError, match="configured differently"):
            tx.update(jnp.ones(3), loss_scaled(optax.sgd(1.0), other).init(p), p)
    # The state of an equal configuration (a fresh template, a restored state) is taken.
    _, st = tx.update(jnp.full(3, jnp.inf), loss_scaled(optax.sgd(1.0)).init(p), p)
    assert int(st.skipped_steps) == 1


def test_a_run_of_overflows_warns_once_naming_the_likely_causes():
    """Not optax.MultiSteps around loss_scaled: that setup raises TypeError
    at init, so it cannot be why a run overflows (issue 44)."""
    from jax_amp_scale.training.reports import RUNAWAY_WARNING

    for scaler in (jas.dynamic_scaler(), jas.static_scaler(8.0)):
        tx = loss_scaled(optax.sgd(1.0), scaler)
        step = jax.jit(tx.update)
        st = tx.init(jnp.zeros(2))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(RUNAWAY_WARNING + 5):
                _, st = step(jnp.full(2, jnp.nan), st, jnp.zeros(2))
            jax.block_until_ready(st)
        runaway = [w for w in seen if "overflowing steps in a row" in str(w.message)]
        assert len(runaway) == 1, [str(w.message) for w in seen]
        message = str(runaway[0].message)
        assert "nonfinite_paths" in message and "scale_loss" in message, message
        assert "MultiSteps" not in message, message
        assert int(st.consecutive_overflows) == RUNAWAY_WARNING + 5


@pytest.mark.parametrize("backend", ["auto", "reference", "ffi"])
def test_the_runaway_error_is_one_type_on_every_dispatch_path(backend):
    """The first call (JAX's Python path) and a cached call (its C++ path)
    raise the same documented type: jax.errors.JaxRuntimeError."""
    if backend == "ffi" and "ffi" not in jas.available_backends("cpu"):
        pytest.skip("no native module")
    tx = loss_scaled(optax.sgd(1.0), max_consecutive_overflows=2, backend=backend)
    step = jax.jit(tx.update)
    st = tx.init(jnp.zeros(2))
    bad = jnp.full(2, jnp.inf)
    _, st = step(bad, st, jnp.zeros(2))  # compiles; one overflow: no error
    for _ in range(3):  # cached calls
        with pytest.raises(jax.errors.JaxRuntimeError, match="FloatingPointError: loss_scaled"):
            jax.block_until_ready(step(bad, st, jnp.zeros(2)))
    fresh = jax.jit(tx.update)  # the error on a first call too
    with pytest.raises(jax.errors.JaxRuntimeError, match="max_consecutive_overflows=2"):
        jax.block_until_ready(fresh(bad, st, jnp.zeros(2)))
