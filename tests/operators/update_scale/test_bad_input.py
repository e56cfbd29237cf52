"""The bad-input matrix: clear TypeError/ValueError naming the argument, at trace time."""

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jax_amp_scale as jas
from tests.jax_compat import LOWERS_EVERY_BRANCH, export_for

GOOD = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=2000)


def call(scale=None, tracker=None, found=False, backend="reference", **overrides):
    scale = jnp.float32(1.0) if scale is None else scale
    tracker = jnp.int32(0) if tracker is None else tracker
    kw = {**GOOD, **overrides}
    return jas.amp_update_scale(scale, tracker, found, backend=backend, **kw)


@pytest.mark.parametrize("backend", ["reference", "ffi", "auto"])
@pytest.mark.parametrize(
    "value, exc, match",
    [
        (0, ValueError, r"growth_interval must be an int in \[1, 2147483647\]"),
        (-3, ValueError, "growth_interval"),
        (2**31, ValueError, "growth_interval"),
        (2.0, TypeError, "growth_interval must be an int in"),
        (True, TypeError, "growth_interval"),
        ("10", TypeError, "growth_interval"),
        (jnp.int32(5), TypeError, "growth_interval must be a Python int"),
    ],
)
def test_growth_interval(backend, value, exc, match):
    with pytest.raises(exc, match=match):
        call(growth_interval=value, backend=backend)


@pytest.mark.parametrize("name", ["growth_factor", "backoff_factor"])
@pytest.mark.parametrize(
    "value, exc",
    [
        (0.0, ValueError),
        (-2.0, ValueError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        ("2", TypeError),
        (None, TypeError),
        (True, TypeError),
        (jnp.float32(2.0), TypeError),
    ],
)
def test_factors(name, value, exc):
    with pytest.raises(exc, match=name):
        call(**{name: value})


def test_traced_factor_is_rejected_at_trace_time():
    @jax.jit
    def f(gf):
        return call(growth_factor=gf)

    with pytest.raises(TypeError, match="growth_factor must be a Python number"):
        f(2.0)


def test_numpy_scalars_are_accepted_as_attributes():
    s, t = call(growth_factor=np.float64(2.0), growth_interval=np.int64(1))
    assert float(s) == 2.0 and int(t) == 0


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.int32, jnp.bool_, np.float64])
def test_scale_dtype(dtype):
    with pytest.raises(TypeError, match="current_scale must be float32, float16 or bfloat16"):
        call(scale=np.ones((), dtype))


def test_scale_python_float_rejected():
    with pytest.raises(TypeError, match="current_scale"):
        call(scale=1.0)


@pytest.mark.parametrize("dtype", [jnp.int16, jnp.uint32, jnp.float32, np.int64])
def test_tracker_dtype(dtype):
    with pytest.raises(TypeError, match="growth_tracker must be an int32"):
        call(tracker=np.zeros((), dtype))


@pytest.mark.parametrize("shape", [(2,), (1, 1), (3, 4)])
def test_scale_shape(shape):
    with pytest.raises(ValueError, match=r"current_scale must have shape \(\) or \(1,\)"):
        call(scale=jnp.ones(shape, jnp.float32), tracker=jnp.zeros(shape, jnp.int32))


def test_mismatched_shapes():
    with pytest.raises(ValueError, match="growth_tracker must have the shape of the scale"):
        call(scale=jnp.ones((1,), jnp.float32), tracker=jnp.int32(0))


@pytest.mark.parametrize(
    "found, exc, match",
    [
        (jnp.zeros((2,)), ValueError, "found_inf must be a scalar"),
        (np.zeros((1, 1)), ValueError, "found_inf must be a scalar"),
        ("yes", TypeError, "found_inf must be a bool, int or float"),
        (None, TypeError, "found_inf"),
        (1j, TypeError, "found_inf"),
        (jnp.complex64(1), TypeError, "found_inf must have a bool, integer or float dtype"),
    ],
)
def test_found_inf(found, exc, match):
    with pytest.raises(exc, match=match):
        call(found=found)


def test_backend_name():
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'reference', 'ffi'\)"):
        call(backend="npu")


