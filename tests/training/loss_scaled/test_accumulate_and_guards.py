"""Issue 14: accumulation with torch's semantics, non-finite updates, runaway
overflows, the torch port (clip, norm, several optimizers) and error paths.

torch 2.13.0 (CPU) is the oracle for accumulation, clipping and the
multiple-optimizer scenario.
"""

import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale.optax import (
    SkipReason,
    accumulate_gradients,
    clip_grad_norm,
    get_loss_scaled_state,
    loss_scaled,
    optimizer_step,
)

torch = pytest.importorskip("torch")

INF = float("inf")


def lin_loss(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


def data(windows, micro, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((windows, micro, 8, 3)).astype(np.float32)
    y = rng.standard_normal((windows, micro, 8)).astype(np.float32)
    return x, y


# ---------------------------------------------------------------- accumulation


def test_accumulate_matches_torch_gradscaler():
    """4 micro-batches per step, overflows injected in some: same scale
    trajectory, same skipped windows and same parameters as torch's
    GradScaler with SGD (momentum) over the same micro-batches."""
    windows, k = 10, 4
    inject = {(1, 2), (4, 0), (6, 3), (6, 1), (7, 1)}
    x, y = data(windows, k)
    w0 = np.array([0.5, -0.25, 1.0], np.float32)

    # torch: loss / k per micro-batch, .grad accumulates, one step per window
    tw = torch.tensor(w0, requires_grad=True)
    opt = torch.optim.SGD([tw], lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    t_scale, t_skip, t_w = [], [], []
    for t in range(windows):
        for m in range(k):
            loss = ((torch.from_numpy(x[t, m]) @ tw - torch.from_numpy(y[t, m])) ** 2).mean()
            scaler.scale(loss / k).backward()
            if (t, m) in inject:
                with torch.no_grad():
                    tw.grad[0] += INF
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        t_skip.append(scaler.get_scale() < before)
        t_scale.append(scaler.get_scale())
        t_w.append(tw.detach().numpy().copy())

    tx = accumulate_gradients(
        loss_scaled(optax.sgd(0.05, momentum=0.9), jas.dynamic_scaler(1024.0, growth_interval=2)),
        k,
    )
    w = jnp.asarray(w0)
    st = tx.init(w)

    @jax.jit
    def micro(w, st, x, y, poison):
        g = jax.grad(lambda w: jas.scale_loss(lin_loss(w, x, y), st))(w)
        g = g.at[0].add(jnp.where(poison, jnp.inf, 0.0))
        u, st = tx.update(g, st, w)
        return optax.apply_updates(w, u), st

    j_scale, j_skip = [], []
    for t in range(windows):
        for m in range(k):
            w, st = micro(w, st, x[t, m], y[t, m], (t, m) in inject)
            if m < k - 1:
                assert int(st.mini_step) == m + 1  # accumulating
        j_skip.append(bool(st.inner_state.found_inf))
        j_scale.append(float(st.inner_state.scale))
        np.testing.assert_allclose(np.asarray(w), t_w[t], rtol=1e-6, atol=1e-7)
        assert np.isfinite(np.asarray(st.acc_grads)).all()
    assert j_skip == t_skip == [False, True, False, False, True, False, True, True, False, False]
    assert j_scale == t_scale
    # One counting convention: optimizer steps (windows) for both counters.
    ls = get_loss_scaled_state(st)
    assert int(ls.skipped_steps) == 4 and int(ls.total_steps) == windows
    # grew after 2 finite optimizer steps (8 micro-batches), not 2 micro-batches
    assert j_scale[1:4] == [512.0, 512.0, 1024.0]


def test_accumulate_window_state_is_clean():
    """An overflow mid-window: no update in the whole window, inner state
    untouched bit for bit, accumulator back to zeros, then training goes on."""
    tx = accumulate_gradients(
        loss_scaled(optax.adam(1e-2), jas.dynamic_scaler(8.0, growth_interval=2)), 4
    )
    p = {"w": jnp.ones(3), "n": jnp.int32(3)}
    st = tx.init(p)
    upd = jax.jit(tx.update)
    first = st.inner_state.inner_state
    skipped, scales = [], []
    for t, bad in enumerate([False, True, False, False] + [False] * 12):
        ls = st.inner_state
        g = {"w": jnp.full(3, jnp.nan if bad else 1.0) * ls.scale, "n": jnp.int32(t)}
        u, st = upd(g, st, p)
        ls = st.inner_state
        skipped.append(int(ls.skipped_steps))
        scales.append(float(ls.scale))
        if t < 4:
            assert float(jnp.abs(u["w"]).max()) == 0.0
            assert bool(ls.found_inf) == (t == 3)
            jax.tree.map(
                lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                ls.inner_state,
                first,
            )
        if t % 4 == 3:  # reset by select at the window end: no NaN survives
            assert np.isfinite(np.asarray(st.acc_grads["w"])).all()
    assert skipped == [0, 0, 0, 1] + [1] * 12
    # backed off once at the overflow window, grew after 2 finite *windows*
    assert scales[3] == 4.0 and scales[7] == 4.0 and scales[11] == 8.0 and scales[15] == 8.0
    assert int(st.mini_step) == 0 and int(ls.skipped_steps) == 1 and int(ls.total_steps) == 4
    np.testing.assert_array_equal(st.acc_grads["w"], np.zeros(3))
    assert int(ls.inner_state[0].count) == 3  # adam stepped once per finite window


def test_multisteps_around_loss_scaled_is_refused_at_init():
    """optax.MultiSteps resets its accumulator as (1 - emit) * acc: one
    overflow would leave NaN in it for good and freeze training silently.
    Every way of calling MultiSteps' init says so, naming the fix."""
    p = {"w": jnp.zeros(3)}
    ms = optax.MultiSteps(loss_scaled(optax.sgd(1.0)), every_k_schedule=2)
    for init in (ms.init, ms.gradient_transformation().init, jax.jit(ms.init)):
        with pytest.raises(TypeError, match=r"optax.MultiSteps.*accumulate_gradients\(loss_scaled"):
            init(p)
    # Around a chain holding loss_scaled too, and inside a chain inside it.
    chained = optax.MultiSteps(optax.chain(loss_scaled(optax.sgd(1.0))), every_k_schedule=2)
    with pytest.raises(TypeError, match=r"optax\.MultiSteps"):
        chained.init(p)
    # Not refused: the same transformation used directly, or inside a chain.
    loss_scaled(optax.sgd(1.0)).init(p)
    optax.chain(optax.identity(), loss_scaled(optax.sgd(1.0))).init(p)


def test_apply_if_finite_around_loss_scaled_is_refused_at_init():
    """apply_if_finite drops an overflowing step before loss_scaled sees it:
    the scale would never back off (the overflow repeats).  Refused at init,
    naming both fixes; inside loss_scaled it is fine."""
    p = {"w": jnp.zeros(3)}
    for wrapped in (
        optax.apply_if_finite(loss_scaled(optax.sgd(1.0)), max_consecutive_errors=3),
        optax.apply_if_finite(optax.chain(loss_scaled(optax.sgd(1.0))), 3),
    ):
        for init in (wrapped.init, jax.jit(wrapped.init)):
            with pytest.raises(TypeError, match=r"(?s)never backs off.*max_consecutive_overflows"):
                init(p)
    tx = loss_scaled(optax.apply_if_finite(optax.sgd(1.0), 3), jas.dynamic_scaler(8.0))
    st = tx.init(p)
    _, st = tx.update({"w": jnp.full(3, jnp.inf)}, st, p)
    assert float(st.scale) == 4.0 and int(st.skipped_steps) == 1


def test_multisteps_inside_updates_scale_per_micro_batch():
    """The documented other nesting: MultiSteps inside counts micro-batches."""
    tx = loss_scaled(
        optax.MultiSteps(optax.sgd(1.0), 2), jas.dynamic_scaler(4.0, growth_interval=2)
    )
    st = tx.init(jnp.zeros(2))
    for _ in range(2):
        _, st = tx.update(jnp.ones(2) * st.scale, st, jnp.zeros(2))
    assert float(st.scale) == 8.0  # grew after 2 micro-batches, not 2 steps


def test_trainer_accumulates():
    x, y = data(1, 2, seed=1)
    trainer = jas.Trainer(
        optax.chain(clip_grad_norm(None), optax.sgd(0.1)), jas.dynamic_scaler(64.0), accumulate=2
    )
    w = jnp.ones(3)
    st = trainer.init(w)
    step = jax.jit(trainer.step, static_argnums=3)

    def loss_fn(w, b):
        return lin_loss(w, b[0], b[1])

    w1, st, m = step(w, st, (x[0, 0], y[0, 0]), loss_fn)
    assert int(m["reason"]) == SkipReason.ACCUMULATING and not bool(m["skipped"])
    assert np.asarray(w1).tobytes() == np.asarray(w).tobytes()
    w2, st, m = step(w1, st, (x[0, 1], y[0, 1]), loss_fn)
    g = (jax.grad(loss_fn)(w, (x[0, 0], y[0, 0])) + jax.grad(loss_fn)(w, (x[0, 1], y[0, 1]))) / 2
    np.testing.assert_allclose(w2, w - 0.1 * g, rtol=1e-6)
    assert int(m["reason"]) == SkipReason.APPLIED
    assert float(m["grad_norm"]) == pytest.approx(float(jnp.linalg.norm(g)), rel=1e-6)


# ------------------------------------------------------- non-finite updates


def _divide_by_zero():
    # finite gradients in, inf/NaN updates out (adam's eps underflow, in small)
    return optax.GradientTransformation(
        lambda p: optax.EmptyState(), lambda g, s, p=None: (jax.tree.map(lambda x: x / 0.0, g), s)
    )


def test_nonfinite_update_is_skipped_with_its_own_reason():
    inner = optax.chain(optax.sgd(1.0, momentum=0.5), _divide_by_zero())
    tx = loss_scaled(inner, jas.dynamic_scaler(4.0), skip_nonfinite_updates=True)
    p = jnp.ones(2)
    st0 = tx.init(p)
    u, st = jax.jit(tx.update)(jnp.full(2, 4.0), st0, p)
    np.testing.assert_array_equal(u, np.zeros(2))
    assert int(st.skipped_steps) == 1  # skipped, and not for an overflow:
    assert not bool(st.found_inf) and float(st.scale) == 4.0  # the scale is not to blame
    np.testing.assert_array_equal(st.inner_state[0][0].trace, st0.inner_state[0][0].trace)


def test_nonfinite_update_default_on_for_float16_params_only():
    inner = _divide_by_zero()
    for dtype, skipped in ((jnp.float16, True), (jnp.float32, False)):
        tx = loss_scaled(inner, jas.no_op_scaler())
        p = jnp.ones(2, dtype)
        u, st = tx.update(jnp.ones(2, dtype), tx.init(p), p)
        assert bool(np.isfinite(np.asarray(u)).all()) == skipped
        assert int(st.skipped_steps) == int(skipped) and not bool(st.found_inf)


def test_new_params_overflowing_float16_are_caught():
    """A finite update that pushes a float16 parameter past 65504."""
    tx = loss_scaled(optax.sgd(-1.0), jas.no_op_scaler())  # ascent: p + g
    p = jnp.array([65000.0, 1.0], jnp.float16)
    u, st = tx.update(jnp.array([1000.0, 1.0], jnp.float16), tx.init(p), p)
    assert int(st.skipped_steps) == 1 and not bool(st.found_inf)
    assert np.isfinite(np.asarray(optax.apply_updates(p, u))).all()


def test_a_run_of_nonfinite_update_skips_warns_once_with_the_cause():
    """Issue 24's trap 1: float16 parameters with adam's eps=1e-8 skip every
    step; the guard says why, once, after 10 in a row."""
    tx = loss_scaled(optax.adam(1e-3), jas.no_op_scaler())
    p = jnp.ones(4, jnp.float16)
    st = tx.init(p)
    upd = jax.jit(tx.update)
    g = jnp.full(4, 1e-4, jnp.float16)  # squares underflow: nu == 0, eps == 0 in float16
    with pytest.warns(RuntimeWarning) as record:
        for _ in range(25):
            _, st = upd(g, st, p)
        jax.block_until_ready(st)
    msgs = [str(w.message) for w in record if "in a row were skipped" in str(w.message)]
    assert len(msgs) == 1
    assert "eps=1e-8" in msgs[0] and "get_policy('O2')" in msgs[0] and "eps >= 1e-4" in msgs[0]
    assert int(st.skipped_steps) == 25 and not bool(st.found_inf)
    with warnings.catch_warnings():  # a few skips in a row say nothing
        warnings.simplefilter("error")
        tx2 = loss_scaled(optax.adam(1e-3), jas.no_op_scaler())
        st2 = tx2.init(p)
        for _ in range(3):
            _, st2 = jax.jit(tx2.update)(g, st2, p)
        jax.block_until_ready(st2)


def test_trainer_reports_the_nonfinite_update_reason():
    tx = loss_scaled(_divide_by_zero(), jas.dynamic_scaler(4.0), skip_nonfinite_updates=True)
    trainer = jas.Trainer(tx)
    w = jnp.ones(2)
    w2, _, m = trainer.step(w, trainer.init(w), None, lambda w, b: jnp.sum(w))
    assert int(m["reason"]) == SkipReason.NONFINITE_UPDATE and bool(m["skipped"])
    assert not bool(m["found_inf"]) and np.asarray(w2).tobytes() == np.asarray(w).tobytes()


# ---------------------------------------------------------- runaway overflow


def test_consecutive_overflow_counter_under_jit_and_vmap():
    tx = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(2.0**10))
    upd = jax.jit(tx.update)
    st = tx.init(jnp.zeros(2))
    counts = []
    for g in (jnp.nan, INF, 1.0, jnp.nan):
        _, st = upd(jnp.full(2, g), st, jnp.zeros(2))
        counts.append(int(st.consecutive_overflows))
    assert counts == [1, 2, 0, 1]
    pop = jax.vmap(lambda g: tx.update(g, tx.init(jnp.zeros(2)), jnp.zeros(2))[1])
    st = pop(jnp.array([[1.0, 1.0], [INF, 1.0], [1.0, 1.0]]))
    np.testing.assert_array_equal(st.consecutive_overflows, [0, 1, 0])


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_max_consecutive_overflows_raises_under_jit(capfd, backend):
    # "auto": the native host report on CPU; "reference": jax.debug.callback.
    tx = loss_scaled(optax.sgd(1.0), max_consecutive_overflows=3, backend=backend)
    upd = jax.jit(tx.update)
    st = tx.init(jnp.zeros(2))
    for _ in range(2):
        _, st = upd(jnp.full(2, jnp.nan), st, jnp.zeros(2))
    jax.block_until_ready(st)
    jax.effects_barrier()
    assert int(st.consecutive_overflows) == 2
    # JAX raises a failed step as JaxRuntimeError, or as ValueError from its
    # C++ dispatch path (a cached jit call that ran inline).
    with pytest.raises(
        (jax.errors.JaxRuntimeError, ValueError),
        match=r"FloatingPointError: loss_scaled: 3 overflowing steps in a row reached "
        r"max_consecutive_overflows=3",
    ):
        _, st = upd(jnp.full(2, jnp.nan), st, jnp.zeros(2))
        jax.block_until_ready(st)
        jax.effects_barrier()
    # Issue 24's trap 5: the message is the first thing written, before JAX's
    # log of the failed callback and its traceback.
    err = capfd.readouterr().err
    assert err.lstrip().startswith("FloatingPointError: loss_scaled: 3 overflowing steps"), err[
        :300
    ]


def test_scale_reaching_zero_or_floor_warns():
    tx = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(2.0**-148))
    upd = jax.jit(tx.update)
    st = tx.init(jnp.zeros(1))
    with pytest.warns(RuntimeWarning, match="the scale is 0 after"):
        for _ in range(2):
            _, st = upd(jnp.full(1, jnp.nan), st, jnp.zeros(1))
        jax.block_until_ready(st)  # the report runs with the step
    assert float(st.scale) == 0.0
    tx = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(4.0, min_scale=2.0))
    st = tx.init(jnp.zeros(1))
    with pytest.warns(RuntimeWarning, match=r"floor min_scale=2"):
        _, st = jax.jit(tx.update)(jnp.full(1, jnp.nan), st, jnp.zeros(1))
        jax.block_until_ready(st)
    with warnings.catch_warnings():  # a plain finite step says nothing
        warnings.simplefilter("error")
        jax.block_until_ready(jax.jit(tx.update)(jnp.ones(1), st, jnp.zeros(1)))


