"""The native fused unscale_and_check pass (backend="ffi") against the reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from jax.sharding import PartitionSpec

import jax_amp_scale as jas
from jax_amp_scale.mechanisms import handlers
from jax_amp_scale.operators import unscale_and_check as _fused
from tests._budget import tiered
from tests.jax_compat import BEFORE_0_7, LOWERS_EVERY_BRANCH, export_for, set_mesh

pytestmark = pytest.mark.skipif(
    "cpu" not in handlers.platforms("unscale_and_check"), reason="native CPU module not built"
)

UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# Inverse scales: ordinary, powers of two, ones whose products land in the
# subnormal range or overflow.  The scale is float32(1 / inv): 7e-45 makes
# it inf, so the inverse is 0.
INVS = [1.0, 2.0**-16, 0.5, 3.0, 1 / 3, 2.0**100, 2.0**-100, 1e-38, 7e-45, 1e30]


def _scale(inv):
    with np.errstate(over="ignore"):
        return np.float32(1.0) / np.float32(inv)


def _check(backend):
    return jax.jit(functools.partial(jas.unscale_and_check, backend=backend))


def _bits(x):
    x = np.asarray(x)
    return x.view(UINT[x.dtype.itemsize])


def _random_patterns(dtype, n, seed):
    """Every kind of value: normals, subnormals, zeros, infs, NaNs with payloads."""
    it = UINT[np.dtype(dtype).itemsize]
    bits = np.random.default_rng(seed).integers(0, np.iinfo(it).max, n, dtype=it, endpoint=True)
    return jnp.asarray(bits).view(dtype)


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def _assert_same(a, b):
    (out_a, found_a), (out_b, found_b) = a, b
    np.testing.assert_array_equal(np.asarray(found_a), np.asarray(found_b))
    for leaf_a, leaf_b in zip(jax.tree.leaves(out_a), jax.tree.leaves(out_b), strict=True):
        assert leaf_a.dtype == leaf_b.dtype and leaf_a.shape == leaf_b.shape
        np.testing.assert_array_equal(_bits(leaf_a), _bits(leaf_b))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_bits_equal_reference_on_every_bit_pattern(dtype):
    if np.dtype(dtype).itemsize == 2:  # all 65,536 of them
        x = jnp.asarray(np.arange(1 << 16, dtype=np.uint16)).view(dtype)
    else:
        x = _random_patterns(dtype, 1 << 16, seed=1)
    ffi, ref = _check("ffi"), _check("reference")
    for inv in INVS:
        scale = _scale(inv)
        _assert_same(ffi([x], scale), ref([x], scale))


def test_bits_equal_reference_float64(x64):
    x = _random_patterns(jnp.float64, 1 << 14, seed=2)
    ffi, ref = _check("ffi"), _check("reference")
    for inv in INVS:
        scale = _scale(inv)
        _assert_same(ffi({"w": x}, scale), ref({"w": x}, scale))


def test_subnormals_flush_as_xla_cpu_does():
    # XLA:CPU runs with denormals-are-zero and flush-to-zero; so does the handler.
    x = jnp.array([1e-39, -3e-39, 1e-30, 1.0], jnp.float32)
    out, _ = _check("ffi")([x], np.float32(1e10))
    np.testing.assert_array_equal(np.asarray(out[0]), np.array([0.0, -0.0, 0.0, 1e-10], np.float32))


@pytest.mark.parametrize("where", ["start", "end", "none"])
def test_large_call_split_over_threads(where):
    # Above 2**20 elements the handler shares chunks with XLA's thread pool.
    big = jnp.asarray(np.random.default_rng(3).standard_normal(3_000_017).astype(np.float32))
    half = jnp.ones((1_500_001,), jnp.float16)
    if where == "start":
        big = big.at[0].set(jnp.nan)
    elif where == "end":
        half = half.at[-1].set(jnp.inf)
    tree = {"big": big, "half": half, "small": jnp.arange(5.0)}
    out, found = _check("ffi")(tree, jnp.float32(4.0))
    assert bool(found) == (where != "none")
    _assert_same((out, found), _check("reference")(tree, jnp.float32(4.0)))


def test_mixed_tree_zero_size_and_non_float_leaves():
    tree = {
        "f16": jnp.array([[0.5, 7.0], [-3.25, 65504.0]], jnp.float16),
        "bf16": jnp.array([2.0, 0.125], jnp.bfloat16),
        "empty": jnp.zeros((0, 3), jnp.float32),
        "int": jnp.array([3, 4], jnp.int32),
        "bool": jnp.array([True, False]),
        "none": None,
    }
    for scale in (0.5, 2.0, 1024.0):
        out, found = _check("ffi")(tree, jnp.float32(scale))
        _assert_same((out, found), _check("reference")(tree, jnp.float32(scale)))
        np.testing.assert_array_equal(out["int"], tree["int"])
        assert out["none"] is None
    # 65504 / 0.5 overflows float16: found.
    assert bool(_check("ffi")(tree, jnp.float32(0.5))[1])


@pytest.mark.parametrize(  # 65: two groups
    "n_leaves", [*tiered([1, 64, 65], keep=[1, 65]), pytest.param(200, marks=pytest.mark.slow)]
)
def test_one_custom_call_per_group_of_leaves(n_leaves):
    """A call per LEAVES_PER_CALL leaves: no per-leaf kernels or reductions."""
    tree = [jnp.ones((64,), jnp.float32) * i for i in range(n_leaves)]
    text = _check("ffi").lower(tree, jnp.float32(2.0)).compile().as_text()
    entry = text[text.index("ENTRY") :]
    calls = -(-n_leaves // _fused.LEAVES_PER_CALL)
    assert entry.count('custom_call_target="jas_unscale_and_check_v1"') == calls
    assert "reduce(" not in entry
    # An overflow in any group, the last one included, is found.
    for bad in (0, n_leaves - 1):
        poisoned = list(tree)
        poisoned[bad] = poisoned[bad].at[3].set(jnp.inf)
        out, found = _check("ffi")(poisoned, jnp.float32(2.0))
        assert bool(found)
        _assert_same((out, found), _check("reference")(poisoned, jnp.float32(2.0)))
    out, found = _check("ffi")(tree, jnp.float32(2.0))
    assert not bool(found)
    _assert_same((out, found), _check("reference")(tree, jnp.float32(2.0)))


@pytest.mark.parametrize("scale_batched", [True, False])
def test_vmap_runs_the_reference_per_member(scale_batched):
    rng = np.random.default_rng(4)
    tree = {
        "w": jnp.asarray(rng.standard_normal((3, 4, 5)).astype(np.float16)),
        "b": jnp.asarray(rng.standard_normal((3, 5)).astype(np.float32)),
    }
    tree["w"] = tree["w"].at[1, 0, 0].set(jnp.inf)  # only member 1 overflows
    scales = jnp.array([2.0, 4.0, 0.25], jnp.float32) if scale_batched else jnp.float32(8.0)
    axes = 0 if scale_batched else None

    def run(backend):
        f = functools.partial(jas.unscale_and_check, backend=backend)
        return jax.jit(jax.vmap(f, in_axes=(0, axes)))(tree, scales)

    out, found = run("ffi")
    np.testing.assert_array_equal(np.asarray(found), [False, True, False])
    _assert_same((out, found), run("reference"))


def test_grad_and_jvp_equal_the_reference():
    x = jnp.array([1.0, -2.0, 3.0], jnp.float32)

    def loss(backend, x, s):
        out, _ = jas.unscale_and_check({"x": x}, s, backend=backend)
        return jnp.sum(out["x"] ** 2)

    for backend in ("ffi", "reference"):
        g = jax.grad(loss, argnums=(1, 2))(backend, x, jnp.float32(4.0))
        np.testing.assert_allclose(g[0], 2 * x / 16, rtol=1e-6)
        np.testing.assert_allclose(g[1], -2 * jnp.sum(x**2) / 64, rtol=1e-6)
    f = {
        b: functools.partial(lambda b, x, s: jas.unscale_and_check([x], s, backend=b)[0][0], b)
        for b in ("ffi", "reference")
    }
    primals, tangents = (x, jnp.float32(4.0)), (jnp.ones(3), jnp.float32(1.0))
    p_ffi, t_ffi = jax.jvp(f["ffi"], primals, tangents)
    p_ref, t_ref = jax.jvp(f["reference"], primals, tangents)
    np.testing.assert_array_equal(p_ffi, p_ref)
    np.testing.assert_array_equal(t_ffi, t_ref)


def test_loss_scaled_steps_equal_with_both_passes():
    optax = pytest.importorskip("optax")
    from jax_amp_scale.optax import loss_scaled

    params = {"w": jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)}
    grads_seq = [{"w": jnp.full((3, 4), 2.0**15, jnp.float32) * (i + 1) / 7} for i in range(4)] + [
        {"w": jnp.full((3, 4), jnp.inf, jnp.float32)}
    ]

    def run(backend):
        tx = loss_scaled(
            optax.adam(1e-2), jas.dynamic_scaler(2.0**16, growth_interval=2), backend=backend
        )
        state, p = tx.init(params), params
        update = jax.jit(tx.update)
        for g in grads_seq:
            u, state = update(g, state, p)
            p = optax.apply_updates(p, u)
        return p, state

    (p_ffi, s_ffi), (p_ref, s_ref) = run("ffi"), run("reference")
    for a, b in zip(jax.tree.leaves((p_ffi, s_ffi)), jax.tree.leaves((p_ref, s_ref)), strict=True):
        if LOWERS_EVERY_BRANCH:
            # jax 0.6's XLA fuses adam's update differently around the two
            # skips (select vs cond) and rounds it 1 ulp apart; the passes'
            # own bits are compared exactly in the tests above.
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-7, atol=0)
        else:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(s_ffi.skipped_steps) == 1


def test_auto_uses_the_native_calls_in_a_one_device_process():
    """auto: native calls on this one-device CPU process (the default users get)."""
    if jax.device_count() != 1:  # tests/multidevice/ in the same process: eight devices
        pytest.skip("needs a one-device process")
    text = jax.jit(jas.unscale_and_check).lower([jnp.ones(4)], jnp.float32(2.0)).as_text()
    assert "jas_unscale_and_check" in text
    text = jax.jit(jas.update_scale).lower(jas.init_scale_state(), True).as_text()
    assert "jas_update_scale" in text
    assert jas.auto_backend("cpu") == "ffi"
    ref = jax.jit(lambda g: jas.unscale_and_check(g, jnp.float32(2.0), backend="reference"))
    assert "jas_unscale_and_check" not in ref.lower([jnp.ones(4)]).as_text()


def test_explicitly_sharded_leaves_run_natively_and_keep_their_type():
    # A one-device mesh with an explicit axis: the native pass's results
    # carry the leaves' sharding (operators/unscale_and_check.py, elementwise_pass; eight devices:
    # tests/multidevice/test_fused_pass_sharded.py).
    from jax.sharding import AxisType, NamedSharding

    mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))
    g = jax.device_put(jnp.ones((16,), jnp.float32), NamedSharding(mesh, PartitionSpec("x")))
    with set_mesh(mesh):
        text = jax.jit(_check("auto")).lower([g], jnp.float32(2.0)).as_text()
        if BEFORE_0_7:  # "auto" plans the reference there; "ffi" says why not
            with pytest.raises(ValueError, match=r"explicitly sharded leaves on jax < 0\.7"):
                _check("ffi")([g], jnp.float32(2.0))
        for backend in ("auto",) if BEFORE_0_7 else ("auto", "ffi"):
            out, found = _check(backend)([g], jnp.float32(2.0))
            assert jax.typeof(out[0]).sharding.spec == PartitionSpec("x")
            np.testing.assert_array_equal(np.asarray(out[0]), np.full(16, 0.5, np.float32))
            assert not bool(found)
    assert ("jas_unscale_and_check" in text) != BEFORE_0_7


def test_ffi_backend_on_a_platform_without_handler_fails_clearly():
    check = functools.partial(jas.unscale_and_check, backend="ffi")
    with pytest.raises(NotImplementedError, match="fused unscale-and-check handler for platform"):
        export.export(jax.jit(check), platforms=["cuda"])([jnp.ones(3)], jnp.float32(2.0))
    # auto and reference lower anywhere: the reference where no handler exists.
    args = ([jnp.ones(3)], jnp.float32(2.0))
    f = functools.partial(jas.unscale_and_check, backend="auto")
    text = export_for(f, ["cuda"], *args).mlir_module()
    assert LOWERS_EVERY_BRANCH or "jas_unscale_and_check" not in text
    f = functools.partial(jas.unscale_and_check, backend="reference")
    assert "jas_unscale_and_check" not in export_for(f, ["cuda", "cpu"], *args).mlir_module()


def test_bad_backend_is_named():
    with pytest.raises(ValueError, match="backend must be one of"):
        jas.unscale_and_check([jnp.ones(3)], 2.0, backend="native")
