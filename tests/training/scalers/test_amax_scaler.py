"""amax_scaler: the rule pinned by hand-computed scale sequences, the exact
overflow fallback, NaNs that are not the scale's, and every place a scaler goes.

The oracle is independent of the implementation: the expected scales are
literals worked out by hand from the documented rule (float16, margin 4
(the default is 5): target T = 65504 / 16 = 4094; on a finite step the next
scale is the largest power of two S with g * S <= T, g the unscaled amax, at
most twice the scale, the first finite step unbounded; clip to [2**-24,
2**24]), and every step of `drive` is also checked against the brute force
of tests/_amax_oracle.py.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale import export
from jax_amp_scale.optax import (
    accumulate_gradients,
    get_loss_scaled_state,
    loss_scaled,
    optimizer_step,
)
from tests import _amax_oracle as amax_oracle


def m4(**kwargs):
    """The worked examples use margin 4 (T = 4094), one below the default, and
    a ceiling at max_scale (the default is 2**16) unless told otherwise; every
    scaler's first step runs at the probe scale 1."""
    return jas.amax_scaler(4, **{"init_scale": 2.0**24, **kwargs})


TRACES = Path(__file__).resolve().parents[2] / "fixtures" / "amax_traces.json"


def brute_force(scaler):
    """The brute-force oracle (tests/_amax_oracle.py) where `scaler` stands."""
    config = amax_oracle.Config(
        scaler.margin,
        scaler.micro_batches,
        scaler.min_scale,
        scaler.max_scale,
        scaler.growth_interval,
        scaler.compute_dtype,
        init_scale=float(scaler.ceiling),
    )
    brute = amax_oracle.Oracle(config)
    brute.scale, brute.finite_steps = float(scaler.scale), int(scaler.finite_steps)
    brute.tracker = int(scaler.state.growth_tracker)
    return brute


def drive(scaler, steps):
    """Feeds (found_inf, unscaled amax) per step; returns the scales used and
    the reasons, each step also checked against the brute force."""
    scales, reasons = [float(scaler.scale)], []
    brute = brute_force(scaler)
    for found, g in steps:
        a = np.float32(g * float(scaler.scale))
        scaler = scaler.update(jnp.bool_(found), amax=jnp.float32(a))
        scales.append(float(scaler.scale))
        reasons.append(int(scaler.reason))
        assert (scales[-1], reasons[-1]) == brute.step(found, float(a)), (found, g)
    return scales, reasons, scaler


def test_hand_computed_sequence():
    steps = [
        (False, 0.003),  # at 1: 4094 / 0.003 = 1.36e6 -> 2**20 (first step: no bound)
        (False, 0.003),  # a = 3145.7 <= 4094 < 6291: stays
        (False, 0.001),  # ideal 2**21 (4.09e6), = 2 * 2**20
        (False, 0.0001),  # ideal 2**25, bounded to x2: 2**22
        (False, 0.0001),  # 2**23
        (False, 0.0001),  # 2**24 = max_scale
        (False, 0.0001),  # capped
        (False, 0.01),  # 409400 -> 2**18, a decrease taken at once
        (True, 5000 / 2.0**18),  # overflow, finite amax 5000 >= T: x 2**(-1 - 1); ceiling 2**17
        (True, 0.0),  # all-NaN step, the amax saw nothing: x 1/2; ceiling 2**15
        (False, 0.01),  # at 2**15 a = 327.68; ideal 2**18, bounded to x2, held at the ceiling
    ]
    scales, reasons, k = drive(m4(), steps)
    assert scales == [2.0**e for e in (0, 20, 20, 21, 22, 23, 24, 24, 18, 16, 15, 15)]
    assert reasons == [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0]
    assert float(k.ceiling) == 2.0**15


def test_exact_power_of_two_boundary():
    # a * 2**k <= T is inclusive: g = 4094 / 2**10 fits 2**10 exactly.
    scales, _, _ = drive(m4(), [(False, 4094 / 2.0**10), (False, 4094.01 / 2.0**10)])
    assert scales == [1.0, 2.0**10, 2.0**9]