@pytest.mark.parametrize("limit", [None, 1000])  # the native report; the callback's route
def test_zero_scale_warns_once_per_run(limit):
    # A zero scale never grows back, so every later step overflows; the
    # warning came on each of them, each with its own count, so Python's
    # default filter showed them all (84 in 84 steps).  Said once: on the
    # step the scale becomes 0, in each run that gets there.
    tx = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(2.0**-148), max_consecutive_overflows=limit)
    upd = jax.jit(tx.update)
    for _run in range(2):  # a second run of the same transformation is told again
        st = tx.init(jnp.zeros(1))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(22):  # 2**-148 -> 2**-149 -> 0, then 20 steps at 0
                _, st = upd(jnp.full(1, jnp.nan), st, jnp.zeros(1))
                jax.block_until_ready(st)
        zero = [str(w.message) for w in seen if "the scale is 0" in str(w.message)]
        assert float(st.scale) == 0.0 and int(st.consecutive_overflows) == 22
        assert len(zero) == 1, zero
        assert zero[0].startswith("loss_scaled: the scale is 0 after 2 overflowing steps")


def test_zero_scale_warning_per_member_of_a_population():
    # Under vmap each member that reaches 0 is told once, on its own step.
    tx = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(2.0**-148))
    other = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(2.0**-146))  # 0 two steps later
    upd = jax.jit(jax.vmap(tx.update))
    st = jax.tree.map(lambda *m: jnp.stack(m), tx.init(jnp.zeros(1)), other.init(jnp.zeros(1)))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(10):
            _, st = upd(jnp.full((2, 1), jnp.nan), st, jnp.zeros((2, 1)))
            jax.block_until_ready(st)
    zero = [str(w.message) for w in seen if "the scale is 0" in str(w.message)]
    np.testing.assert_array_equal(st.scale, [0.0, 0.0])
    assert [m.split(" overflowing")[0][-1] for m in zero] == ["2", "4"], zero