def test_update_scale_requires_state():
    with pytest.raises(TypeError, match="state must be a ScaleState"):
        jas.update_scale({"scale": 1.0}, False)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(init_scale=2.0**16, dtype=jnp.float16), ValueError, "not finite in float16"),
        (dict(init_scale=0.0), ValueError, "init_scale"),
        (dict(dtype=jnp.float64), TypeError, "dtype must be float32, float16 or bfloat16"),
        (dict(dtype="int8"), TypeError, "dtype"),
        (dict(shape=(2,)), ValueError, r"shape must be \(\) or \(1,\)"),
        (dict(growth_interval=0), ValueError, "growth_interval"),
        (dict(backoff_factor=-1.0), ValueError, "backoff_factor"),
    ],
)
def test_init_scale_state(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        jas.init_scale_state(**kwargs)


def test_ffi_on_platform_without_handler_fails_clearly():
    """Lowering backend='ffi' for a platform with no handler names it."""
    st = jas.init_scale_state()
    with pytest.raises(
        NotImplementedError,
        match=r"backend='ffi' has no native handler for platform 'tpu' \(handlers: .*cpu.*\)\. "
        r"Use backend='reference' or 'auto'",
    ):
        export.export(
            jax.jit(lambda s: jas.update_scale(s, False, backend="ffi")), platforms=["tpu"]
        )(st)


def test_reference_and_auto_lower_for_other_platforms():
    st = jas.init_scale_state()
    for backend in ("reference", "auto"):
        exp = export_for(
            lambda s, b=backend: jas.update_scale(s, False, backend=b), ["tpu", "cuda"], st
        )
        if backend == "reference" or not LOWERS_EVERY_BRANCH:
            assert "jas_update_scale" not in exp.mlir_module()


# What a failing native handler raises at run time (XlaRuntimeError before
# jax exposed it as jax.errors.JaxRuntimeError).
RUNTIME_ERROR = (
    getattr(jax.errors, "JaxRuntimeError", None)
    or __import__("jaxlib.xla_extension", fromlist=["XlaRuntimeError"]).XlaRuntimeError
)


class TestNativeHandlerChecks:
    """The handler re-checks what it receives and returns an error, never crashes."""

    def _raw(self, *args, **attrs):
        from jax_amp_scale.mechanisms import handlers

        # The handler registers at first use: make sure it is, and call it by
        # the name the native module defines.
        target = handlers.target("update_scale")
        assert "cpu" in handlers.platforms("update_scale")
        outs = (
            jax.ShapeDtypeStruct(args[0].shape, args[0].dtype),
            jax.ShapeDtypeStruct(args[1].shape, args[1].dtype),
        )
        return jax.jit(lambda *a: jax.ffi.ffi_call(target, outs)(*a, **attrs))(*args)

    ATTRS: ClassVar[dict] = dict(
        growth_factor=np.float64(2.0),
        backoff_factor=np.float64(0.5),
        growth_interval=np.int64(3),
        rule="torch",
    )

    def test_bad_interval_attribute(self):
        attrs = {**self.ATTRS, "growth_interval": np.int64(0)}
        with pytest.raises(RUNTIME_ERROR, match=r"growth_interval must lie in \[1, 2147483647\]"):
            self._raw(jnp.ones((1,)), jnp.zeros((1,), jnp.int32), jnp.zeros((1,)), **attrs)

    def test_bad_factor_attribute(self):
        attrs = {**self.ATTRS, "backoff_factor": np.float64(np.nan)}
        with pytest.raises(RUNTIME_ERROR, match="backoff_factor must be a finite number > 0"):
            self._raw(jnp.ones((1,)), jnp.zeros((1,), jnp.int32), jnp.zeros((1,)), **attrs)

    def test_bad_scale_dtype(self):
        with pytest.raises(
            RUNTIME_ERROR, match="current_scale must be float32, float16 or bfloat16"
        ):
            self._raw(
                jnp.ones((1,), jnp.int32), jnp.zeros((1,), jnp.int32), jnp.zeros((1,)), **self.ATTRS
            )

    def test_found_inf_dtype_mismatch(self):
        with pytest.raises(RUNTIME_ERROR, match="found_inf must have the dtype of current_scale"):
            self._raw(
                jnp.ones((1,)), jnp.zeros((1,), jnp.int32), jnp.zeros((1,), jnp.bool_), **self.ATTRS
            )

    def test_tracker_dtype(self):
        with pytest.raises(RUNTIME_ERROR, match="growth_tracker must be int32"):
            self._raw(jnp.ones((1,)), jnp.zeros((1,)), jnp.zeros((1,)), **self.ATTRS)

    def test_element_count_mismatch(self):
        with pytest.raises(RUNTIME_ERROR, match="same number of elements"):
            self._raw(jnp.ones((2,)), jnp.zeros((2,), jnp.int32), jnp.zeros((1,)), **self.ATTRS)

    def test_missing_attribute(self):
        # XLA's attribute decoding rejects the call before the handler runs.
        with pytest.raises(RUNTIME_ERROR, match="Wrong number of attributes"):
            self._raw(
                jnp.ones((1,)),
                jnp.zeros((1,), jnp.int32),
                jnp.zeros((1,)),
                growth_factor=np.float64(2.0),
                backoff_factor=np.float64(0.5),
            )