def test_margin_and_micro_batches_move_the_target():
    # margin 6 + ceil(log2(3)) = 8: T = 65504 / 256 = 255.875
    k = jas.amax_scaler(6, micro_batches=3)
    assert k.target == 65504 / 256
    scales, _, _ = drive(k, [(False, 1.0), (False, 0.25)])
    assert scales == [1.0, 128.0, 256.0]  # 255.875 / 1 -> 2**7; then /0.25 = 1023 -> 2**9, x2
    bf = m4(compute_dtype=jnp.bfloat16)
    scales, _, _ = drive(bf, [(False, 1e-3), (False, 1e-3)])
    assert scales == [1.0, 2.0**24, 2.0**24]  # max_scale is the bound in practice


def test_recorded_transformer_traces():
    # Unscaled amax of the transformer example's float32 run (seed 0, first 12
    # steps), recorded by examples/amax_scaler_study.py.  Worked by hand:
    # floor(log2(4094 / g)), e.g. 4094 / 0.0037538 = 1.09e6 -> 20, 4094 /
    # 0.0041793 = 9.80e5 -> 19 (a decrease at once), 4094 / 0.0036079 =
    # 1.13e6 -> 20 (+1, within the x2 bound).
    g = json.loads(TRACES.read_text())["float32_seed0_first12"]
    scales, reasons, _ = drive(m4(), [(False, x) for x in g])
    assert scales == [2.0**e for e in (0, 20, 19, 19, 19, 19, 19, 19, 19, 20, 20, 20, 20)]
    assert reasons == [0] * 12


def test_an_overflow_the_amax_did_not_see_sets_the_ceiling():
    # The issue-51 shape: the parameter gradients sit far below the line while
    # a tensor inside the backward pass overflows.  The scale halves like
    # torch's, and climbs back past the overflowed scale only after
    # growth_interval finite steps in a row (torch's pace), never every other step.
    k = m4(growth_interval=4)
    scales, _, k = drive(k, [(False, 1e-6)])  # at 1: 4094 / 1e-6 -> 2**31, clipped: 2**24
    assert scales == [1.0, 2.0**24]
    scales, reasons, k = drive(k, [(True, 1e-6)] * 3)  # unseen: halved three times
    assert scales == [2.0**e for e in (24, 23, 22, 21)] and reasons == [2, 2, 2]
    assert float(k.ceiling) == 2.0**21
    scales, reasons, k = drive(k, [(False, 1e-6)] * 9)
    # held at the ceiling 2**21 for 4 steps, then one doubling per 4 steps
    assert scales == [2.0**e for e in (21, 21, 21, 21, 22, 22, 22, 22, 23, 23)]
    assert reasons == [0] * 9 and float(k.ceiling) == 2.0**23


def test_nan_episode_backs_off_every_step_as_torch_does():
    k = m4(init_scale=2.0**10)
    scales, _, k = drive(k, [(False, 4094 / 2.0**10)])  # at 1: fits 2**10, the ceiling
    assert scales == [1.0, 2.0**10]
    scales, reasons, k = drive(k, [(True, 0.0)] * 6)  # NaN everywhere, finite amax 0
    assert scales == [2.0**e for e in (10, 9, 8, 7, 6, 5, 4)] and reasons == [2] * 6
    assert float(k.ceiling) == 2.0**4
    scales, reasons, k = drive(k, [(False, 1e-6), (False, 1e-6)])  # held by the ceiling
    assert scales == [2.0**4] * 3 and reasons == [0, 0]


def test_overflow_at_the_probe_backs_off_below_it():
    k = m4()
    steps = [
        (True, 0.0),  # at the probe 1, nothing measured: x 1/2, ceiling 1/2
        (False, 0.003),  # first finite step at 1/2: 2**20 asked, the ceiling holds 1/2
    ]
    scales, reasons, k = drive(k, steps)
    assert scales == [1.0, 0.5, 0.5]
    assert reasons == [2, 0]


def test_nan_with_large_finite_entries_keeps_backing_off():
    k = m4(init_scale=2.0**10)
    steps = [
        (False, 4094 / 2.0**10),  # at 1: 2**10, the ceiling
        (True, 8000 / 2.0**10),  # finite amax 8000 >= T: the scale's doing; k(8000) = -1: x 2**-2
        (True, 0.0),  # the amax saw nothing: x 1/2
    ]
    scales, reasons, _ = drive(k, steps)
    assert scales == [1.0, 2.0**10, 2.0**8, 2.0**7]
    assert reasons == [0, 1, 2]