def test_host_reports_off_for_jax_export():
    """Host reports cannot be serialized: host_reports=False exports
    (serialized and deserialized; tests/public/test_export.py runs it in a fresh
    process)."""
    from jax import export

    from jax_amp_scale import export as jas_export
    from tests.fixtures.make_export_fixtures import register_optax_states

    register_optax_states()  # sgd's EmptyState, by name
    tx = loss_scaled(optax.sgd(1.0), backend="reference", host_reports=False)
    st = tx.init(jnp.zeros(3))
    blob = jas_export.export(tx.update)(jnp.ones(3), st, jnp.zeros(3)).serialize()
    u, st2 = jas_export.deserialize(blob).call(jnp.full(3, jnp.inf), st, jnp.zeros(3))
    np.testing.assert_array_equal(u, np.zeros(3))
    assert bool(st2.found_inf) and int(st2.skipped_steps) == 1
    assert int(st2.consecutive_overflows) == 1
    # jax.export's own error (NotImplementedError here) says what it cannot do;
    # the library's export says ValueError and what to change, on every route.
    with pytest.raises(NotImplementedError):
        export.export(jax.jit(loss_scaled(optax.sgd(1.0), backend="reference").update))(
            jnp.ones(3), st, jnp.zeros(3)
        )
    for backend in ("reference", "auto"):
        tx = loss_scaled(optax.sgd(1.0), backend=backend)
        with pytest.raises(ValueError, match="host_reports=False"):
            jas_export.export(tx.update)(jnp.ones(3), st, jnp.zeros(3))
    with pytest.raises(ValueError, match="max_consecutive_overflows needs host_reports=True"):
        loss_scaled(optax.sgd(1.0), max_consecutive_overflows=3, host_reports=False)


