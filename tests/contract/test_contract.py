"""The contract: every row of tests/contract/cells.py, held every way a user
holds it in one process and on one device, checked against the oracle.

Each test is one cell of docs/contract.md (tools/contract_matrix.py).  A
cell that works compares parameters, scale and skipped steps with the
independent oracle (cells.oracle); a cell whose behaviour is a documented
error asserts the type and a fragment of the message.  One representative
cell per holding runs by default, the full cross product is ``slow``.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from tests.contract import cells as C

HERE = [(c, r) for c, r in C.cells() if C.COLUMN[c].where == "here"]


def _param(col: str, row: str):
    marks = () if (col, row) in C.DEFAULT_TIER else (pytest.mark.slow,)
    return pytest.param(col, row, marks=marks, id=f"{col}|{row}")


# --------------------------------------------------------------- holdings


def jit_donated(row):
    d = row.make()
    step = jax.jit(d.step, donate_argnums=(0, 1))
    params = C.params0()
    state = d.init(params)
    params, state, scales = C.run_loop(row, step, params, state, C.batches())
    C.check(row, params, state, C.oracle(row, C.batches()), scales)


def init_twice(row):
    d = row.make()
    step = jax.jit(d.step, donate_argnums=(0, 1))
    bs, want = C.batches(), C.oracle(row, C.batches())
    first, second = d.init(C.params0()), d.init(C.params0())
    p1, s1, sc1 = C.run_loop(row, step, C.params0(), first, bs)
    C.check(row, p1, s1, want, sc1)
    third = d.init(C.params0())  # after `first` was donated: the template pattern
    for state in (second, third):
        p, s, sc = C.run_loop(row, step, C.params0(), state, bs)
        C.check(row, p, s, want, sc)


def _resumed(row, hold):
    """Half the steps, `hold(state)`, the other half: the oracle's result."""
    d = row.make()
    step = jax.jit(d.step)
    bs = C.batches()
    half = len(bs) // 2
    params, state, sc1 = C.run_loop(row, step, C.params0(), d.init(C.params0()), bs[:half])
    held = hold(state)
    params, state, sc2 = C.run_loop(row, step, params, held, bs[half:])
    C.check(row, params, state, C.oracle(row, bs), sc1 + sc2)


def tree_copy(row):
    _resumed(row, lambda s: jax.tree.map(jnp.copy, s))


def deep_copy(row):
    _resumed(row, copy.deepcopy)


def pickled(row):
    _resumed(row, lambda s: pickle.loads(pickle.dumps(s)))


SCAN_STEPS = 1000
SCAN_OVERFLOWS = (3, 4, 100, 401, 402, 403, 777, 999)


def scanned(row):
    # float16: the scale also overflows on its own (scale * x past 65504),
    # as in training, besides the injected steps.
    dtype = jnp.float16
    d = row.make()
    bs = C.batches(SCAN_STEPS, SCAN_OVERFLOWS, dtype=dtype, seed=1)
    xs = C.stack(bs)

    def body(carry, x):
        params, state = d.step(*carry, x)
        return (params, state), C.scale_of(state)

    run = jax.jit(lambda p, s, xs: jax.lax.scan(body, (p, s), xs))
    (params, state), scales = run(C.params0(dtype), d.init(C.params0(dtype)), xs)
    want = C.oracle(row, bs, dtype)
    per_step = np.asarray(scales).reshape(SCAN_STEPS, -1)[row.k - 1 :: row.k, 0]
    assert per_step.tolist() == want.scales
    # The run exercised the rule: the scale moved, and overflowed on its own.
    assert want.skipped > len(SCAN_OVERFLOWS) // row.k or row.rule != "dynamic"
    assert len(set(want.scales)) > 3 or row.rule != "dynamic"
    C.check(row, params, state, want)


POPULATION = 3


def population(row):
    d = row.make()
    members = [C.batches(overflow_at=(i, 4 + i), seed=10 + i) for i in range(POPULATION)]
    xs = [C.stack([m[t] for m in members]) for t in range(C.STEPS)]
    params = jax.tree.map(lambda x: jnp.stack([x] * POPULATION), C.params0())
    state = jax.vmap(d.init)(params)
    step = jax.jit(jax.vmap(d.step))
    for x in xs:
        params, state = step(params, state, x)
    for i, bs in enumerate(members):
        one = jax.tree.map(lambda a, i=i: a[i], (params, state))
        C.check(row, one[0], one[1], C.oracle(row, bs))