def test_update_without_amax_never_grows():
    k = m4(init_scale=4.0)
    k = k.update(jnp.bool_(False))
    assert float(k.scale) == 1.0  # the probe, kept: nothing measured
    assert float(k.update(jnp.bool_(True)).scale) == 0.5


def params_and_grads():
    params = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.zeros((), jnp.float32)}
    g = {"w": jnp.array([1e-3, -2e-3, 4e-3]), "b": jnp.float32(5e-4)}
    return params, g


def scaled(g, state):
    return jax.tree.map(lambda x: x * state.scale, g)


def test_loss_scaled_measures_amax_and_names_leaves():
    params, g = params_and_grads()
    tx = loss_scaled(optax.sgd(0.1), m4(per_leaf=params))
    st = tx.init(params)
    u, st = jax.jit(tx.update)(scaled(g, st), st, params)
    k = st.scaler
    assert float(k.amax) == np.float32(4e-3)  # at scale 1
    assert float(k.headroom_used) == pytest.approx(4e-3 / 65504)
    assert int(k.reason) == 0 and float(k.scale) == 2.0**19  # 4094 / 4e-3 = 1.02e6
    assert k.leaf_report() == {"['b']": pytest.approx(5e-4), "['w']": pytest.approx(4e-3)}
    np.testing.assert_allclose(u["w"], -0.1 * g["w"], rtol=1e-6)


