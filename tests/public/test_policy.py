"""Policy, get_policy (levels and jmp strings), scaler_for."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_amp_scale as jas
from jax_amp_scale.policy import Policy, scaler_for

F32, F16, BF16 = jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)


def params():
    return {
        "Dense_0": {"kernel": jnp.ones((4, 3)), "bias": jnp.zeros(3)},
        "LayerNorm_0": {"scale": jnp.ones(3), "bias": jnp.zeros(3)},
        "bn1": {"scale": jnp.ones(3)},
        "encoder": {"ln_f": {"scale": jnp.ones(3)}, "lnx": jnp.ones((2, 2))},
        "steps": jnp.int32(3),
        "mask": jnp.array([True, False]),
        "none": None,
    }


def dtypes(tree):
    return jax.tree_util.tree_map(lambda x: jnp.dtype(x.dtype), tree)


def test_o2_keeps_norm_layers_float32():
    pol = jas.get_policy("O2")
    assert (pol.param_dtype, pol.compute_dtype, pol.output_dtype) == (F32, F16, F32)
    c = dtypes(pol.cast_to_compute(params()))
    assert c["Dense_0"] == {"kernel": F16, "bias": F16}
    assert c["LayerNorm_0"] == {"scale": F32, "bias": F32}
    assert c["bn1"]["scale"] == F32 and c["encoder"]["ln_f"]["scale"] == F32
    assert c["encoder"]["lnx"] == F16  # not a norm name
    assert c["steps"] == jnp.int32 and c["mask"] == jnp.bool_
    assert pol.cast_to_compute(params())["none"] is None
    # master weights stay float32
    assert all(
        d in (F32, jnp.int32, jnp.bool_)
        for d in jax.tree_util.tree_leaves(dtypes(pol.cast_to_param(params())))
    )
    assert pol.cast_to_output(jnp.ones(2, F16)).dtype == F32


def test_o1_casts_matrices_only():
    pol = jas.get_policy("O1")
    assert (pol.param_dtype, pol.compute_dtype, pol.output_dtype) == (F32, F16, F32)
    c = dtypes(pol.cast_to_compute(params()))
    assert c["Dense_0"] == {"kernel": F16, "bias": F32}
    assert c["encoder"]["lnx"] == F16
    assert c["LayerNorm_0"] == {"scale": F32, "bias": F32}
    # The norm rule holds for matrices too: a rank-2 leaf under a norm name
    # stays float32, the same leaf elsewhere becomes float16.
    m = jnp.ones((2, 2), F32)
    c = dtypes(pol.cast_to_compute({"group_norm": {"w": m}, "dense": {"w": m}}))
    assert c == {"group_norm": {"w": F32}, "dense": {"w": F16}}
    assert pol.cast_to_output(jnp.ones(2, F16)).dtype == F32


def test_o0_and_o3():
    p = params()
    assert jas.get_policy("o0").cast_to_compute(p)["Dense_0"]["kernel"] is p["Dense_0"]["kernel"]
    o3 = jas.get_policy("O3")
    leaves = jax.tree_util.tree_leaves(dtypes(o3.cast_to_param(p)))
    assert F16 in leaves and F32 not in leaves
    assert o3.cast_to_output(jnp.ones(2)).dtype == F16


def test_levels_pair_with_scales():
    assert isinstance(scaler_for("O2"), jas.DynamicScaler)
    assert isinstance(scaler_for("O1"), jas.DynamicScaler)
    assert isinstance(scaler_for("O0"), jas.NoOpScaler)
    assert isinstance(scaler_for("O3"), jas.NoOpScaler)
    with pytest.raises(ValueError, match="level"):
        scaler_for("O4")


def test_scaler_for_a_non_string_is_a_type_error_as_in_get_policy():
    # Before: ValueError, while get_policy(3) raises TypeError for the same mistake.
    for level in (3, None, b"O1"):
        with pytest.raises(
            TypeError, match=r"level must be a string, one of \('O0', 'O1', 'O2', 'O3'\), got "
        ):
            scaler_for(level)
    with pytest.raises(ValueError, match=r"level must be one of \('O0', 'O1', 'O2', 'O3'\)"):
        scaler_for("O9")


@pytest.mark.parametrize(
    "text, expect",
    [
        ("params=float32,compute=float16,output=float32", (F32, F16, F32)),
        ("p=f32,c=bf16,o=f32", (F32, BF16, F32)),
        ("c=half", (F32, F16, F16)),
        ("p=f16", (F16, F16, F16)),
        (" params = full , compute = bfloat16 ", (F32, BF16, BF16)),
        ("bfloat16", (BF16, BF16, BF16)),
        ("float32", (F32, F32, F32)),
    ],
)
def test_jmp_strings(text, expect):
    pol = jas.get_policy(text)
    assert (pol.param_dtype, pol.compute_dtype, pol.output_dtype) == expect
    assert jas.get_policy(str(pol)) == pol  # round trip through the string form


@pytest.mark.parametrize(
    "text, match",
    [
        ("p=f32,x=f16", "unknown policy key"),
        ("p=f32,p=f16", "twice"),
        ("p=int8", "unknown dtype"),
        ("p=f32,c", "key=dtype"),
        ("O9", r"unknown level 'O9'; the levels are O0, O1, O2, O3"),
        ("O4", r"unknown level 'O4'; the levels are O0, O1, O2, O3"),
        ("float8", r"neither a level \(O0, O1, O2, O3\), a dtype name .*jmp policy string"),
    ],
)
def test_bad_strings(text, match):
    with pytest.raises(ValueError, match=match):
        jas.get_policy(text)


def test_bad_policy_fields():
    with pytest.raises(TypeError, match="param_dtype"):
        Policy(jnp.int32)
    with pytest.raises(ValueError, match="regular expression"):
        Policy(keep_float32=("(",))
    with pytest.raises(TypeError, match="keep_float32"):
        Policy(keep_float32=(3,))
    with pytest.raises(TypeError, match="name"):
        jas.get_policy(3)


def test_custom_rules_and_jit():
    pol = Policy(F32, BF16, F32, keep_float32=("bias", lambda path, x: x.shape == (2, 2)))
    out = jax.jit(pol.cast_to_compute)(params())
    assert out["Dense_0"]["bias"].dtype == F32 and out["Dense_0"]["kernel"].dtype == BF16
    assert out["encoder"]["lnx"].dtype == F32
    np.testing.assert_array_equal(out["Dense_0"]["kernel"], np.ones((4, 3)))
    hash(pol)  # usable as a static argument


@pytest.mark.parametrize(
    "name, kept",
    [
        ("LayerNorm_0", True),
        ("BatchNorm_1", True),
        ("GroupNorm", True),
        ("RMSNorm", True),
        ("layer_norm", True),
        ("input_layernorm", True),
        ("final_layer_norm", True),
        ("norm", True),
        ("norm1", True),
        ("bn1", True),
        ("ln_f", True),
        ("ln_1", True),
        ("kernel_ln_proj", False),  # issue 24's trap 2: substrings matched before
        ("unnormalized_head", False),
        ("normalizer", False),
        ("lnx", False),
        ("Dense_0", False),
    ],
)
def test_o2_rule_matches_whole_names(name, kept):
    c = dtypes(jas.get_policy("O2").cast_to_compute({name: {"w": jnp.ones((2, 2))}}))
    assert c[name]["w"] == (F32 if kept else F16)


def test_whole_names_are_path_components():
    pol = Policy(F32, F16, F32, keep_float32=("head",))
    tree = {"head": {"w": jnp.ones(2)}, "head_2": {"w": jnp.ones(2)}, "x": [jnp.ones(2)]}
    c = dtypes(pol.cast_to_compute(tree))
    assert c == {"head": {"w": F32}, "head_2": {"w": F16}, "x": [F16]}
    # haiku's module paths are split at "/"
    c = dtypes(jas.get_policy("O2").cast_to_compute({"mlp/~/layer_norm": {"scale": jnp.ones(2)}}))
    assert c["mlp/~/layer_norm"]["scale"] == F32
    from jax_amp_scale.policy import path_names

    path = jax.tree_util.tree_flatten_with_path({"a/~/b": [{"c": 1}]})[0][0][0]
    assert path_names(path) == ["a", "b", "0", "c"]