# --------------------------------------------------------------- torch port


def _torch_grads(scale, grads):
    params = [torch.zeros(g.shape, requires_grad=True) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = torch.from_numpy(np.asarray(g, np.float32) * np.float32(scale))
    return params


def test_clip_grad_norm_matches_torch_unscale_then_clip():
    rng = np.random.default_rng(3)
    grads = [
        rng.standard_normal((4, 3)).astype(np.float32) * 3,
        rng.standard_normal(5).astype(np.float32),
    ]
    params = _torch_grads(1024.0, grads)
    opt = torch.optim.SGD(params, lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # the scale tensor is created lazily
    scaler.unscale_(opt)
    t_norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))

    tx = loss_scaled(optax.chain(clip_grad_norm(1.0), optax.sgd(1.0)), jas.dynamic_scaler(1024.0))
    scaled = [jnp.asarray(g) * 1024.0 for g in grads]
    u, st = tx.update(scaled, tx.init(scaled), scaled)
    assert float(st.inner_state[0].norm) == pytest.approx(t_norm, rel=1e-6)
    for a, p in zip(u, params, strict=True):
        np.testing.assert_allclose(-np.asarray(a), p.grad.numpy(), rtol=1e-6)
    # the helper, for the core API
    clipped, norm = jas.clip_by_global_norm([jnp.asarray(g) for g in grads], 1.0)
    assert float(norm) == pytest.approx(t_norm, rel=1e-6)
    for a, p in zip(clipped, params, strict=True):
        np.testing.assert_allclose(np.asarray(a), p.grad.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="max_norm must be a finite float > 0"):
        clip_grad_norm(-1.0)
    with pytest.raises(TypeError, match="max_norm must be a float > 0"):
        clip_grad_norm("1")


