"""scale_loss, unscale, all_finite, unscale_and_check, nonfinite_leaves, value_and_grad."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jax_amp_scale as jas

F16_BIG = 40000.0


def mixed_tree():
    return {
        "f32": jnp.array([1.5, -2.0, 3.0], jnp.float32),
        "f16": jnp.array([[0.5, 7.0], [-3.25, 1024.0]], jnp.float16),
        "bf16": jnp.array([2.0, 0.125], jnp.bfloat16),
        "int": jnp.array([3, 4], jnp.int32),
        "bool": jnp.array([True, False]),
        "none": None,
    }


def expected_unscale(x, scale):
    inv = np.float32(1.0) / np.float32(scale)
    return (np.asarray(x, np.float32) * inv).astype(x.dtype)


@pytest.mark.parametrize(
    "state",
    [
        jas.init_scale_state(1024.0),
        jas.dynamic_scaler(1024.0),
        jas.static_scaler(1024.0),
        1024.0,
        jnp.float32(1024.0),
        np.float32(1024.0),
        jas.init_scale_state(1024.0, dtype=jnp.float16, shape=(1,)),
    ],
    ids=["ScaleState", "dynamic", "static", "float", "jax", "numpy", "f16-shape1"],
)
def test_scale_loss_accepts_every_state_form(state):
    loss = jnp.float16(3.0)
    out = jas.scale_loss(loss, state)
    assert out.dtype == jnp.float32
    assert out.shape == ()
    assert float(out) == 3072.0


def test_scale_loss_float16_does_not_overflow_loss():
    # 2**16 is inf in float16; the product is taken in float32.
    out = jas.scale_loss(jnp.float16(2.0), jas.init_scale_state())
    assert out.dtype == jnp.float32 and float(out) == 131072.0


def test_scale_loss_tree_and_float64_promotion():
    out = jas.scale_loss({"a": jnp.float32(1.0), "n": jnp.int32(5)}, 4.0)
    assert float(out["a"]) == 4.0 and out["n"].dtype == jnp.int32 and int(out["n"]) == 5


def test_noop_scale_is_identity():
    x = jnp.float16(3.0)
    noop = jas.no_op_scaler()
    assert jas.scale_loss(x, noop) is x
    tree = mixed_tree()
    assert jas.unscale(tree, noop)["f16"] is tree["f16"]


@pytest.mark.parametrize("bad", ["x", object(), True, jnp.int32(4), jnp.ones(3)])
def test_scale_loss_rejects_bad_state(bad):
    with pytest.raises((TypeError, ValueError), match="state"):
        jas.scale_loss(jnp.float32(1.0), bad)


@pytest.mark.parametrize("scale", [1024.0, 1000.0, 0.75, 3.0])
def test_unscale_mixed_dtypes(scale):
    tree = mixed_tree()
    out = jax.jit(jas.unscale)(tree, jnp.float32(scale))
    for k in ("f32", "f16", "bf16"):
        assert out[k].dtype == tree[k].dtype
        np.testing.assert_array_equal(
            np.asarray(out[k], np.float32),
            np.asarray(expected_unscale(np.asarray(tree[k]), scale), np.float32),
        )
    np.testing.assert_array_equal(out["int"], tree["int"])
    np.testing.assert_array_equal(out["bool"], tree["bool"])
    assert out["none"] is None


def test_unscale_float0_leaves_pass():
    f0 = np.zeros((2,), dtype=jax.dtypes.float0)
    out = jas.unscale({"a": f0, "b": jnp.float32(8.0)}, 2.0)
    assert out["a"].dtype == jax.dtypes.float0 and float(out["b"]) == 4.0
    assert not bool(jas.unscale_and_check({"a": f0}, 2.0)[1])


def test_all_finite():
    tree = mixed_tree()
    assert bool(jas.all_finite(tree))
    assert bool(jax.jit(jas.all_finite)({}))
    assert bool(jas.all_finite({"i": jnp.array([1, 2])}))
    for k, bad in (("f32", np.inf), ("f16", np.nan), ("bf16", -np.inf)):
        t = dict(tree)
        t[k] = t[k].at[0].set(bad)
        assert not bool(jax.jit(jas.all_finite)(t)), k


# unscale_and_check's two paths: the pure per-leaf one and the native fused
# call (CPU).  "auto" picks the reference here: the tests run with 8 devices.
PASSES = ["reference", "ffi"]


@pytest.mark.parametrize("backend", PASSES)
def test_zero_size_leaves(backend):
    tree = {"e": jnp.zeros((0, 3), jnp.float16), "w": jnp.array([2.0])}
    check = functools.partial(jas.unscale_and_check, backend=backend)
    out, found = jax.jit(check)(tree, jnp.float32(2.0))
    assert out["e"].shape == (0, 3) and float(out["w"][0]) == 1.0 and not bool(found)
    assert bool(jas.all_finite({"e": jnp.zeros((0,))}))
    assert not bool(jas.nonfinite_leaves({"e": jnp.zeros((0,))})["e"])


@pytest.mark.parametrize("backend", PASSES)
def test_unscale_and_check_empty_tree(backend):
    check = functools.partial(jas.unscale_and_check, backend=backend)
    out, found = jax.jit(check)({}, jnp.float32(2.0))
    assert out == {} and found.dtype == jnp.bool_ and not bool(found)
    out, found = check({"i": jnp.int32(3), "n": None}, 2.0)
    assert int(out["i"]) == 3 and out["n"] is None and not bool(found)


@pytest.mark.parametrize("leaf", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("backend", PASSES)
def test_unscale_and_check_finds_each_dtype(leaf, bad, backend):
    tree = mixed_tree()
    tree[leaf] = tree[leaf].at[-1].set(bad)
    check = functools.partial(jas.unscale_and_check, backend=backend)
    out, found = jax.jit(check)(tree, jnp.float32(4.0))
    assert bool(found)
    assert out[leaf].dtype == tree[leaf].dtype
    # Every floating value is unscaled (x / 4 is exact here), the bad one too;
    # integer and bool leaves pass untouched.
    for name in ("f32", "f16", "bf16"):
        want = np.asarray(tree[name], np.float32) / 4
        np.testing.assert_array_equal(np.asarray(out[name], np.float32), want)
    np.testing.assert_array_equal(np.asarray(out["int"]), [3, 4])
    np.testing.assert_array_equal(np.asarray(out["bool"]), [True, False])


@pytest.mark.parametrize("backend", PASSES)
def test_unscale_and_check_catches_overflow_from_unscaling(backend):
    # A finite float16 gradient overflows when a scale below 1 is divided out.
    g = {"w": jnp.array([F16_BIG], jnp.float16)}
    out, found = jas.unscale_and_check(g, 0.5, backend=backend)
    assert bool(found) and bool(jnp.isinf(out["w"][0]))
    assert not bool(jas.unscale_and_check(g, 2.0, backend=backend)[1])


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.sampled_from(["f32", "f16", "bf16", "int"]), min_size=0, max_size=5),
    st.sampled_from([1.0, 2.0**10, 3.0, 0.5, 2.0**16]),
    st.integers(0, 2**31 - 1),
    st.booleans(),
    st.sampled_from(PASSES),
)
def test_unscale_and_check_equals_unscale_then_all_finite(kinds, scale, seed, poison, backend):
    rng = np.random.default_rng(seed)
    dts = {"f32": np.float32, "f16": np.float16, "bf16": jnp.bfloat16, "int": np.int32}
    tree = []
    for k in kinds:
        x = (rng.standard_normal(4) * 100).astype(dts[k])
        if poison and k != "int" and rng.random() < 0.5:
            x[rng.integers(4)] = rng.choice([np.inf, -np.inf, np.nan])
        tree.append(jnp.asarray(x))
    out, found = jas.unscale_and_check(tree, scale, backend=backend)
    ref = jas.unscale(tree, scale)
    for a, b in zip(out, ref, strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert bool(found) == (not bool(jas.all_finite(ref)))


def test_nonfinite_leaves_and_paths():
    tree = {
        "dense": {"w": jnp.ones((2, 2), jnp.float16), "b": jnp.zeros(2)},
        "norm": [jnp.array([1.0, np.nan]), jnp.int32(1)],
    }
    tree["dense"]["w"] = tree["dense"]["w"].at[1, 1].set(np.inf)
    report = jax.jit(jas.nonfinite_leaves)(tree)
    assert jax.tree_util.tree_structure(report) == jax.tree_util.tree_structure(tree)
    assert bool(report["dense"]["w"]) and not bool(report["dense"]["b"])
    assert bool(report["norm"][0]) and not bool(report["norm"][1])
    assert jas.nonfinite_paths(report) == ["['dense']['w']", "['norm'][0]"]
    assert jas.nonfinite_paths(jas.nonfinite_leaves({})) == []


def quad(p, x):
    return jnp.sum((p["w"] * x - 1.0) ** 2) + jnp.sum(p["b"] ** 2)


def test_value_and_grad_matches_jax_exactly():
    p = {"w": jnp.array([0.5, -1.0, 2.0]), "b": jnp.array([0.25])}
    x = jnp.array([1.0, 2.0, 3.0])
    state = jas.init_scale_state(2.0**12)
    (loss, grads, found) = jax.jit(lambda p, x: jas.value_and_grad(quad, state)(p, x))(p, x)
    ref_loss, ref_grads = jax.value_and_grad(quad)(p, x)
    assert float(loss) == float(ref_loss)  # the unscaled loss, not loss * scale
    for k in p:  # power-of-two scale: bit-exact
        np.testing.assert_array_equal(grads[k], ref_grads[k])
    assert not bool(found)


def test_value_and_grad_has_aux_and_argnums():
    def f(a, b):
        return jnp.sum(a * b), {"n": a.shape[0]}

    a, b = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])
    (loss, aux), grads, found = jas.value_and_grad(f, 8.0, has_aux=True, argnums=(0, 1))(a, b)
    assert float(loss) == 11.0 and aux == {"n": 2}
    np.testing.assert_array_equal(grads[0], b)
    np.testing.assert_array_equal(grads[1], a)
    assert not bool(found)


def test_value_and_grad_float16_overflow_found():
    def f(w):
        return jnp.sum(w * jnp.float16(2.0)).astype(jnp.float32)

    w = jnp.ones(2, jnp.float16)
    _, g, found = jas.value_and_grad(f, jas.init_scale_state(2.0**15))(w)
    assert g.dtype == jnp.float16 and bool(found)  # 2 * 2**15 overflows float16
    _, g, found = jas.value_and_grad(f, jas.init_scale_state(2.0**10))(w)
    assert not bool(found) and float(g[0]) == 2.0


def test_value_and_grad_axis_name_or_reduces():
    def f(w, x):
        return jnp.sum(w * x)

    xs = jnp.array([[1.0], [np.inf], [2.0]])
    vg = jas.value_and_grad(f, 2.0, axis_name="i")
    _, _, found = jax.vmap(vg, in_axes=(None, 0), axis_name="i")(jnp.ones(1), xs)
    np.testing.assert_array_equal(found, [True, True, True])
    vg_local = jas.value_and_grad(f, 2.0)
    _, _, found = jax.vmap(vg_local, in_axes=(None, 0))(jnp.ones(1), xs)
    np.testing.assert_array_equal(found, [False, True, False])


def test_value_and_grad_bad_input():
    with pytest.raises(TypeError, match="fun must be callable"):
        jas.value_and_grad(3, 2.0)
    with pytest.raises(TypeError, match="floating scalar loss"):
        jas.value_and_grad(lambda w: w, 2.0)(jnp.ones(2))
    with pytest.raises(TypeError, match="pair"):
        jas.value_and_grad(lambda w: jnp.sum(w), 2.0, has_aux=True)(jnp.ones(2))


def test_find_scale_state():
    s = jas.init_scale_state()
    assert jas.find_scale_state({"a": [1, s]}) is s
    with pytest.raises(ValueError, match="exactly one"):
        jas.find_scale_state({"a": s, "b": s})
    with pytest.raises(ValueError, match="exactly one"):
        jas.find_scale_state({})


def _entry(hlo_text):
    return hlo_text[hlo_text.index("ENTRY") :]


def test_unscale_and_check_hlo_structure_cpu():
    """One kernel writes each unscaled leaf; the check adds only a 1-byte mask.

    Pins what XLA:CPU makes of unscale_and_check: per leaf, exactly one
    full-size value buffer (the output: no f32 upcast materialized, no copy)
    and at most one full-size pred buffer (XLA:CPU does not fuse reductions
    with their producers; GPU's multi-output fusion folds the two into one pass).
    """
    if jax.default_backend() != "cpu":
        pytest.skip("CPU HLO structure")
    tree = {"a": jnp.ones((512, 256), jnp.float16), "b": jnp.ones((512, 256), jnp.float32)}
    check = functools.partial(jas.unscale_and_check, backend="reference")
    text = _entry(jax.jit(check).lower(tree, jnp.float32(8.0)).compile().as_text())
    lines = [ln for ln in text.splitlines() if "=" in ln and "parameter(" not in ln]
    assert not [ln for ln in lines if re.search(r"\bcopy\(", ln)]
    for dt in ("f16", "f32"):
        full = [ln for ln in lines if re.search(rf"= {dt}\[512,256\]", ln)]
        assert len(full) == 1, full  # the unscaled leaf itself
    masks = [ln for ln in lines if re.search(r"= (pred|u8)\[512,256\]", ln)]
    assert len(masks) <= 2, masks
    # No full-size intermediate in any other dtype (e.g. an f32 copy of the f16 leaf).
    others = [ln for ln in lines if re.search(r"= \w+\[512,256\]", ln)]
    assert len(others) == 2 + len(masks)