def chain_positions(row):
    bs = C.batches()
    want = C.oracle(row, bs)
    other = optax.scale(1.0)  # stateless and exact: the oracle does not change
    for where in range(3):
        parts = [other, other]
        parts.insert(where, row.tx())
        tx = optax.chain(*parts)
        state = tx.init(C.params0())
        params, state, scales = C.run_loop(row, jax.jit(C.optax_step(tx)), C.params0(), state, bs)
        C.check(row, params, state, want, scales)


def inject_hyperparams(row):
    make = optax.inject_hyperparams(
        lambda learning_rate: row.tx(optax.sgd(learning_rate, momentum=C.MOMENTUM))
    )
    tx = make(learning_rate=C.LR)
    bs = C.batches()
    params, state, scales = C.run_loop(
        row, jax.jit(C.optax_step(tx)), C.params0(), tx.init(C.params0()), bs
    )
    C.check(row, params, state, C.oracle(row, bs), scales)
    assert float(state.hyperparams["learning_rate"]) == C.LR


def multisteps_inside(row):
    inner = optax.MultiSteps(C.plain_inner(), every_k_schedule=2)
    if row.kind == "trainer":
        d = C.trainer_driver(jas.Trainer(inner, row.scaler()))
    else:
        d = C.optax_driver(row.tx(inner))
    bs = C.batches()
    params, state, scales = C.run_loop(row, jax.jit(d.step), C.params0(), d.init(C.params0()), bs)
    want = C.oracle(row, bs, inner=optax.MultiSteps(C.plain_inner(), every_k_schedule=2))
    C.check(row, params, state, want, scales)


def multisteps_around(row):
    tx = optax.MultiSteps(row.tx(), every_k_schedule=2)
    error, fragment = C.EXPECTED_ERRORS["optax.MultiSteps around", row.name]
    with pytest.raises(error, match=fragment):
        tx.init(C.params0())


def apply_if_finite(row):
    """Around loss_scaled it would hide overflows from the scale: refused."""
    tx = optax.apply_if_finite(row.tx(), max_consecutive_errors=3)
    error, fragment = C.EXPECTED_ERRORS["optax.apply_if_finite", row.name]
    with pytest.raises(error, match=fragment):
        tx.init(C.params0())


def flax_train_state(row):
    pytest.importorskip("flax", reason="the test-frameworks extra")
    from flax.training import train_state

    def step(ts, batch):
        loss = lambda p: jas.scale_loss(C.loss_fn(p, batch), ts.opt_state)  # noqa: E731
        return ts.apply_gradients(grads=jax.grad(loss)(ts.params))

    ts = train_state.TrainState.create(apply_fn=None, params=C.params0(), tx=row.tx())
    step = jax.jit(step, donate_argnums=0)
    bs = C.batches()
    scales = []
    for t, b in enumerate(bs):
        ts = step(ts, b)
        if (t + 1) % row.k == 0:
            scales.append(float(C.scale_of(ts.opt_state)))
    C.check(row, ts.params, ts.opt_state, C.oracle(row, bs), scales)
    assert int(ts.step) == len(bs)


def nnx_optimizer(row):
    pytest.importorskip("flax", reason="the test-frameworks extra")
    from flax import nnx

    class Linear(nnx.Module):
        def __init__(self, p):
            self.w, self.b = nnx.Param(p["w"]), nnx.Param(p["b"])

    model = Linear(C.params0())
    opt = nnx.Optimizer(model, row.tx(), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, batch):
        def loss(m):
            return jas.scale_loss(C.loss_fn({"w": m.w[...], "b": m.b[...]}, batch), opt.opt_state)

        opt.update(model, nnx.grad(loss)(model))

    def opt_state():  # nnx holds the leaves in Variables; the structure stays
        return jax.tree.map(
            lambda v: v[...], opt.opt_state, is_leaf=lambda x: isinstance(x, nnx.Variable)
        )

    bs = C.batches()
    scales = []
    for t, b in enumerate(bs):
        step(model, opt, b)
        if (t + 1) % row.k == 0:
            scales.append(float(C.scale_of(opt_state())))
    params = {"w": model.w[...], "b": model.b[...]}
    C.check(row, params, opt_state(), C.oracle(row, bs), scales)