def test_two_optimizers_share_one_scale_like_torch():
    """torch's multiple-optimizer scenario: opt A steps where opt B's
    gradients overflowed; the scale backs off once for both."""
    rng = np.random.default_rng(4)
    steps = [
        (rng.standard_normal(3).astype(np.float32), rng.standard_normal(2).astype(np.float32))
        for _ in range(5)
    ]
    bad_b = {1, 3}
    bad_a = {3}
    ta, tb = torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)
    oa = torch.optim.SGD([ta], lr=0.1, momentum=0.9)
    ob = torch.optim.Adam([tb], lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2)
    for t, (ga, gb) in enumerate(steps):
        scaler.scale(torch.ones(()))  # the scale tensor is created lazily
        s = scaler.get_scale()
        ta.grad = torch.from_numpy(ga * np.float32(s))
        tb.grad = torch.from_numpy(gb * np.float32(s))
        if t in bad_a:
            ta.grad[1] = INF
        if t in bad_b:
            tb.grad[0] = float("nan")
        scaler.unscale_(oa)
        torch.nn.utils.clip_grad_norm_([ta], 1.0)
        scaler.step(oa)
        scaler.step(ob)
        scaler.update()

    txa, txb = optax.sgd(0.1, momentum=0.9), optax.adam(0.01)
    params = {"a": jnp.zeros(3), "b": jnp.zeros(2)}
    sa, sb = txa.init(params["a"]), txb.init(params["b"])
    kind = jas.dynamic_scaler(256.0, growth_interval=2)

    @jax.jit
    def step(params, sa, sb, kind, ga, gb, bad_a, bad_b):
        s = kind.scale
        ga = (ga * s).at[1].set(jnp.where(bad_a, jnp.inf, ga[1] * s))
        gb = (gb * s).at[0].set(jnp.where(bad_b, jnp.nan, gb[0] * s))
        ga, found_a = jas.unscale_and_check(ga, kind)  # scaler.unscale_(opt_a)
        gb, found_b = jas.unscale_and_check(gb, kind)
        ga, _ = jas.clip_by_global_norm(ga, 1.0)
        a, sa = optimizer_step(txa, ga, sa, params["a"], found_a)  # scaler.step(opt_a)
        b, sb = optimizer_step(txb, gb, sb, params["b"], found_b)
        return {"a": a, "b": b}, sa, sb, kind.update(found_a | found_b)  # scaler.update()

    for t, (ga, gb) in enumerate(steps):
        params, sa, sb, kind = step(params, sa, sb, kind, ga, gb, t in bad_a, t in bad_b)
    np.testing.assert_allclose(params["a"], ta.detach().numpy(), rtol=1e-6, atol=1e-8)
    # optax's and torch's adam round differently (bias correction, eps): ~1e-5;
    # a wrong skip would move b by about the learning rate, 1e-2
    np.testing.assert_allclose(params["b"], tb.detach().numpy(), rtol=1e-4, atol=1e-7)
    assert float(kind.scale) == scaler.get_scale()
    assert int(sb[0].count) == 3  # adam skipped its two overflow steps


