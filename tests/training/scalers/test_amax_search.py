"""amax_scaler never skips more steps than dynamic_scaler (torch's rule) on the
same model and data: issue 51's reproductions, and slices of the search of
tests/_amax_search.py (the whole search: ``python -m tests._amax_search``,
recorded in results/amax_search.json)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale.optax import loss_scaled
from tests import _amax_search as search

ROOT = Path(__file__).resolve().parents[3]


def _skips(scaler, loss, params, steps, lr=0.0, batches=None):
    """Skipped steps of loss_scaled(adam or sgd(lr), scaler) over `steps` steps."""
    tx = loss_scaled(optax.sgd(lr), scaler)
    state = tx.init(params)

    @jax.jit
    def step(p, st, i):
        g = jax.grad(lambda q: jas.scale_loss(loss(q, i), st))(p)
        u, st = tx.update(g, st, p)
        return optax.apply_updates(p, u), st

    for i in range(steps):
        params, state = step(params, state, i)
    return int(state.skipped_steps)


def test_issue_51_reproduction_skips_none():
    # The activation cotangent (the output cast's) overflows; the parameter
    # gradients stay far below the line.  Before: amax 10 of 20, dynamic 0.
    p = {"w": jnp.full((4, 1), 0.5)}
    x, y = jnp.full((16, 4), 1e-3), jnp.full((16, 1), 1.5)

    def f(q, i):
        out = x.astype(jnp.float16) @ q["w"].astype(jnp.float16)
        return jnp.mean((out.astype(jnp.float32) - y) ** 2)

    assert _skips(jas.amax_scaler(), f, p, 20) == 0 == _skips(jas.dynamic_scaler(), f, p, 20)


def test_small_feature_mlp_skips_no_more_than_dynamic():
    # Issue 51's second case: a float16 MLP whose input features are small,
    # so the output cotangent, not a parameter gradient, meets 65504 first.
    # Before: about every other step skipped (150 of 300 against 4).
    kx, kw, kv = jax.random.split(jax.random.key(3), 3)
    xs = jax.random.normal(kx, (300, 32, 8)) * 2e-3
    ys = jnp.sin(xs.sum(-1, keepdims=True) * 300.0) * 4.0
    params = {"w": jax.random.normal(kw, (8, 16)) * 0.5, "v": jax.random.normal(kv, (16, 1))}

    def loss(p, i):
        x16, p16 = xs[i].astype(jnp.float16), jax.tree.map(lambda a: a.astype(jnp.float16), p)
        out = jnp.tanh(x16 @ p16["w"]) @ p16["v"]
        return jnp.sum((out - ys[i].astype(jnp.float16)) ** 2).astype(jnp.float32)

    amax = _skips(jas.amax_scaler(growth_interval=20), loss, params, 300, lr=1e-3)
    dyn = _skips(jas.dynamic_scaler(growth_interval=20), loss, params, 300, lr=1e-3)
    assert amax <= dyn and amax < 30, (amax, dyn)


QUICK = [
    search.Structure(1, False, True, True, 1, 8),  # float16 mean loss, no biases: the worst seen
    search.Structure(2, True, False, False, 4, 2000),  # float32 sum loss, accumulation
]


@pytest.mark.slow
@pytest.mark.parametrize("structure", QUICK, ids=str)
def test_a_slice_of_the_search(structure):
    rows = search.search([structure], per_structure=8, steps=40)
    worse = [(i, a, d) for _, i, a, d, diverged in rows if a > d and not diverged]
    assert not worse
    assert sum(r[3] for r in rows) > 0  # the slice does meet overflows


@pytest.mark.slow
def test_a_sixteenth_of_the_search():
    # The whole search runs at every change to the package: its result,
    # results/amax_search.json, must be current (tests/docs/test_figures.py),
    # and the next test reads it.  This runs a spread of its structures here.
    structures = search.STRUCTURES[::16]
    rows = [r for r in search.search(structures, per_structure=8) if not r[4]]
    worse = [r for r in rows if r[2] > r[3]]
    assert not worse, worse[:5]
    assert np.sum([r[3] for r in rows]) > np.sum([r[2] for r in rows])


def test_the_recorded_search_finds_no_trained_model_where_amax_skips_more():
    recorded = json.loads((ROOT / "results" / "amax_search.json").read_text())["data"]
    summary, columns = recorded["summary"], recorded["columns"]
    rows = [dict(zip(columns, row, strict=True)) for row in recorded["rows"]]
    assert summary["models"] == len(rows) == 1056
    trained = [r for r in rows if not r["twin_diverged"]]
    assert summary["amax_more"] == sum(r["amax"] > r["dynamic"] for r in trained) == 0
    # Skips counted over the models that train, as the pages give them.
    assert sum(r["amax"] for r in trained) == summary["skips_amax"]
    assert sum(r["dynamic"] for r in trained) == summary["skips_dynamic"] > summary["skips_amax"]


# The models where amax skipped more in the first search (768 models, before
# the float32 twin was run): each is a run whose float32 twin diverges too,
# so both float16 runs end in NaN steps; amax, having skipped fewer steps on
# the way, got there sooner.  (structure index in STRUCTURES, model index)
FOUND = [
    (5, 3),
    (12, 6),
    (13, 7),
    (29, 0),
    (29, 2),
    (36, 1),
    (36, 5),
    (53, 7),
    (60, 5),
    (77, 5),
    (77, 6),
]


@pytest.mark.slow
def test_every_counterexample_found_is_a_diverging_model():
    by_structure: dict[int, list[int]] = {}
    for j, i in FOUND:
        by_structure.setdefault(j, []).append(i)
    for j, models in by_structure.items():
        rows = search.search([search.STRUCTURES[j]], per_structure=8)
        for i in models:
            _, _, amax, dyn, diverged = rows[i]
            assert diverged and amax >= 25 and dyn >= 25, (search.STRUCTURES[j], i, amax, dyn)
