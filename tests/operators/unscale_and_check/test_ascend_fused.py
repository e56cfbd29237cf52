"""The fused gradient pass on Ascend (aclnnForeachNonFiniteCheckAndUnscale), on CPU.

The CPU test binding (``tests/ascend_harness.py``) runs the production
checks and dispatch (``ffi/ascend.cc``, ``ffi/ascend_dispatch.cc``) and the
lowering's CANN calling convention against the CANN test double, whose
operator follows the published kernel (hicann/ops-nn
``foreach/foreach_non_finite_check_and_unscale/op_kernel/
foreach_non_finite_check_and_unscale_n_d.h``): float32 compute, foundInf set
to 1.0 on a non-finite *input*, never cleared, at most 256 tensors.

Oracle: the reference pass (``reference/gradient_pass.py``) for the unscaled
bits (both multiply in float32 and round once to the leaf dtype) and, for
scales >= 1, the flag (a finite input cannot then become non-finite).
"""

from __future__ import annotations

import ctypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_amp_scale.operators.unscale_and_check import cann_one_call, reference_pass
from tests import ascend_harness
from tests._budget import tiered
from tests.jax_compat import enable_x64


def _bits(x):
    x = np.asarray(x)
    return x.view({8: np.uint64, 4: np.uint32, 2: np.uint16}[x.dtype.itemsize])


def _leaves(rng, dtypes, n=50, specials=True):
    out = []
    for k, dt in enumerate(dtypes):
        v = rng.standard_normal(n).astype(np.float32) * np.float32(2.0 ** rng.integers(-20, 20))
        if specials and k % 7 == 3:
            v[k % n] = [np.inf, -np.inf, np.nan][k % 3]
        out.append(jnp.asarray(v, dt))
    return out