def test_optimizer_step_skip_keeps_bits():
    p = {"w": jnp.array([-0.0, 1.0])}
    tx = optax.adam(0.1)
    st = tx.update({"w": jnp.ones(2)}, tx.init(p), p)[1]
    new_p, new_st = jax.jit(lambda *a: optimizer_step(tx, *a))({"w": jnp.ones(2)}, st, p, True)
    assert np.asarray(new_p["w"]).tobytes() == np.asarray(p["w"]).tobytes()
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), new_st, st)
    with pytest.raises(ValueError, match="found_inf must be a scalar"):
        optimizer_step(tx, {"w": jnp.ones(2)}, st, p, jnp.array([True, False]))
    with pytest.raises(TypeError, match="tx must be an optax"):
        optimizer_step(lambda g: g, {"w": jnp.ones(2)}, st, p, False)


# -------------------------------------------------------------- error paths


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_python_scalar_in_inner_state(backend):
    t = optax.GradientTransformation(lambda p: {"foo": 1}, lambda g, s, p=None: (g, s))
    tx = loss_scaled(optax.chain(optax.sgd(1.0), t), backend=backend)
    st = tx.init(jnp.zeros(3))
    u, st = tx.update(jnp.ones(3), st, jnp.zeros(3))
    np.testing.assert_array_equal(u, np.full(3, -(2.0**-16), np.float32))
    u, st = tx.update(jnp.full(3, jnp.inf), st, jnp.zeros(3))
    assert int(st.inner_state[1]["foo"]) == 1 and int(st.skipped_steps) == 1


