"""ScaleState and update_scale under jit, vmap, scan, grad, donation, device_put."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_amp_scale as jas
from tests.jax_compat import LOWERS_EVERY_BRANCH

BACKENDS = ["reference", "ffi", "auto"]


def custom_state():
    return jas.init_scale_state(
        1024.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=7, dtype=jnp.bfloat16
    )


def assert_same_state(a, b):
    assert type(a) is type(b)
    assert (a.growth_factor, a.backoff_factor, a.growth_interval) == (
        b.growth_factor,
        b.backoff_factor,
        b.growth_interval,
    )
    assert a.scale.dtype == b.scale.dtype and a.scale.shape == b.scale.shape
    np.testing.assert_array_equal(np.asarray(a.scale), np.asarray(b.scale))
    np.testing.assert_array_equal(np.asarray(a.growth_tracker), np.asarray(b.growth_tracker))


class TestPytree:
    def test_leaves_and_static_fields(self):
        st = custom_state()
        leaves, treedef = jax.tree_util.tree_flatten(st)
        assert len(leaves) == 2
        assert leaves[0].dtype == jnp.bfloat16 and leaves[1].dtype == jnp.int32
        assert_same_state(jax.tree_util.tree_unflatten(treedef, leaves), st)

    def test_every_field_survives_jit(self):
        st = custom_state()
        assert_same_state(jax.jit(lambda s: s)(st), st)

    def test_tree_map(self):
        st = custom_state()
        doubled = jax.tree.map(lambda x: x * 2, st)
        assert doubled.growth_interval == 7 and doubled.growth_factor == 3.0
        assert float(doubled.scale) == 2048.0

    def test_device_put(self):
        st = custom_state()
        assert_same_state(jax.device_put(st, jax.devices("cpu")[0]), st)

    def test_static_fields_are_in_the_treedef(self):
        # Different attributes -> different treedefs -> a recompile, as FFI
        # attributes must be compile-time constants.
        a = jax.tree_util.tree_structure(jas.init_scale_state(growth_interval=3))
        b = jax.tree_util.tree_structure(jas.init_scale_state(growth_interval=4))
        assert a != b

    def test_frozen(self):
        st = jas.init_scale_state()
        with pytest.raises(AttributeError):
            st.growth_interval = 3  # type: ignore[misc]


@pytest.mark.parametrize("backend", BACKENDS)
def test_jit_with_donation(backend):
    st = jas.init_scale_state(8.0, growth_interval=2, shape=(1,))
    step = jax.jit(lambda s, f: jas.update_scale(s, f, backend=backend), donate_argnums=0)
    first = step(st, False)
    # Donated: the input buffers are gone, and the program reuses them.
    assert st.scale.is_deleted() and st.growth_tracker.is_deleted()
    assert not first.scale.is_deleted()
    hlo = step.lower(first, False).compile().as_text()
    assert "input_output_alias" in hlo
    second = step(first, False)
    assert first.scale.is_deleted()
    assert float(second.scale[0]) == 16.0 and int(second.growth_tracker[0]) == 0


def test_ffi_call_is_in_place():
    """The custom call aliases its outputs to the scale and tracker inputs."""
    st = jas.init_scale_state(shape=(1,))
    lowered = jax.jit(lambda s: jas.update_scale(s, True, backend="ffi"), donate_argnums=0).lower(
        st
    )
    hlo = lowered.compile().as_text()
    assert "jas_update_scale" in hlo
    assert "output_to_operand_aliasing" in hlo


@pytest.mark.parametrize("backend", ["reference", "ffi"])
def test_vmap_population(backend):
    """A batch of independent states: each follows its own trajectory."""
    n = 16
    scales = jnp.asarray(2.0 ** np.arange(n), jnp.float32)
    trackers = jnp.arange(n, dtype=jnp.int32)
    found = jnp.asarray(np.arange(n) % 3 == 0)
    f = jax.jit(
        jax.vmap(
            lambda s, t, fi: jas.amp_update_scale(
                s,
                t,
                fi,
                growth_factor=2.0,
                backoff_factor=0.5,
                growth_interval=5,
                backend=backend,
            )
        )
    )
    s, t = f(scales, trackers, found)
    for i in range(n):
        if i % 3 == 0:
            assert float(s[i]) == 2.0**i / 2 and int(t[i]) == 0
        elif i + 1 == 5:
            assert float(s[i]) == 2.0**i * 2 and int(t[i]) == 0
        else:
            assert float(s[i]) == 2.0**i and int(t[i]) == i + 1


def test_vmapped_ffi_is_one_custom_call():
    f = jax.jit(
        jax.vmap(
            lambda s, t, fi: jas.amp_update_scale(
                s, t, fi, growth_factor=2.0, backoff_factor=0.5, growth_interval=5, backend="ffi"
            )
        )
    )
    args = (jnp.ones(1024), jnp.zeros(1024, jnp.int32), jnp.zeros(1024, bool))
    hlo = f.lower(*args).compile().as_text()
    assert hlo.count('custom_call_target="jas_update_scale_v2"') == 1
    assert "while" not in hlo  # not a sequential loop


@pytest.mark.parametrize("backend", ["reference", "ffi"])
def test_vmap_with_unbatched_state(backend):
    st = jas.init_scale_state(8.0, growth_interval=1)
    f = jax.vmap(lambda fi: jas.update_scale(st, fi, backend=backend).scale)
    out = f(jnp.array([True, False]))
    np.testing.assert_array_equal(np.asarray(out), [4.0, 16.0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_scan_10000_steps(backend):
    found = np.zeros(10_000, bool)
    found[[10, 5000, 9999]] = True

    def body(s, f):
        s = jas.update_scale(s, f, backend=backend)
        return s, s.scale

    st0 = jas.init_scale_state(2.0**16, growth_interval=2000)
    st, scales = jax.jit(lambda s, f: jax.lax.scan(body, s, f))(st0, found)
    # Expected from the rule: halve at 10, grow at 2010, 4010, halve at 5000,
    # grow at 7000, 9000, halve at 9999.
    assert float(scales[10]) == 2.0**15
    assert float(scales[2010]) == 2.0**16 and float(scales[2009]) == 2.0**15
    assert float(scales[4010]) == 2.0**17
    assert float(scales[5000]) == 2.0**16
    assert float(scales[7000]) == 2.0**17 and float(scales[9000]) == 2.0**18
    assert float(st.scale) == 2.0**17 and int(st.growth_tracker) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_through_code_containing_it(backend):
    """The state is non-differentiable: no error, zero cotangents."""

    def loss(w, scale):
        st = jas.ScaleState(scale, jnp.int32(0), 2.0, 0.5, 1)
        found = ~jnp.isfinite(w * scale)
        new = jas.update_scale(st, found, backend=backend)
        return jnp.sum(w * new.scale) + new.scale

    g_w, g_s = jax.grad(loss, argnums=(0, 1))(jnp.float32(3.0), jnp.float32(2.0))
    assert float(g_w) == 4.0  # d/dw (w * new_scale), new_scale = 4 (growth)
    assert float(g_s) == 0.0


@pytest.mark.parametrize("backend", ["reference", "ffi"])
def test_jvp_and_vjp_are_zero(backend):
    # The state is not differentiable: tangents and cotangents through it
    # are zero (stop_gradient), while the primal is the rule's value.
    st = jas.init_scale_state(8.0, growth_interval=1, shape=(1,))

    def f(x):
        return jas.update_scale(
            jas.ScaleState(x, st.growth_tracker, growth_interval=1), False, backend=backend
        ).scale

    out, tangent = jax.jvp(f, (st.scale,), (jnp.full((1,), 3.0),))
    np.testing.assert_array_equal(np.asarray(out), [16.0])  # grown: interval 1
    np.testing.assert_array_equal(np.asarray(tangent), [0.0])
    out, vjp = jax.vjp(f, st.scale)
    (cotangent,) = vjp(jnp.full((1,), 5.0))
    np.testing.assert_array_equal(np.asarray(cotangent), [0.0])
    assert float(jax.grad(lambda x: f(x).sum())(st.scale)[0]) == 0.0


def test_available_backends():
    import importlib.util

    assert jas.available_backends("cpu") == ("reference", "ffi")
    assert jas.available_backends("tpu") == ("reference",)
    assert jas.available_backends() == ("reference", "ffi")  # tests run on CPU
    assert jas.auto_backend("cpu") == "ffi"  # one device in this process
    assert jas.auto_backend("tpu") == "reference"
    # CUDA: "ffi" where _native_cuda was built (nvcc at install), and never
    # "auto"'s pick (the reference there, bench/RESULTS.md); "gpu" is "cuda".
    cuda = (
        ("reference", "ffi")
        if importlib.util.find_spec("jax_amp_scale._native_cuda")
        else ("reference",)
    )
    assert jas.available_backends("cuda") == cuda
    assert jas.available_backends("gpu") == cuda
    assert jas.auto_backend("cuda") == "reference" and jas.auto_backend("gpu") == "reference"
    # Ascend without a registered plugin: the reference only.
    assert jas.available_backends("ascend") == ("reference",)
    assert jas.auto_backend("ascend") == "reference"


def test_auto_on_one_cpu_device_lowers_to_the_native_call():
    st = jas.init_scale_state()
    hlo = jax.jit(lambda s: jas.update_scale(s, True)).lower(st).as_text()
    assert "jas_update_scale" in hlo
    hlo = jax.jit(lambda s: jas.update_scale(s, True, "reference")).lower(st).as_text()
    assert "jas_update_scale" not in hlo


# per_platform's other-platforms branch: traced only where it is lowered, and
# right under jit, vmap and jvp where it is.  "cuda" stands for a platform
# with a handler, so on this CPU-only machine the other branch is the one run.
def _branches(calls):
    def native(x, y):
        return {"sum": x * 3.0 + y, "flag": jnp.any(x > 0)}

    def other(x, y):
        calls.append(1)
        return {"sum": x * 2.0 + y, "flag": jnp.any(x > 1)}

    return native, other


def _on(native_on, calls):
    from jax_amp_scale.mechanisms.custom_call import per_platform

    native, other = _branches(calls)
    return lambda x, y: per_platform(native, other, x, y, native_on=native_on)


def test_other_branch_is_not_traced_where_a_handler_exists():
    calls = []
    f = _on(["cpu"], calls)
    x, y = jnp.arange(4.0), jnp.float32(1.0)
    jaxpr = str(jax.make_jaxpr(f)(x, y))
    assert calls == [] and "jas_reference_elsewhere" in jaxpr
    out = jax.jit(f)(x, y)  # jax < 0.7 traces it here: it lowers every branch
    assert calls == [] or LOWERS_EVERY_BRANCH
    np.testing.assert_array_equal(np.asarray(out["sum"]), np.arange(4.0) * 3 + 1)
    # The real pass on CPU: its reference is one deferred equation too.
    text = str(jax.make_jaxpr(jas.unscale_and_check)([jnp.ones(3)], jnp.float32(2.0)))
    assert "jas_reference_elsewhere" in text and "jas_unscale_and_check" in text


def test_other_branch_runs_right_under_jit_vmap_and_jvp():
    calls = []
    f = _on(["cuda"], calls)
    x, y = jnp.arange(4.0), jnp.float32(1.0)
    want = {"sum": np.arange(4.0) * 2 + 1, "flag": True}
    for g in (f, jax.jit(f)):  # eager: the branch is picked before tracing
        out = g(x, y)
        np.testing.assert_array_equal(np.asarray(out["sum"]), want["sum"])
        assert bool(out["flag"]) is want["flag"]
    xs = jnp.stack([x, -x])
    out = jax.jit(jax.vmap(f, in_axes=(0, None)))(xs, y)
    np.testing.assert_array_equal(
        np.asarray(out["sum"]), np.stack([want["sum"], 1 - 2 * np.arange(4.0)])
    )
    np.testing.assert_array_equal(np.asarray(out["flag"]), [True, False])
    primal, tangent = jax.jit(lambda x, t: jax.jvp(lambda x: f(x, y)["sum"], (x,), (t,)))(x, x)
    np.testing.assert_array_equal(np.asarray(primal), want["sum"])
    np.testing.assert_array_equal(np.asarray(tangent), np.arange(4.0) * 2)
    grad = jax.jit(jax.grad(lambda x: f(x, y)["sum"].sum()))(x)
    np.testing.assert_array_equal(np.asarray(grad), np.full(4, 2.0))
    assert calls  # the reference was traced: it is what ran
