"""The host report: a Python function run from inside a jitted step.

On CPU it is the native custom call ``jas_host_report_v1``
(ffi/host_report.cc), so a step that reports keeps JAX's fast dispatch
path (a ``jax.debug.callback`` anywhere in a program sends every call of it
through JAX's synchronous Python path: bench/RESULTS.md).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale.mechanisms import handlers
from jax_amp_scale.operators.host_report import host_report
from jax_amp_scale.optax import loss_scaled

# JAX raises a failed call as JaxRuntimeError, or as ValueError from its C++
# dispatch path (a cached jit call that ran inline).
FAILED = (jax.errors.JaxRuntimeError, ValueError)
TARGET = "jas_host_report_v1"
CALLBACK = "xla_ffi_python_cpu_callback"


def _native() -> bool:
    return "cpu" in handlers.platforms("host_report")


needs_native = pytest.mark.skipif(not _native(), reason="the native CPU module is not loaded here")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[np.ndarray, ...]] = []

    def __call__(self, *arrays: np.ndarray) -> None:
        self.calls.append(arrays)


def _hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


@needs_native
def test_runs_the_function_only_on_flagged_calls_with_its_values():
    rec = Recorder()

    @jax.jit
    def f(flag, x, n):
        return host_report(rec, flag, x, n)

    out = f(jnp.bool_(False), jnp.float32(2.5), jnp.int32(7))
    assert not bool(out) and rec.calls == []
    out = jax.block_until_ready(f(jnp.bool_(True), jnp.float32(2.5), jnp.int32(7)))
    assert bool(out)
    assert len(rec.calls) == 1
    flag, x, n = rec.calls[0]
    assert flag.dtype == np.bool_ and flag.tolist() == [True]
    assert x.tolist() == [2.5] and n.tolist() == [7]  # flat, one element each
    # float16 values arrive widened to float32 (exactly), bool as bool.
    f16 = jax.jit(lambda: host_report(rec, True, jnp.float16(0.1), jnp.bool_(True)))
    jax.block_until_ready(f16())
    assert rec.calls[-1][1].tolist() == [float(np.float16(0.1))]
    assert rec.calls[-1][2].tolist() == [True]


@needs_native
def test_under_vmap_one_call_sees_every_lane():
    rec = Recorder()
    f = jax.jit(jax.vmap(lambda flag, x: host_report(rec, flag, x)))
    out = jax.block_until_ready(f(jnp.array([False, True, False]), jnp.arange(3.0)))
    np.testing.assert_array_equal(out, [False, True, False])
    assert len(rec.calls) == 1
    flag, x = rec.calls[0]
    assert flag.tolist() == [False, True, False] and x.tolist() == [0.0, 1.0, 2.0]
    jax.block_until_ready(f(jnp.zeros(3, bool), jnp.arange(3.0)))
    assert len(rec.calls) == 1  # no lane flagged: no call


@needs_native
def test_an_exception_becomes_the_steps_error_with_its_message():
    def fails(*_: np.ndarray) -> None:
        raise ZeroDivisionError("the report's own message")

    f = jax.jit(lambda flag: host_report(fails, flag))
    jax.block_until_ready(f(jnp.bool_(False)))  # not flagged: nothing raised
    with pytest.raises(FAILED, match="ZeroDivisionError: the report's own message"):
        jax.block_until_ready(f(jnp.bool_(True)))


@needs_native
def test_the_handler_checks_its_operands():
    target = handlers.target("host_report")

    def call(*operands, shape=()):
        out = jax.ShapeDtypeStruct(shape, jnp.bool_)
        fn = jax.ffi.ffi_call(target, out)
        return jax.block_until_ready(jax.jit(lambda *a: fn(*a, report=np.int64(1)))(*operands))

    with pytest.raises(FAILED, match="report operand 0 must be bool, got float32"):
        call(jnp.float32(1))
    with pytest.raises(
        FAILED, match="report operand 1 must be bool, float32 or int32, got float16"
    ):
        call(jnp.bool_(True), jnp.float16(1))
    with pytest.raises(FAILED, match="the report's result must be the flag's shape"):
        call(jnp.bool_(True), shape=(2,))
    with pytest.raises(FAILED, match="LookupError: no host report 123456789"):
        fn = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((), jnp.bool_))
        jax.block_until_ready(jax.jit(lambda f: fn(f, report=np.int64(123456789)))(True))


@pytest.mark.slow
@pytest.mark.trimmed
@needs_native
def test_loss_scaled_reports_without_a_host_callback_on_cpu():
    tx = loss_scaled(optax.adam(1e-3))
    p = jnp.ones(3)
    hlo = _hlo(tx.update, p, tx.init(p), p)
    assert TARGET in hlo and CALLBACK not in hlo
    # max_consecutive_overflows' error takes the callback (one exception type
    # whatever JAX's dispatch path: tests/training/loss_scaled/test_accumulate_and_guards.py).
    tx = loss_scaled(optax.adam(1e-3), max_consecutive_overflows=5)
    hlo = _hlo(tx.update, p, tx.init(p), p)
    assert CALLBACK in hlo
    # backend="reference" is pure JAX throughout: the reports are callbacks.
    tx = loss_scaled(optax.adam(1e-3), max_consecutive_overflows=5, backend="reference")
    hlo = _hlo(tx.update, p, tx.init(p), p)
    assert TARGET not in hlo and CALLBACK in hlo
    # The guard's report too (float16 parameters turn it on).
    tx = loss_scaled(optax.adam(1e-3), jas.no_op_scaler(), skip_nonfinite_updates=True)
    p16 = jnp.ones(3, jnp.float16)
    hlo = _hlo(tx.update, p16, tx.init(p16), p16)
    assert TARGET in hlo and CALLBACK not in hlo


def test_the_callback_route_makes_no_host_call_on_an_unflagged_step():
    """Off the native route the report is a jax.debug.callback inside a
    branch taken only when the flag has a true element (no device-to-host
    trip on the other steps)."""
    rec = Recorder()
    f = lambda flag, x: host_report(rec, flag, x, backend="reference")  # noqa: E731
    hlo = _hlo(f, jnp.bool_(False), jnp.float32(1))
    entry = hlo[hlo.index("ENTRY") :].split("\n}\n")[0]
    assert CALLBACK in hlo and CALLBACK not in entry and " conditional(" in entry
    jax.block_until_ready(jax.jit(f)(jnp.bool_(False), jnp.float32(1)))
    jax.effects_barrier()
    assert rec.calls == []
    jax.block_until_ready(jax.jit(f)(jnp.bool_(True), jnp.float32(1)))
    jax.effects_barrier()
    assert [c[1].tolist() for c in rec.calls] == [[1.0]]


@needs_native
def test_export_of_a_step_with_reports_says_what_to_change():
    from jax_amp_scale import export as jas_export

    tx = loss_scaled(optax.sgd(1.0))
    p = jnp.zeros(3)
    # jax < 0.7 lowers the callback branch too and trips its own check first:
    # ValueError whichever it is.
    with pytest.raises(
        ValueError,
        match=r"(?s)host_reports=False.*(jas_host_report_v1|host_callbacks is not yet)",
    ):
        jas_export.export(tx.update)(p, tx.init(p), p)


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_the_reports_say_the_same_on_both_routes(backend):
    """A scale that backs off to its floor warns once, however many steps
    overflow there, natively and by callback; a finite step says nothing."""
    tx = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(4.0, min_scale=1.0), backend=backend)
    upd = jax.jit(tx.update)
    st = tx.init(jnp.zeros(2))
    with pytest.warns(RuntimeWarning, match=r"floor min_scale=1") as record:
        warnings.simplefilter("always")  # Python's own filter would hide repeats
        for _ in range(6):
            _, st = upd(jnp.full(2, jnp.inf), st, jnp.zeros(2))
        jax.block_until_ready(st)
        jax.effects_barrier()
    assert float(st.scale) == 1.0 and int(st.consecutive_overflows) == 6
    assert sum("floor" in str(w.message) for w in record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.block_until_ready(upd(jnp.ones(2), st, jnp.zeros(2)))
        jax.effects_barrier()


@pytest.mark.slow
@pytest.mark.trimmed
def test_a_thousand_steps_with_reports_on_agree_with_reports_off():
    """The report changes nothing in the step: a long run with host reports
    gives the bits of the same run without them (overflows included)."""
    grads = jax.random.normal(jax.random.PRNGKey(0), (1000, 4)) * 1e3
    grads = grads.at[::37].set(jnp.inf)  # an overflow every 37 steps

    def run(host_reports: bool):
        tx = loss_scaled(optax.adam(1e-2), host_reports=host_reports)
        p = jnp.zeros(4)

        def body(carry, g):
            p, st = carry
            u, st = tx.update(g * st.scale, st, p)
            return (optax.apply_updates(p, u), st), None

        (p, st), _ = jax.jit(lambda c: jax.lax.scan(body, c, grads))((p, tx.init(p)))
        return p, st

    p_on, st_on = run(True)
    p_off, st_off = run(False)
    assert np.asarray(p_on).tobytes() == np.asarray(p_off).tobytes()
    assert int(st_on.skipped_steps) == int(st_off.skipped_steps) == 28
    assert float(st_on.scale) == float(st_off.scale)