def test_value_and_grad_tuple_without_has_aux():
    fn = jas.value_and_grad(lambda w: (jnp.sum(w), {"n": 1}), jas.dynamic_scaler())
    with pytest.raises(
        TypeError, match=r"fun returned a tuple of 2 items, not a scalar loss; pass has_aux=True"
    ):
        fn(jnp.ones(2))
    with pytest.raises(TypeError, match=r"fun returned a tuple .* has_aux=True"):
        jax.jit(fn)(jnp.ones(2))


def test_nonfinite_paths_on_gradients_says_what_to_call():
    grads = {"w": jnp.array([1.0, jnp.inf])}
    with pytest.raises(
        TypeError, match=r"at \['w'\]: call nonfinite_paths\(nonfinite_leaves\(grads\)\)"
    ):
        jas.nonfinite_paths(grads)
    assert jas.nonfinite_paths(jas.nonfinite_leaves(grads)) == ["['w']"]


def test_trainer_without_optax_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "optax", None)
    monkeypatch.delitem(sys.modules, "jax_amp_scale.training.loss_scaled")
    monkeypatch.delitem(sys.modules, "jax_amp_scale.training.pieces", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"Trainer needs optax .*pip install optax"):
        jas.Trainer(None)


def test_update_scale_on_wrappers_says_what_to_use():
    tx = loss_scaled(optax.sgd(1.0))
    st = tx.init(jnp.zeros(1))
    with pytest.raises(
        TypeError,
        match=r"LossScaledState; take the ScaleState out with jax_amp_scale.find_scale_state",
    ):
        jas.update_scale(st, False)
    with pytest.raises(
        TypeError, match=r"DynamicScaler; a scaler advances with its own .update\(found_inf\)"
    ):
        jas.update_scale(jas.dynamic_scaler(), False)
    assert float(jas.update_scale(jas.find_scale_state(st), True).scale) == 2.0**15


