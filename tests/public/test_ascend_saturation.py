"""Ascend as deployed (issue #53): the SoC decides which CANN operators run,
and in saturation mode overflow is read from the hardware's flag.

Everything runs on CPU against the CANN double (tests/cann_double), which
plays the SoC and the mode it is given (``control.use``), keeps a float
status register per device and refuses the operators CANN lists as
unsupported on a SoC.  `ascend_harness.saturate` plays a saturation-mode
backward: float16 inf becomes +-65504, NaN becomes 0, and the register is
set.  The oracle of the long run is torch_npu's GradScaler in saturation
mode, emulated from its source's logic (tests/_torch_npu_saturation.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale import plugin
from jax_amp_scale.optax import loss_scaled
from tests import _torch_npu_saturation as torch_npu
from tests import ascend_harness
from tests.cann_double import control

UPDATE = "aclnnAmpUpdateScale"
FUSED = "aclnnForeachNonFiniteCheckAndUnscale"

# SoC, mode asked for (None: the double's default, or the only mode the
# product has), the operators dispatched, whether overflow is read from the
# flag, and the operators "auto" warns about.
MATRIX = [
    ("Ascend910A", None, set(), True, {UPDATE, FUSED}),
    ("Ascend910B", None, set(), True, {UPDATE, FUSED}),  # no digit: a first-generation 910
    ("Ascend910B2", "inf_nan", {UPDATE, FUSED}, False, set()),
    ("Ascend910B2", "saturation", {UPDATE, FUSED}, True, set()),
    ("Ascend910_9391", None, {UPDATE, FUSED}, False, set()),  # A3: INF_NAN by default
    ("Ascend310P3", None, {FUSED}, True, {UPDATE}),  # inference series: saturation only
]
IDS = [f"{soc}-{mode or 'default'}" for soc, mode, *_ in MATRIX]


def _use(monkeypatch, double, soc, mode=None):
    control.use(monkeypatch, double, "full", soc=soc, mode=mode)


def _dispatched(log):
    names = {"gws": UPDATE, "foreach_gws": FUSED}
    return {names[e["ev"]] for e in log if e["ev"] in names and e["status"] == 0}


def _flag_calls(log):
    return [e["ev"] for e in log if e["ev"] in ("flag_clear", "flag_get")]


def _loss(p, x):  # float16 compute, float32 loss
    return jnp.sum(p["w"] * x).astype(jnp.float32)


def _step(tx, saturating):
    """One jitted step: scaled loss, backward, (saturation), update."""

    def step(params, opt_state, x):
        grads = jax.grad(lambda p: jas.scale_loss(_loss(p, x), opt_state))(params)
        if saturating:
            grads = ascend_harness.saturate(grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(step)


@pytest.mark.parametrize(
    ("soc", "mode", "reported"),
    [
        ("Ascend910B", "inf_nan", "saturation"),  # a 910 has no other mode
        ("Ascend910B2", "saturation", "saturation"),
        ("Ascend950PR", "saturation", "inf_nan"),  # a 950 has no other mode
    ],
)
def test_plugin_load_cann_reports_the_soc_and_the_overflow_mode(
    double, monkeypatch, soc, mode, reported
):
    # The public call, on the installed module's own loader: a fresh process.
    _use(monkeypatch, double, soc, mode)
    code = "import json; from jax_amp_scale import plugin; print(json.dumps(plugin.load_cann()))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ),
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (got["soc"], got["overflow_mode"]) == (soc, reported)


@pytest.mark.parametrize(("soc", "mode", "ops", "flag", "warned"), MATRIX, ids=IDS)
def test_soc_and_mode_decide_the_operators_and_where_overflow_is_read(
    double, monkeypatch, soc, mode, ops, flag, warned
):
    _use(monkeypatch, double, soc, mode)
    loaded = ascend_harness.testing().load_cann()
    assert loaded["soc"] == soc
    assert loaded["overflow_mode"] == ("saturation" if flag else "inf_nan")
    tx = loss_scaled(optax.sgd(0.5), jas.dynamic_scaler(init_scale=2.0**8))
    params = {"w": jnp.ones((8,), jnp.float16)}
    with ascend_harness.ascend_on_cpu(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = _step(tx, saturating=flag)
        state = tx.init(params)
        # A finite step, then one whose backward overflows in entry 3.
        p1, s1 = step(params, state, jnp.full((8,), 0.5, jnp.float16))
        x = jnp.full((8,), 0.5, jnp.float16).at[3].set(jnp.inf)
        p2, s2 = step(p1, s1, x)
        jax.block_until_ready((p2, s2))
    log = double.log()
    assert _dispatched(log) == ops
    ours = [w for w in caught if "jax_amp_scale" in str(w.message)]
    assert len(ours) == (1 if warned else 0), [str(w.message) for w in ours]
    for op in warned:
        assert op in str(ours[0].message) and soc in str(ours[0].message)
    # Two steps: the clear before each backward, and each read with its clear.
    assert _flag_calls(log) == (["flag_clear", "flag_get", "flag_clear"] * 2 if flag else [])
    assert int(s1.skipped_steps) == 0 and int(s2.skipped_steps) == 1
    assert float(s2.scale) == 2.0**7
    np.testing.assert_array_equal(np.asarray(p2["w"]), np.asarray(p1["w"]))  # skipped: unchanged
    if flag:  # what the update saw held no inf: only the flag can have told
        assert double.float_status(0) == 0  # cleared after the read


@pytest.mark.parametrize("soc", ["Ascend910A", "Ascend910B"])
def test_ffi_on_a_training_series_soc_raises_naming_the_soc(double, monkeypatch, soc):
    _use(monkeypatch, double, soc)
    state = jas.init_scale_state()
    with ascend_harness.ascend_on_cpu():
        with pytest.raises(ValueError, match=f"{UPDATE} is not supported on the Ascend SoC {soc} "):
            jax.jit(lambda s: jas.update_scale(s, False, backend="ffi"))(state)
        with pytest.raises(ValueError, match="Atlas A2") as info:
            jas.unscale_and_check({"g": jnp.ones(4, jnp.float16)}, state, backend="ffi")
        assert FUSED in str(info.value) and soc in str(info.value)
    assert _dispatched(double.log()) == set()


def test_ffi_on_an_a2_soc_still_runs_natively(double, monkeypatch):
    # Exact names: Ascend910B2 is an A2, whatever "Ascend910B" is.
    _use(monkeypatch, double, "Ascend910B2")
    with ascend_harness.ascend_on_cpu():
        jax.block_until_ready(jas.update_scale(jas.init_scale_state(), False, backend="ffi"))
    assert _dispatched(double.log()) == {UPDATE}


def test_the_double_refuses_the_operators_on_a_training_series_soc(double, monkeypatch):
    # What "auto" avoids: CANN's operator on a SoC it does not support.
    _use(monkeypatch, double, "Ascend910A")
    s, t = jnp.ones((1,), jnp.float32), jnp.zeros((1,), jnp.int32)
    with pytest.raises(Exception, match=r"561003.*not supported on SoC Ascend910A"):
        jax.block_until_ready(
            ascend_harness.update_scale(
                s, t, False, growth_factor=2.0, backoff_factor=0.5, growth_interval=10
            )
        )
    with pytest.raises(Exception, match=rf"561003.*{FUSED} is not supported on SoC Ascend910A"):
        jax.block_until_ready(
            ascend_harness.unscale_and_check(jnp.float32(1.0), [jnp.ones(4, jnp.float16)])
        )


def test_the_double_keeps_a_register_per_device(double, monkeypatch):
    _use(monkeypatch, double, "Ascend910B2", "saturation")
    assert [double.float_status(d) for d in range(3)] == [0, 0, 0]
    double.raise_float_status(1)
    assert [double.float_status(d) for d in range(3)] == [0, 1, 0]
    # Its float16 kernel saturates and sets the register: an unscale by 4
    # of 30000 stores 65504, not inf, and no value check sees it.
    found, (out,) = ascend_harness.unscale_and_check(
        jnp.float32(4.0), [jnp.array([30000.0, 1.0], jnp.float16)]
    )
    np.testing.assert_array_equal(np.asarray(out), np.array([65504.0, 4.0], np.float16))
    assert not bool(found)
    assert double.float_status(0) == 1


def test_inf_nan_mode_adds_no_call_and_no_operator(double, monkeypatch):
    tx = loss_scaled(optax.sgd(0.5))
    params = {"w": jnp.ones((8,), jnp.float16)}
    x = jnp.full((8,), 0.5, jnp.float16)

    def lowered():
        with ascend_harness.ascend_on_cpu():
            text = _step(tx, False).lower(params, tx.init(params), x).as_text()
            return text, _step(tx, False)(params, tx.init(params), x)

    _use(monkeypatch, double, "Ascend910B2", "inf_nan")
    text, out = lowered()
    jax.block_until_ready(out)
    assert _flag_calls(double.log()) == []
    assert double.stats()["flag_clears"] == double.stats()["flag_reads"] == 0
    assert "float_status" not in text
    # The step's program is the one without a device to ask (before #53).
    monkeypatch.setenv("ASCEND_HOME_PATH", "/nonexistent")
    ascend_harness.forget_device()
    before, _ = lowered()
    assert text == before
    _use(monkeypatch, double, "Ascend910B2", "saturation")
    saturated, _ = lowered()
    assert saturated.count("jas_float_status_clear_ascend_test") == 2
    assert saturated.count("jas_float_status_read_ascend_test") == 1


def test_auto_warns_once_per_process_on_a_training_series_soc(double, monkeypatch):
    _use(monkeypatch, double, "Ascend910A")
    tx = loss_scaled(optax.sgd(0.5))
    params = {"w": jnp.ones((8,), jnp.float16)}
    x = jnp.full((8,), 0.5, jnp.float16)
    with ascend_harness.ascend_on_cpu(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # a second trace, another function: no second warning
            jax.clear_caches()
            jax.block_until_ready(_step(tx, False)(params, tx.init(params), x))
        jax.block_until_ready(jas.update_scale(jas.init_scale_state(), False))
    ours = [w for w in caught if "jax_amp_scale" in str(w.message)]
    assert len(ours) == 1
    assert "Ascend910A (Atlas training series (910))" in str(ours[0].message)
    assert "runs the pure-JAX reference" in str(ours[0].message)


# ---- a saturation-mode run against torch_npu's GradScaler -------------------

STEPS = 320
GROWTH_INTERVAL = 10
INIT_SCALE = 2.0**12
INF_STEP = 100  # a gradient entry overflows to inf (saturates to 65504)


def _data(nan_step):
    """Each step's input; `nan_step`'s entry 5 is 0 * inf in the backward."""
    rng = np.random.default_rng(53)
    xs = rng.uniform(-1.9, 1.9, size=(STEPS, 8)).astype(np.float16)
    masks = np.ones((STEPS, 8), np.float16)
    xs[INF_STEP, 3] = np.inf
    if nan_step is not None:
        xs[nan_step, 5], masks[nan_step, 5] = np.inf, 0
    return xs, masks


def _oracle(nan_step):
    """torch_npu's decisions: its backward is float16 ``scale * (x * m)``."""
    xs, masks = _data(nan_step)

    def backward(step, replica, scale):
        with np.errstate(over="ignore", invalid="ignore"):
            return {"w": np.float16(scale) * (xs[step] * masks[step])}

    scaler = torch_npu.GradScaler(INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    return torch_npu.run(scaler, STEPS, backward)


def _ours(nan_step, *, fallback=False):
    """This library's decisions in one jitted step per iteration."""
    xs, masks = _data(nan_step)
    scaler = jas.dynamic_scaler(INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    tx = loss_scaled(optax.sgd(2.0**-12), scaler)

    @jax.jit
    def step(params, opt_state, x, m):
        def loss(p):
            return jas.scale_loss(jnp.sum(p["w"] * (x * m)).astype(jnp.float32), opt_state)

        grads = ascend_harness.saturate(jax.grad(loss)(params))
        if fallback:
            grads = plugin.saturated_as_overflow(grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, grads

    params = {"w": jnp.zeros((8,), jnp.float16)}
    state = tx.init(params)
    out = []
    with ascend_harness.ascend_on_cpu():
        for i in range(STEPS):
            used = float(state.scale)
            before = int(state.skipped_steps)
            params, state, grads = step(params, state, xs[i], masks[i])
            skipped = int(state.skipped_steps) > before
            out.append({"skipped": skipped, "scale": used, "grads": np.asarray(grads["w"])})
    return out


def _nan_step():
    """A step after INF_STEP whose scale stays below float16's limit, so that
    only the injected NaN can overflow it."""
    plain = _oracle(None)
    return next(
        i for i in range(150, STEPS) if not plain[i]["skipped"] and plain[i]["scale"] <= 2.0**15
    )


@pytest.fixture(scope="module")
def nan_step():
    return _nan_step()


def test_saturation_run_takes_torch_npus_decisions(double, monkeypatch, nan_step):
    _use(monkeypatch, double, "Ascend910B2", "saturation")
    oracle = _oracle(nan_step)
    ours = _ours(nan_step)
    assert [o["skipped"] for o in ours] == [o["skipped"] for o in oracle]
    assert [o["scale"] for o in ours] == [o["scale"] for o in oracle]
    skipped = [i for i, o in enumerate(oracle) if o["skipped"]]
    assert INF_STEP in skipped and nan_step in skipped
    assert len(skipped) >= 20  # natural overflows too, each time the scale reaches 2**16
    # What the flag caught at nan_step held no inf/NaN and no 65504: the NaN became 0.
    g = ours[nan_step]["grads"]
    assert np.all(np.isfinite(g)) and g[5] == 0 and np.max(np.abs(g)) < 65504


def test_with_the_flag_ignored_the_saturated_steps_are_applied(double, monkeypatch, nan_step):
    # The same backward (it saturates), read by value only: what #53 fixes.
    _use(monkeypatch, double, "Ascend910B2", "inf_nan")
    oracle = _oracle(nan_step)
    ours = _ours(nan_step)
    applied = [
        i
        for i, (o, t) in enumerate(zip(ours, oracle, strict=True))
        if t["skipped"] and not o["skipped"]
    ]
    assert INF_STEP in applied and nan_step in applied
    assert not any(o["skipped"] for o in ours)  # every saturated step applied
    assert ours[-1]["scale"] > 2.0**16  # the scale kept growing past float16's limit


def test_the_value_fallback_misses_the_nan_that_became_zero(double, monkeypatch, nan_step):
    # Flag ignored, +-65504 counted as overflow: right except where NaN became 0.
    _use(monkeypatch, double, "Ascend910B2", "inf_nan")
    oracle = _oracle(nan_step)
    ours = _ours(nan_step, fallback=True)
    differ = [
        i for i, (o, t) in enumerate(zip(ours, oracle, strict=True)) if o["skipped"] != t["skipped"]
    ]
    assert differ[0] == nan_step and not ours[nan_step]["skipped"]


def test_the_value_fallback_counts_a_genuine_65504():
    grads = {"w": jnp.array([65504.0, -65504.0, 1.0], jnp.float16), "b": jnp.float32(65504.0)}
    out = plugin.saturated_as_overflow(grads)
    np.testing.assert_array_equal(np.asarray(out["w"]), [np.inf, -np.inf, 1.0])
    assert float(out["b"]) == 65504.0  # float32 passes
    _, found = jas.unscale_and_check(grads, 1.0)
    _, found_fallback = jas.unscale_and_check(out, 1.0)
    assert not bool(found) and bool(found_fallback)


@pytest.mark.parametrize(
    ("soc", "mode", "env", "saturates"),
    [
        ("Ascend910B2", "saturation", {}, True),  # reported: the report decides
        ("Ascend910B2", "inf_nan", {"INF_NAN_MODE_ENABLE": "0"}, False),
        ("Ascend910A", "unknown", {}, True),  # not reported: the 910 has one mode
        ("Ascend310P3", "unknown", {}, True),
        ("Ascend950PR", "unknown", {"INF_NAN_MODE_ENABLE": "0"}, False),
        ("Ascend910B2", "unknown", {}, False),  # the A2's default
        ("Ascend910B2", "unknown", {"INF_NAN_MODE_ENABLE": "0"}, False),  # not forced
        (
            "Ascend910B2",
            "unknown",
            {"INF_NAN_MODE_ENABLE": "0", "INF_NAN_MODE_FORCE_DISABLE": "1"},
            True,
        ),
    ],
)
def test_the_mode_when_cann_cannot_report_it(monkeypatch, soc, mode, env, saturates):
    from jax_amp_scale.mechanisms import cann_device

    for var in ("INF_NAN_MODE_ENABLE", "INF_NAN_MODE_FORCE_DISABLE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert cann_device.Device(soc, mode).saturation is saturates


@jax.custom_vjp
def _saturating(w):
    """An identity whose backward saturates its cotangent, as the NPU would."""
    return w


_saturating.defvjp(lambda w: (w, None), lambda _, ct: (ascend_harness.saturate(ct),))


@pytest.mark.parametrize(
    "make",
    [
        lambda: jas.dynamic_scaler(2.0**8),
        lambda: jas.amax_scaler(init_scale=2.0**8),  # its own pass, with the amax
        lambda: jas.static_scaler(2.0**8),
    ],
    ids=["dynamic", "amax", "static"],
)
def test_every_scaler_sees_the_flag_through_the_trainer(double, monkeypatch, make):
    # The backward itself saturates (inside jax.grad), and Trainer's step
    # skips it: the scalers see the OR of the flag and the value check.
    _use(monkeypatch, double, "Ascend910A")
    trainer = jas.Trainer(optax.sgd(2.0**-8), make())

    def loss_fn(p, x):
        return jnp.sum(_saturating(p["w"]) * x).astype(jnp.float32)

    params = {"w": jnp.ones((8,), jnp.float16)}
    x = jnp.full((8,), 0.5, jnp.float16)
    with ascend_harness.ascend_on_cpu(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "auto" on a 910: the reference
        step = jax.jit(lambda p, s, x: trainer.step(p, s, x, loss_fn))
        state = trainer.init(params)
        p1, s1, m1 = step(params, state, x)
        p2, s2, m2 = step(p1, s1, x.at[3].set(jnp.inf))
        jax.block_until_ready((p2, s2))
    assert not bool(m1["skipped"]) and bool(m2["skipped"])
    assert np.all(np.asarray(p1["w"]) < 1)  # the first step was applied
    np.testing.assert_array_equal(np.asarray(p2["w"]), np.asarray(p1["w"]))
    assert [e["ev"] for e in double.log() if e["ev"] == "flag_raise"] == ["flag_raise"]