def equinox_filter_jit(row):
    pytest.importorskip("equinox", reason="the test-frameworks extra")
    import equinox as eqx

    class Linear(eqx.Module):
        w: jax.Array
        b: jax.Array

        def __getitem__(self, key):  # the loss reads p["w"], p["b"]
            return getattr(self, key)

    d = row.make()
    model = Linear(**C.params0())
    bs = C.batches()
    model, state, scales = C.run_loop(row, eqx.filter_jit(d.step), model, d.init(model), bs)
    assert isinstance(model, Linear)
    C.check(row, {"w": model.w, "b": model.b}, state, C.oracle(row, bs), scales)


def params_in(dtype):
    def holding(row):
        d = row.make()
        bs = C.batches(dtype=dtype)
        params, state, scales = C.run_loop(
            row, jax.jit(d.step), C.params0(dtype), d.init(C.params0(dtype)), bs
        )
        C.check(row, params, state, C.oracle(row, bs, dtype), scales)

    return holding


def foreign_state(row):
    """A state built by the same row with drop_overflow_update=False."""
    other = C.Row(row.name, row.kind, row.rule, row.k, row.clip, row.momentum)
    scaler = _no_drop(row.scaler())
    if row.kind == "trainer":
        mine, theirs = row.make(), C.trainer_driver(jas.Trainer(row.inner(), scaler))
    else:
        mine = row.make()
        tx = jas.optax.loss_scaled(other.inner(), scaler)
        if row.k > 1:
            tx = jas.optax.accumulate_gradients(tx, row.k)
        theirs = C.optax_driver(tx)
    state = theirs.init(C.params0())
    error, fragment = C.EXPECTED_ERRORS["state of another configuration", row.name]
    with pytest.raises(error, match=fragment):
        jax.jit(mine.step)(C.params0(), state, C.batches()[0])


def _no_drop(scaler):
    if isinstance(scaler, jas.ScaleState):
        return jas.DynamicScaler(
            state=scaler, hysteresis_left=jnp.ones((), jnp.int32), drop_overflow_update=False
        )
    import dataclasses

    return dataclasses.replace(scaler, drop_overflow_update=False)


HOLDINGS = {
    "jit, state donated": jit_donated,
    "init twice, and after a donation": init_twice,
    "jax.tree.map(jnp.copy)": tree_copy,
    "copy.deepcopy": deep_copy,
    "pickle": pickled,
    "lax.scan, 1,000 steps": scanned,
    "vmap population": population,
    "optax.chain, each position": chain_positions,
    "optax.inject_hyperparams": inject_hyperparams,
    "optax.MultiSteps inside": multisteps_inside,
    "optax.MultiSteps around": multisteps_around,
    "optax.apply_if_finite": apply_if_finite,
    "flax TrainState": flax_train_state,
    "flax nnx.Optimizer": nnx_optimizer,
    "equinox filter_jit": equinox_filter_jit,
    "float16 params": params_in(jnp.float16),
    "bfloat16 params": params_in(jnp.bfloat16),
    "float32 params": params_in(jnp.float32),
    "state of another configuration": foreign_state,
}


@pytest.mark.parametrize(("column", "row"), [_param(c, r) for c, r in HERE])
def test_cell(column, row):
    C.CLIPPED.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the current names only
        HOLDINGS[column](C.ROW[row])
    if C.ROW[row].clip and (column, row) not in C.EXPECTED_ERRORS:
        assert any(C.CLIPPED), "the oracle never clipped: the cell would not test clipping"


def test_every_in_process_column_has_a_holding():
    assert set(HOLDINGS) == {c.name for c in C.COLUMNS if c.where == "here"}


def test_the_oracle_can_tell_a_step_that_was_not_skipped():
    # Guards every cell: an overflowing step that is applied gives other
    # parameters (NaN here) and another skipped count than the oracle's.
    row = C.ROW[C.REPRESENTATIVE]
    tx = jas.optax.loss_scaled(
        C.plain_inner(),
        jas.dynamic_scaler(C.INIT_SCALE, growth_interval=2, drop_overflow_update=False),
    )
    bs = C.batches()
    params, state, _ = C.run_loop(
        row, jax.jit(C.optax_step(tx)), C.params0(), tx.init(C.params0()), bs
    )
    with pytest.raises(AssertionError):
        C.check(row, params, state, C.oracle(row, bs))