def test_inverted_factors_warn():
    with pytest.warns(UserWarning, match=r"backoff_factor=2.0 >= 1 .* use a value in \(0, 1\)"):
        jas.dynamic_scaler(backoff_factor=2.0)
    with pytest.warns(UserWarning, match=r"growth_factor=0.5 <= 1 .* use a value > 1"):
        jas.dynamic_scaler(growth_factor=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jas.dynamic_scaler()
        jas.init_scale_state(1.0, 0.5, 2.0, 10)  # the operator itself stays silent


def test_no_op_unscale_returns_the_tree_itself():
    t = {"a": jnp.ones(2), "b": [jnp.zeros(1)]}
    kind = jas.no_op_scaler()
    assert kind.unscale(t) is t and kind.scale_loss(t) is t


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        (
            {"max_consecutive_overflows": 0},
            ValueError,
            "max_consecutive_overflows must be an int >= 1 or None",
        ),
        ({"skip_nonfinite_updates": "yes"}, TypeError, "skip_nonfinite_updates"),
        ({"host_reports": 1}, TypeError, "host_reports"),
    ],
)
def test_loss_scaled_bad_options(kwargs, err, match):
    with pytest.raises(err, match=match):
        loss_scaled(optax.sgd(1.0), **kwargs)


@pytest.mark.parametrize(
    "k, err, match",
    [(0, ValueError, "k must be an int >= 1"), (2.0, TypeError, "k must be an int >= 1")],
)
def test_accumulate_bad_k(k, err, match):
    with pytest.raises(err, match=match):
        accumulate_gradients(loss_scaled(optax.sgd(1.0)), k)
    with pytest.raises(err, match="accumulate must be an int >= 1"):
        jas.Trainer(optax.sgd(1.0), accumulate=k)


def test_trainer_options_moved_to_the_pieces():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'clip_grad_norm'"):
        jas.Trainer(optax.sgd(1.0), clip_grad_norm=1.0)
    tx = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(8.0), max_consecutive_overflows=2)
    trainer = jas.Trainer(tx)  # a loss-scaled optimizer is used as it is
    assert trainer.tx is tx
    with pytest.raises(ValueError, match="already loss-scaled"):
        jas.Trainer(tx, jas.dynamic_scaler())
    acc = accumulate_gradients(tx, 2)
    assert jas.Trainer(acc).tx is acc
    # accumulation of a plain optimizer is not loss-scaled: Trainer wraps it
    plain = accumulate_gradients(optax.sgd(1.0), 2)
    assert jas.Trainer(plain).tx is not plain


def _reductions(fn, *args):
    import re

    text = jax.jit(fn).lower(*args).compile().as_text()
    return len(re.findall(r" reduce\(", text))


def test_default_step_adds_no_pass_over_the_leaves():
    """The new features cost nothing by default: the default step has the
    reductions of the unscale-and-check pass alone; the gradient norm and
    the non-finite update check add one per leaf only when asked."""
    params = [jnp.ones((16, 16)) * i for i in range(12)]
    kind = jas.dynamic_scaler()
    check_only = _reductions(lambda g: jas.unscale_and_check(g, kind), params)
    counts = {}
    for name, kw in {
        "default": {},
        "grad_norm": {"norm": True},
        "nonfinite": {"skip_nonfinite_updates": True},
    }.items():
        inner = optax.adam(1e-3)
        if kw.pop("norm", False):
            inner = optax.chain(clip_grad_norm(None), inner)
        tx = loss_scaled(inner, kind, **kw)
        counts[name] = _reductions(tx.update, params, tx.init(params), params)
    assert counts["default"] == check_only
    assert counts["grad_norm"] >= check_only + len(params)
    assert counts["nonfinite"] >= check_only + len(params)