def _same(got, want):
    assert bool(got[0]) == bool(want[0])
    for g, w in zip(got[1], want[1], strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(_bits(g), _bits(w))


def _fused(inv, leaves):
    return jax.jit(ascend_harness.unscale_and_check)(inv, leaves)


@pytest.mark.parametrize(
    "dtype", tiered([jnp.float32, jnp.float16, jnp.bfloat16], keep=[jnp.float16])
)
@pytest.mark.parametrize("with_bad", [False, True])
def test_bits_and_flag_equal_the_reference(cann, dtype, with_bad):
    rng = np.random.default_rng(1)
    leaves = _leaves(rng, [dtype] * 10, specials=with_bad)
    inv = jnp.float32(1.0 / 3000.0)
    got = _fused(inv, leaves)
    _same(got, jax.jit(reference_pass)(inv, leaves))
    assert bool(got[0]) == with_bad
    log = cann.log()
    (gws,) = [e for e in log if e["ev"] == "foreach_gws"]
    assert gws["n"] == 10 and gws["status"] == 0 and gws["lib"] == "libopapi_nn.so"
    assert cann.stats()["live_tensors"] == 0 and cann.stats()["live_lists"] == 0


def test_mixed_tree_one_list_per_dtype_float64_and_empty_outside(cann):
    rng = np.random.default_rng(2)
    leaves = _leaves(rng, [jnp.float16, jnp.float32, jnp.bfloat16, jnp.float32, jnp.float16])
    leaves.append(jnp.zeros((0,), jnp.float32))
    inv = jnp.float32(0.125)
    with enable_x64(True):
        leaves.append(jnp.asarray([1.0, np.inf], jnp.float64))
        got = _fused(inv, leaves)
        want = jax.jit(reference_pass)(inv, leaves)
    _same(got, want)
    assert bool(got[0])  # from the float64 leaf, outside the operator
    gws = [e for e in cann.log() if e["ev"] == "foreach_gws"]
    assert sorted((e["dtype"], e["n"]) for e in gws) == [(0, 2), (1, 2), (27, 1)]
    assert all(e["status"] == 0 for e in gws)  # never an empty tensor or a mixed list


def test_more_than_256_leaves_is_two_launches_and_found_ors_across_them(cann):
    # One custom call with 300 leaves: the handler splits it 256 + 44 (the
    # tiling's limit); the only NaN is in the first launch, so the second
    # must not clear the flag (the kernel sets it only, and found starts 0).
    leaves = [jnp.full((3,), 2.0, jnp.float16) for _ in range(300)]
    leaves[5] = leaves[5].at[1].set(jnp.nan)
    inv = jnp.float32(0.5)
    before = cann.stats()
    ascend_harness.register_test_binding()
    target = str(ascend_harness.testing().UNSCALE_TEST_TARGET)
    found, outs = jax.jit(lambda i, xs: cann_one_call(target, i, xs))(inv, leaves)
    assert bool(found)
    assert float(outs[0][0]) == 1.0 and np.isnan(float(outs[5][1]))
    log = cann.log()
    assert [e["n"] for e in log if e["ev"] == "foreach_gws"] == [256, 44]
    stats = {k: v - before[k] for k, v in cann.stats().items()}
    assert stats["lists_created"] == stats["lists_destroyed"] == 2
    assert cann.stats()["live_lists"] == 0 and cann.stats()["live_tensors"] == 0
    assert stats["created"] == stats["destroyed"] == 300 + 2 * 2 and stats["bad_calls"] == 0
    # Each list destroyed exactly once, after its launch.
    evs = [e["ev"] for e in log if e["ev"] in ("create_list", "foreach_gws", "run", "destroy_list")]
    assert evs == ["create_list", "foreach_gws", "run", "destroy_list"] * 2


def test_kernel_checks_the_input_the_library_the_unscaled_value(cann):
    # n_d.h:187-209 reduce the scaled input; a finite input that overflows
    # when unscaled (inv > 1, a scale below 1) is not flagged by the kernel.
    leaves = [jnp.asarray([3e38, 1.0], jnp.float32)]
    ascend_harness.register_test_binding()
    target = str(ascend_harness.testing().UNSCALE_TEST_TARGET)
    found, outs = jax.jit(lambda i, xs: cann_one_call(target, i, xs))(jnp.float32(4.0), leaves)
    assert np.isinf(float(outs[0][0])) and not bool(found)
    # The lowering then checks the outputs (only when |inv| > 1): the
    # library's flag, as the reference and the CPU pass report it.
    for inv in (4.0, np.nan, 0.5):
        x = [jnp.asarray([3e38, 1.0], jnp.float32)]
        _same(_fused(jnp.float32(inv), x), jax.jit(reference_pass)(jnp.float32(inv), x))


@pytest.mark.parametrize(
    ("api", "status"),
    [
        ("aclnnForeachNonFiniteCheckAndUnscaleGetWorkspaceSize", 161002),
        ("aclnnForeachNonFiniteCheckAndUnscale", 561002),
    ],
)
def test_errors_are_surfaced_and_nothing_leaks(cann, api, status):
    cann.set_workspace_size(4096)
    cann.fail(api, status, f"injected {status}")
    leaves = [jnp.ones((4,), jnp.float32)]
    before = cann.stats()
    with pytest.raises(Exception, match=f"{api} failed with status {status}.*injected"):
        jax.block_until_ready(_fused(jnp.float32(1.0), leaves))
    stats = cann.stats()
    assert stats["live_tensors"] == 0 and stats["live_lists"] == 0
    assert stats["lists_created"] - before["lists_created"] == 1
    assert stats["lists_destroyed"] - before["lists_destroyed"] == 1


def test_tensor_list_failure_destroys_the_tensors(cann):
    cann.fail("aclCreateTensorList", 1, "no lists today")
    before = cann.stats()
    with pytest.raises(Exception, match=r"aclCreateTensorList failed.*no lists today"):
        jax.block_until_ready(_fused(jnp.float32(1.0), [jnp.ones((4,), jnp.float32)] * 3))
    stats = cann.stats()
    assert stats["live_tensors"] == 0
    assert stats["created"] - before["created"] == stats["destroyed"] - before["destroyed"] == 3


def test_the_double_refuses_what_the_tiling_refuses(double):
    # foreach_non_finite_check_and_unscale_tiling.cpp:88-91 (1..256 tensors),
    # :107-114 (one dtype), :119-123 (no empty tensor): 561002.
    nn = ctypes.CDLL(str(double.root / "full" / "libnnopbase.so"))
    op = ctypes.CDLL(str(double.root / "full" / "libopapi_nn.so"))
    p64, u64, i32, vp = (
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_uint64,
        ctypes.c_int32,
        ctypes.c_void_p,
    )
    nn.aclCreateTensor.argtypes = [p64, u64, i32, p64, ctypes.c_int64, i32, p64, u64, vp]
    nn.aclCreateTensor.restype = vp
    nn.aclCreateTensorList.argtypes = [ctypes.POINTER(vp), u64]
    nn.aclCreateTensorList.restype = vp
    nn.aclDestroyTensorList.argtypes = [vp]
    nn.aclDestroyTensor.argtypes = [vp]
    op.aclnnForeachNonFiniteCheckAndUnscaleGetWorkspaceSize.argtypes = [vp, vp, vp, vp, vp]
    buf = ctypes.create_string_buffer(64)

    def tensor(dtype, n):
        dims = (ctypes.c_int64 * 1)(n)
        one = (ctypes.c_int64 * 1)(1)
        return nn.aclCreateTensor(dims, 1, dtype, one, 0, 2, dims, 1, buf)

    def status(specs):
        ts = [tensor(dt, n) for dt, n in specs]
        lst = nn.aclCreateTensorList((vp * len(ts))(*ts), len(ts))
        found, inv = tensor(0, 1), tensor(0, 1)
        ws, ex = ctypes.c_uint64(), vp()
        st = op.aclnnForeachNonFiniteCheckAndUnscaleGetWorkspaceSize(
            lst, found, inv, ctypes.byref(ws), ctypes.byref(ex)
        )
        assert nn.aclDestroyTensorList(lst) == 0  # destroys the tensors too
        nn.aclDestroyTensor(found)
        nn.aclDestroyTensor(inv)
        return st

    double.reset()
    assert status([(0, 4)] * 257) == 561002
    assert status([]) == 561002
    assert status([(0, 4), (1, 4)]) == 561002
    assert status([(0, 4), (0, 0)]) == 561002
    assert status([(11, 4)]) == 161002  # float64: not an operator dtype
    assert double.stats()["live_tensors"] == 0


@pytest.mark.parametrize("scale", [2.0**127, 1.7 * 2.0**127, 3 * 2.0**125])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_a_subnormal_inverse_goes_to_the_operator_as_torch_npu_passes_it(cann, scale, dtype):
    # Above 2**126 the inverse is a float32 subnormal (torch's and
    # torch_npu's ``1 / float64(scale)``, built by its bits in
    # mechanisms/floats.py): the lowering hands those bits to invScale
    # unchanged.  The double multiplies in IEEE's default mode, as the
    # device kernel sees its operand; its results equal the reference's
    # wherever they are float32 normal numbers (float16 results underflow
    # to zero in both).
    from jax_amp_scale.mechanisms.floats import inverse_scale

    rng = np.random.default_rng(3)
    big = dtype != jnp.float16
    leaves = []
    for k in range(4):
        v = rng.standard_normal(40).astype(np.float32) * np.float32(2.0**120 if big else 1.0)
        v[k] = [np.inf, -np.inf, np.nan, 2.0**121 if big else 1.0][k]
        leaves.append(jnp.asarray(v, dtype))
    inv = inverse_scale(jnp.float32(scale))
    got = _fused(inv, leaves)
    _same(got, jax.jit(reference_pass)(inv, leaves))
    assert bool(got[0])
    (gws,) = [e for e in cann.log() if e["ev"] == "foreach_gws"]
    assert gws["status"] == 0