def test_overflow_is_skipped_exactly():
    params, _g = params_and_grads()
    tx = loss_scaled(optax.adam(0.1), m4(init_scale=2.0**8))
    st = tx.init(params)
    bad = {"w": jnp.array([jnp.inf, 1.0, 1.0]), "b": jnp.float32(1.0)}
    u, st2 = jax.jit(tx.update)(bad, st, params)
    assert all(bool(jnp.all(x == 0)) for x in jax.tree.leaves(u))
    for a, b in zip(jax.tree.leaves(st.inner_state), jax.tree.leaves(st2.inner_state), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(st2.skipped_steps) == 1 and int(st2.scaler.reason) == 2  # amax 1 < T
    assert float(st2.scaler.scale) == 0.5  # halved from the probe 1
    _, st3 = jax.jit(tx.update)(bad, st2, params)
    assert int(st3.skipped_steps) == 2 and float(st3.scaler.scale) == 0.25


def test_accumulate_gradients_and_trainer():
    params, g = params_and_grads()
    tx = accumulate_gradients(loss_scaled(optax.sgd(0.1), m4(micro_batches=2)), 2)
    st = tx.init(params)
    for _ in range(4):
        inner = get_loss_scaled_state(st)
        _, st = jax.jit(tx.update)(scaled(g, inner), st, params)
    k = get_loss_scaled_state(st).scaler
    # T = 65504 / 32 = 2047: at 1 -> 2047 / 4e-3 = 5.1e5 -> 2**18; then 2**18 holds (a = 1048.6)
    assert float(k.scale) == 2.0**18 and int(k.finite_steps) == 2

    trainer = jas.Trainer(optax.sgd(0.1), m4())

    def loss_fn(p, batch):
        return jnp.sum(p["w"] * batch) * 1e-3 + p["b"]

    state = trainer.init(params)
    p = params
    for _ in range(3):
        p, state, metrics = jax.jit(trainer.step, static_argnums=3)(p, state, jnp.ones(3), loss_fn)
    k = get_loss_scaled_state(state).scaler
    assert int(metrics["reason"]) == 0 and int(k.reason) == 0
    assert float(k.amax) > 0 and float(k.scale) > 1
    # The telemetry in the metrics: the step's scaled amax (b's gradient, 1,
    # times the scale the step ran at) and its share of 65504.
    assert float(metrics["amax"]) == float(k.amax) == float(metrics["scale"])
    assert float(metrics["headroom_used"]) == np.float32(k.amax) / np.float32(65504)


def test_hand_written_loop_with_optimizer_step():
    params, g = params_and_grads()
    tx = optax.sgd(0.1)
    opt_state, k = tx.init(params), m4()

    @jax.jit
    def step(p, opt_state, k):
        grads, found, k = k.unscale_and_update(scaled(g, k))
        p, opt_state = optimizer_step(tx, grads, opt_state, p, found)
        return p, opt_state, k

    params, opt_state, k = step(params, opt_state, k)
    assert float(k.scale) == 2.0**19 and int(k.reason) == 0


@pytest.mark.slow
def test_axis_name_pmax_and_vmap():
    _params, g = params_and_grads()
    k = m4()
    many = jax.tree.map(lambda x: jnp.stack([x, 4 * x]), g)  # replica 1 has 4x the amax

    def one(grads):
        _, found, new = k.unscale_and_update(grads, axis_name="i")
        return found, new.amax, new.scale

    found, amax, scale = jax.vmap(one, axis_name="i")(many)
    np.testing.assert_array_equal(amax, np.float32([16e-3, 16e-3]))  # pmax across replicas
    np.testing.assert_array_equal(scale, [2.0**17, 2.0**17])
    assert not bool(jnp.any(found))
    # vmap over a batch of scalers (no axis_name): each its own rule.
    ks = jax.vmap(lambda s: k.update(jnp.bool_(False), amax=s))(jnp.float32([1e-3, 1.0]))
    np.testing.assert_array_equal(ks.scale, [2.0**21, 2.0**11])


def test_export_round_trip_and_pickle():
    params, g = params_and_grads()
    k = m4(per_leaf=params)

    def step(k, grads):
        return k.unscale_and_update(grads)

    exp = export.export(jax.jit(step))(k, scaled(g, k))  # the library's own targets allowed
    back = export.deserialize(exp.serialize())
    got, want = back.call(k, scaled(g, k)), step(k, scaled(g, k))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert got[2].leaf_paths == ("['b']", "['w']") and float(got[2].scale) == 2.0**19
    again = pickle.loads(pickle.dumps(jax.device_get(want[2])))  # a checkpoint's view
    assert again.leaf_paths == want[2].leaf_paths and float(again.scale) == 2.0**19
    leaves, treedef = jax.tree.flatten(want[2])
    assert jax.tree.unflatten(treedef, leaves).margin == 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"margin": -1}, r"margin must be an int in \[0, 24\]"),
        ({"margin": 2.5}, r"margin must be an int"),
        ({"init_scale": 3.0}, r"init_scale must be a power of two"),
        ({"max_scale": 1000.0}, r"max_scale must be a power of two"),
        ({"init_scale": 2.0**30}, r"init_scale .* must lie within \[min_scale, max_scale\]"),
        ({"max_scale": 64.0, "init_scale": 2.0**16}, r"init_scale \(65536.0\) must lie within"),
        (
            {"min_scale": 2.0**4, "max_scale": 2.0**2},
            r"min_scale \(16.0\) must not exceed max_scale",
        ),
        ({"micro_batches": 0}, r"micro_batches must be an int in \[1,"),
        ({"growth_interval": 0}, r"growth_interval must be an int in \[1, 2147483647\]"),
        ({"compute_dtype": jnp.int8}, r"compute_dtype must be one of float16, bfloat16, float32"),
        ({"per_leaf": {"i": jnp.zeros(2, jnp.int32)}}, r"per_leaf must be a pytree"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        jas.amax_scaler(**kwargs)


def test_bad_update_arguments_name_the_argument():
    params, _ = params_and_grads()
    k = m4(per_leaf=params)  # two floating leaves
    with pytest.raises(ValueError, match=r"leaf_amax must have shape \(2,\).*got shape \(\)"):
        k.update(False, amax=1.0, leaf_amax=1.0)
    with pytest.raises(ValueError, match=r"leaf_amax must have shape \(2,\).*\(2, 2\)"):
        k.update(False, amax=1.0, leaf_amax=jnp.ones((2, 2)))
    with pytest.raises(ValueError, match=r"backend must be one of .*'bogus'"):
        k.update(False, amax=1.0, backend="bogus")
    with pytest.raises(ValueError, match=r"backend must be one of .*'bogus'"):
        k.unscale_and_update(params, update_backend="bogus")


@pytest.mark.parametrize(
    "amax", [jnp.array([1.0, 2.0]), np.ones((2, 1), np.float32), jnp.ones((1, 1)), [0.5] * 3]
)
def test_amax_of_another_shape_names_the_argument(amax):
    # Per-leaf maxima passed as amax= raised jax's own "cannot reshape array
    # of shape (2,)" from inside jax; (1, 1) was silently taken.
    k = m4()
    shape = np.shape(amax)
    want = (
        rf"amax must be a scalar, shape \(\) or \(1,\); got shape {re.escape(str(shape))}.*"
        r"per-leaf maxima go to leaf_amax"
    )
    with pytest.raises(ValueError, match=want):
        k.update(False, amax=amax)
    with pytest.raises(ValueError, match=want):  # at trace time, under jit
        jax.jit(lambda a: k.update(False, amax=a))(jnp.asarray(amax))


def test_amax_of_shape_one_is_taken():
    k = m4()
    for amax in (jnp.float32(4094 / 2.0**10), jnp.array([4094 / 2.0**10]), 4094 / 2.0**10):
        new = k.update(False, amax=amax)
        assert float(new.scale) == 2.0**10 and new.amax.shape == ()
        assert float(new.amax) == np.float32(4094 / 2.0**10)


def test_update_over_axis_name_reduces_every_amax():
    params, _ = params_and_grads()
    k = m4(per_leaf=params)
    per = jnp.float32([[1.0, 2.0], [3.0, 0.5]])  # two members' leaf amaxes

    def one(a, leaves):
        return k.update(False, amax=a, leaf_amax=leaves, axis_name="r")

    out = jax.vmap(one, axis_name="r")(jnp.max(per, axis=1), per)
    np.testing.assert_array_equal(out.leaf_amax, [[3.0, 2.0], [3.0, 2.0]])
    np.testing.assert_array_equal(out.amax, [3.0, 3.0])


def test_default_margin_is_the_measured_one():
    k = jas.amax_scaler()
    assert (k.margin, k.micro_batches, k.growth_interval) == (5, 1, 2000)
    assert k.target == 65504 / 32 and float(k.ceiling) == 2.0**16  # torch's first scale
    assert float(k.scale) == 1.0  # the probe
    assert (k.min_scale, k.max_scale, k.compute_dtype) == (2.0**-24, 2.0**24, "float16")


def test_public_names():
    assert {"AmaxScaler", "amax_scaler"} <= set(jas.__all__)
    assert isinstance(m4(), jas.Scaler)


@pytest.mark.slow
def test_study_script_runs(tmp_path):
    pytest.importorskip("flax")
    import importlib
    import sys

    examples = Path(__file__).resolve().parents[3] / "examples"
    sys.path.insert(0, str(examples))
    try:
        study = importlib.import_module("amax_scaler_study")
        args = ["--steps", "4", "--seeds", "0", "--kinds", "float32,dynamic,amax"]
        args += ["--stress", "spike", "--layers", "1", "--sample-every", "2"]
        assert study.main([*args, "--out-dir", str(tmp_path)]) == 0
        # The all-float16 model: its own cache entries, and no torch twin.
        all16 = tmp_path / "all16"
        tiny = ["--steps", "4", "--seeds", "0", "--stress", "", "--layers", "1"]
        tiny += ["--sample-every", "2", "--out-dir", str(all16), "--grads", "float16"]
        assert study.main([*tiny, "--kinds", "float32,amax,amax-f16"]) == 0
        with pytest.raises(SystemExit):
            study.main([*tiny, "--kinds", "float32,torch"])
    finally:
        sys.path.remove(str(examples))
    got = json.loads((all16 / "amax_study.json").read_text())
    assert got["settings"]["grads"] == "float16"
    assert {p.name for p in (all16 / "runs").iterdir()} == {
        f"default_0_{k}_4_1_g16.npz" for k in ("amax", "amax-f16", "float32")
    }
    rows = [line.split("|")[1:-1] for line in (tmp_path / "amax_study.md").read_text().splitlines()]
    cells = [[c.strip() for c in row] for row in rows]
    assert ["amax", "0"] in [row[:2] for row in cells] and "spike" in [
        row[0] for row in cells if row
    ]
    assert json.loads((tmp_path / "amax_traces.json").read_text())["default/0/amax"]["amax"]
    runs = json.loads((tmp_path / "amax_study.json").read_text())["runs"]
    assert {(r["variant"], r["kind"]) for r in runs} >= {("default", "amax"), ("spike", "dynamic")}
    assert all(r["past_65504_float16_path"] <= r["past_65504_all_leaves"] for r in runs)


def test_orbax_round_trip_continues(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    params, g = params_and_grads()
    tx = loss_scaled(optax.adam(0.1), m4(per_leaf=params))
    st = tx.init(params)
    step = jax.jit(tx.update)
    for _ in range(3):
        _, st = step(scaled(g, st), st, params)
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "ckpt", {"opt": st})
    ckpt.wait_until_finished()
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, {"opt": tx.init(params)})
    back = ckpt.restore(tmp_path / "ckpt", target)["opt"]
    assert back.scaler.leaf_paths == ("['b']", "['w']")
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(st), strict=True):
        np.testing.assert_array_equal(a, b)
    _, want = step(scaled(g, st), st, params)
    _, got = step(scaled(g, back), back, params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_amax_comes_from_the_native_pass_on_cpu():
    # One read of the gradients: the step calls the pass that measures the
    # amax, not the plain pass plus a reduction.
    params = {"w": jnp.ones((8, 4)), "b": jnp.zeros(4)}
    tx = loss_scaled(optax.adam(1e-3), jas.amax_scaler())
    state = tx.init(params)
    text = jax.jit(tx.update).lower(params, state, params).as_text()
    if "ffi" not in jas.available_backends("cpu"):
        pytest.skip("the native module is not loaded")
    assert "jas_unscale_check_amax_v1" in text
    assert "jas_unscale_and_check_v1" not in text


def test_study_underflow_measure_is_float16_rounding(monkeypatch):
    """The study's scale-underflow measure (counts of float32 magnitudes at
    most 2**-25 / scale) agrees with NumPy's float16 rounding of g * scale."""
    pytest.importorskip("flax")
    examples = Path(__file__).resolve().parents[3] / "examples"
    monkeypatch.syspath_prepend(str(examples))
    import amax_scaler_study as study

    rng = np.random.default_rng(0)
    leaves = []
    for top in (0.0, -12.0):  # two leaves, their largest 2**0 and 2**-12
        e = rng.uniform(-60.0, top, 4000)
        e[0] = top
        leaves.append((np.exp2(e) * rng.choice([-1.0, 1.0], e.size)).astype(np.float32))
    counts = np.asarray(study.tiny_counts({"a": jnp.asarray(leaves[0]), "b": leaves[1]}))
    # Live: above 2**-24 of the leaf's largest (float32 rounding residue below).
    live = [g[np.abs(g) > np.abs(g).max() * np.float32(2.0**-24)] for g in leaves]
    assert counts[-1] == sum(g.size for g in live)
    for e_s in range(25):
        s = np.float32(2.0**e_s)
        with np.errstate(over="ignore"):  # the largest overflow: not zero
            flushed = sum(int(np.sum(np.float16(g * s) == 0)) for g in live)
        assert study.scale_underflow(counts, float(s)) == flushed / counts[-1], e_s


@pytest.mark.slow
def test_study_torch_twin_records_each_micro_batch(tmp_path):
    """The study's torch twin under accum8 divides each micro-batch loss by 8
    (torch's recipe) and records each micro-batch's own gradient amax: on the
    first step (same weights, same batch) it is 1/8 of the JAX run's, which
    feeds accumulate_gradients undivided micro-batch gradients; the
    accumulated sum's amax (what it recorded before) is not."""
    pytest.importorskip("flax")
    pytest.importorskip("torch")
    import importlib
    import sys

    examples = Path(__file__).resolve().parents[3] / "examples"
    sys.path.insert(0, str(examples))
    try:
        study = importlib.import_module("amax_scaler_study")
        args = ["--steps", "2", "--seeds", "0", "--kinds", "dynamic,torch", "--stress", "accum8"]
        args += ["--layers", "1", "--sample-every", "2", "--out-dir", str(tmp_path)]
        assert study.main(args) == 0
    finally:
        sys.path.remove(str(examples))
    traces = json.loads((tmp_path / "amax_traces.json").read_text())
    ratio = traces["accum8/0/torch"]["amax"][0] / traces["accum8/0/dynamic"]["amax"][0]
    assert abs(ratio - 1 / 8) < 0.125 * 0.05, ratio


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_headroom_used_is_not_flushed_under_jit(dtype):
    # Issue 51: a / F became a * (1 / F), a subnormal flushed to 0 under jit.
    k = jas.amax_scaler(compute_dtype=dtype)
    got = jax.jit(lambda k: k.update(False, amax=1e6).headroom_used)(k)
    largest = float(jnp.finfo(jnp.dtype(dtype)).max)
    assert float(got) == pytest.approx(1e6 / largest, rel=1e-6) and float(got) > 0
