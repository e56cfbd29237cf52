"""The Ascend dispatch to aclnnAmpUpdateScale, proven on CPU against the CANN test double.

The test binding (``tests/ascend_harness.py``, the test extension
``_ascend_testing``) runs the production validation and dispatch code
(``ffi/handler_common.h``, ``ffi/ascend.cc``, ``ffi/ascend_dispatch.cc``)
under ``jax.jit`` with a null stream; the double (``tests/cann_double``)
implements the operator as CANN's published kernel computes it (float32
factors and product, check before cast) and records every call.  Its bits
are compared with ``tests/_cann_rule.py`` (a model written from the kernel
source) and, with the library's guard, with the reference under
``rule="cann"``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_amp_scale import amp_update_scale
from tests import ascend_harness
from tests._budget import tiered
from tests._cann_rule import cann_kernel
from tests.cann_double import control

DTYPES = (jnp.float32, jnp.float16, jnp.bfloat16)
ACL = {jnp.dtype(jnp.float32): 0, jnp.dtype(jnp.float16): 1, jnp.dtype(jnp.bfloat16): 27}
MiB = 1 << 20


def step(scale, tracker, found, gf=2.0, bf=0.5, gi=2000, rule="cann"):
    f = jax.jit(
        lambda s, t, x: ascend_harness.update_scale(
            s, t, x, growth_factor=gf, backoff_factor=bf, growth_interval=gi, rule=rule
        )
    )
    return f(scale, tracker, found)


def state(dtype, value=1024.0, tracker=0, shape=(1,)):
    return jnp.full(shape, value, dtype), jnp.full(shape, tracker, jnp.int32)


@pytest.mark.parametrize("dtype", tiered(DTYPES, keep=[jnp.float16]))
def test_descriptors_arguments_and_attributes(cann, dtype):
    s, t = state(dtype, 8.0, tracker=6)
    new_s, new_t = step(s, t, False, gf=1.1, bf=0.3, gi=7)
    want_s, want_t = amp_update_scale(
        s,
        t,
        False,
        growth_factor=1.1,
        backoff_factor=0.3,
        growth_interval=7,
        backend="reference",
        rule="cann",
    )
    assert float(new_s[0]) == float(want_s[0]) != 8.0
    assert int(new_t[0]) == int(want_t[0]) == 0

    log = cann.log()
    creates = [e for e in log if e["ev"] == "create"]
    assert len(creates) == 5
    acl = ACL[jnp.dtype(dtype)]
    # currentScale, growthTracker, foundInf, updatedScale, updatedGrowthTracker
    assert [c["dtype"] for c in creates] == [acl, 3, acl, acl, 3]
    for c in creates:
        assert c["dims"] == [1] and c["strides"] == [1] and c["storage"] == [1]
        assert c["offset"] == 0 and c["format"] == 2  # ND, contiguous
    # In place, as torch_npu calls it: outputs alias the inputs.
    assert creates[3]["data"] == creates[0]["data"]
    assert creates[4]["data"] == creates[1]["data"]
    assert len({creates[0]["data"], creates[1]["data"], creates[2]["data"]}) == 3

    (gws,) = [e for e in log if e["ev"] == "gws"]
    assert gws["args"] == [c["id"] for c in creates]
    assert gws["gf"] == 1.1 and gws["bf"] == 0.3 and gws["gi"] == 7  # exact doubles
    assert gws["lib"] == "libopapi_math.so"
    (run,) = [e for e in log if e["ev"] == "run"]
    assert run["stream"] == 0 and run["exec"] == gws["exec"] and run["status"] == 0
    destroyed = [e["id"] for e in log if e["ev"] == "destroy"]
    assert sorted(destroyed) == sorted(c["id"] for c in creates)
    assert cann.stats()["live_tensors"] == 0 and cann.stats()["live_execs"] == 0


def test_two_phase_order(cann):
    s, t = state(jnp.float32)
    for found in (False, True, False):
        s, t = step(s, t, found)
    evs = [e["ev"] for e in cann.log()]
    # Bracketed as torch_npu's EXEC_NPU_CMD_V1 brackets aclnn calls
    # (Ascend/op-plugin op_plugin/utils/op_api_common.h:370-408).
    one = ["huge_init"] + ["create"] * 5 + ["gws", "run", "huge_release"]
    one += ["destroy"] * 5 + ["huge_uninit"]
    assert evs == one * 3
    assert cann.stats()["bad_calls"] == 0


def test_huge_memory_bracket_is_closed_on_failure(cann):
    cann.fail("aclnnAmpUpdateScaleGetWorkspaceSize", 161002, "bad")
    s, t = state(jnp.float32)
    with pytest.raises(Exception, match="161002"):
        jax.block_until_ready(step(s, t, False))
    evs = [e["ev"] for e in cann.log() if e["ev"].startswith("huge")]
    assert evs == ["huge_init", "huge_uninit"]  # no release: nothing was launched
    assert cann.stats()["bad_calls"] == 0


@pytest.mark.parametrize(
    ("found", "dtype_seen"),
    [(True, None), (np.float32(np.nan), None), (jnp.int32(3), None), (0.0, None)],
)
def test_found_inf_converted_to_scale_dtype(cann, found, dtype_seen):
    s, t = state(jnp.bfloat16, 64.0, tracker=5)
    new_s, new_t = step(s, t, found)
    creates = [e for e in cann.log() if e["ev"] == "create"]
    assert creates[2]["dtype"] == 27  # foundInf has the scale's dtype
    if bool(np.asarray(found != 0)):
        assert float(new_s[0]) == 32.0 and int(new_t[0]) == 0
    else:
        assert float(new_s[0]) == 64.0 and int(new_t[0]) == 6


def test_workspace_zero_is_not_allocated(cann):
    cann.set_workspace_size(0)
    s, t = state(jnp.float16)
    step(s, t, False)
    log = cann.log()
    assert not [e for e in log if e["ev"] == "malloc"]
    (run,) = [e for e in log if e["ev"] == "run"]
    assert run["ws"] == 0 and run["ws_ptr"] == 0
    assert ascend_harness.testing().workspaces() == []


def test_workspace_of_several_mib_is_honoured_reused_grown_and_released(cann):
    cann.set_workspace_size(3 * MiB)
    s, t = state(jnp.float32)
    for _ in range(3):
        s, t = step(s, t, False)
    log = cann.log()
    mallocs = [e for e in log if e["ev"] == "malloc"]
    assert len(mallocs) == 1 and mallocs[0]["size"] == 3 * MiB  # reused, not per step
    runs = [e for e in log if e["ev"] == "run"]
    assert all(r["ws"] == 3 * MiB and r["ws_ptr"] == mallocs[0]["ptr"] for r in runs)
    assert all(r["status"] == 0 for r in runs)  # the double wrote all 3 MiB of it
    assert ascend_harness.testing().workspaces() == [(0, 0, 3 * MiB)]

    cann.set_workspace_size(5 * MiB)  # grows to at least twice the old size
    step(s, t, False)
    mallocs = [e for e in cann.log() if e["ev"] == "malloc"]
    assert [m["size"] for m in mallocs] == [3 * MiB, 6 * MiB]
    # The old buffer may still be read by a launched kernel: retired, not freed.
    assert not [e for e in cann.log() if e["ev"] == "free"]
    assert ascend_harness.testing().retired_workspaces() == 1
    assert cann.stats()["live_allocs"] == 2

    ascend_harness.testing().release_workspaces()
    frees = [e for e in cann.log() if e["ev"] == "free"]
    assert sorted(f["ptr"] for f in frees) == sorted(m["ptr"] for m in mallocs)
    assert all(f["status"] == 0 for f in frees)
    assert cann.stats()["live_allocs"] == 0


def test_no_descriptor_leaked_after_10000_calls(cann):
    cann.logging(False)
    cann.set_workspace_size(MiB)
    before = cann.stats()
    n = 10_000

    def body(_, st):
        s, t = st
        return ascend_harness.update_scale(
            s,
            t,
            t[0] % 7 == 3,
            growth_factor=2.0,
            backoff_factor=0.5,
            growth_interval=5,
            rule="torch",  # power-of-two factors: the operator serves torch's rule
            guard=True,
        )

    def ref_body(_, st):
        s, t = st
        return amp_update_scale(
            s,
            t,
            t[0] % 7 == 3,
            growth_factor=2.0,
            backoff_factor=0.5,
            growth_interval=5,
            backend="reference",
        )

    init = state(jnp.float16, 1.0)
    got = jax.jit(lambda st: jax.lax.fori_loop(0, n, body, st))(init)
    want = jax.jit(lambda st: jax.lax.fori_loop(0, n, ref_body, st))(init)
    after = cann.stats()
    assert after["gws_calls"] - before["gws_calls"] == n
    assert after["run_calls"] - before["run_calls"] == n
    assert after["created"] - before["created"] == 5 * n
    assert after["destroyed"] - before["destroyed"] == 5 * n
    assert after["live_tensors"] == 0 and after["live_execs"] == 0
    assert after["total_allocs"] - before["total_allocs"] == 1  # one workspace for all
    assert after["bad_calls"] == 0
    np.testing.assert_array_equal(
        np.asarray(got[0]).view(np.uint16), np.asarray(want[0]).view(np.uint16)
    )
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


ERRORS = [
    (161001, "ACLNN_ERR_PARAM_NULLPTR"),
    (161002, "ACLNN_ERR_PARAM_INVALID"),
    (361001, "ACLNN_ERR_RUNTIME_ERROR"),
    (561000, "ACLNN_ERR_INNER"),
    (561002, "ACLNN_ERR_INNER_TILING_ERROR"),
]


@pytest.mark.parametrize("api", ["aclnnAmpUpdateScaleGetWorkspaceSize", "aclnnAmpUpdateScale"])
@pytest.mark.parametrize(("status", "name"), ERRORS)
def test_every_error_status_is_surfaced_with_its_message(cann, api, status, name):
    cann.set_workspace_size(4096)
    cann.fail(api, status, f"injected {status} by the double")
    s, t = state(jnp.float32)
    with pytest.raises(Exception, match=f"{api} failed with status {status}") as info:
        jax.block_until_ready(step(s, t, False))
    msg = str(info.value)
    assert name in msg and f"injected {status} by the double" in msg
    stats = cann.stats()
    assert stats["live_tensors"] == 0 and stats["live_execs"] == 0
    runs = [e for e in cann.log() if e["ev"] == "run"]
    assert len(runs) == (1 if api == "aclnnAmpUpdateScale" else 0)


def test_workspace_allocation_failure_leaves_the_executor_to_cann(cann):
    # aclDestroyAclOpExecutor is documented for executors made repeatable
    # only; torch_npu's EXEC_NPU_CMD does not call it when the workspace
    # cannot be allocated either.  The descriptors are still destroyed.
    cann.set_workspace_size(2 * MiB)
    cann.fail("aclrtMalloc", 207001, "out of device memory (double)")
    s, t = state(jnp.float32)
    before = cann.stats()["live_execs"]
    with pytest.raises(Exception, match=r"aclnnAmpUpdateScale: aclrtMalloc.*207001.*out of device"):
        jax.block_until_ready(step(s, t, False))
    assert [e["ev"] for e in cann.log() if e["ev"] in ("gws", "destroy_exec", "run")] == ["gws"]
    assert cann.stats()["live_tensors"] == 0
    assert cann.stats()["live_execs"] == before + 1  # unlaunched: CANN's to reclaim


def test_descriptor_creation_failure(cann):
    cann.fail("aclCreateTensor", 1, "no descriptors today")
    s, t = state(jnp.float32)
    with pytest.raises(Exception, match=r"aclCreateTensor failed for currentScale.*no descriptors"):
        jax.block_until_ready(step(s, t, False))
    assert cann.stats()["live_tensors"] == 0


def test_vmapped_batch_is_one_operator_call_per_element(cann):
    scales = jnp.asarray([[1.0], [2.0], [4.0]], jnp.float16)
    trackers = jnp.asarray([[0], [1], [1]], jnp.int32)
    found = jnp.asarray([False, False, True])
    f = jax.jit(jax.vmap(lambda s, t, x: step(s, t, x, gi=2)))
    new_s, new_t = f(scales, trackers, found)
    np.testing.assert_array_equal(np.asarray(new_s, np.float32).ravel(), [1.0, 4.0, 2.0])
    np.testing.assert_array_equal(np.asarray(new_t).ravel(), [1, 0, 0])
    log = cann.log()
    assert len([e for e in log if e["ev"] == "gws"]) == 3
    creates = [e for e in log if e["ev"] == "create"]
    base = creates[0]["data"]
    assert [c["data"] - base for c in creates[0::5]] == [0, 2, 4]  # element i of the batch


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint16)


@pytest.mark.parametrize("dtype", tiered(DTYPES, keep=[jnp.float16]))
@pytest.mark.parametrize(
    ("gf", "bf"), tiered([(2.0, 0.5), (1.1, 0.3), (65536.0, 1e-3)], keep=[(1.1, 0.3)])
)
def test_bit_for_bit_equal_to_the_reference_lowering(cann, dtype, gf, bf):
    rng = np.random.default_rng(zlib.crc32(f"{jnp.dtype(dtype).name}{gf}".encode()))
    n, gi = 3000, 4
    finfo = jnp.finfo(dtype)
    special = np.array(
        [
            0.0,
            -0.0,
            float(finfo.max),
            float(finfo.tiny),
            float(finfo.smallest_subnormal),
            np.inf,
            -np.inf,
            1.0,
            -1.0,
            3.0,
            float(finfo.max) / 2,
            1e-30,
            7e4,
            3e38,
        ],
        np.float32,
    )
    values = np.concatenate(
        [
            special,
            np.exp(rng.uniform(-87, 88, n)).astype(np.float32) * rng.choice([-1, 1], n),
        ]
    )
    with np.errstate(over="ignore"):  # values beyond float16's range become inf
        scales = jnp.asarray(values, dtype)[:, None]
    m = scales.shape[0]
    trackers = jnp.asarray(rng.choice([0, gi - 1, gi - 2, gi, 2**31 - 1, -5], m), jnp.int32)[
        :, None
    ]
    found = jnp.asarray(rng.choice([0.0, 1.0, np.nan, -0.0, np.inf, -2.0], m), jnp.float32)

    def ours(s, t, x, guard):
        return ascend_harness.update_scale(
            s, t, x, growth_factor=gf, backoff_factor=bf, growth_interval=gi, guard=guard
        )

    def ref(s, t, x):
        return amp_update_scale(
            s,
            t,
            x,
            growth_factor=gf,
            backoff_factor=bf,
            growth_interval=gi,
            backend="reference",
            rule="cann",
        )

    cann.logging(False)
    # The operator alone is CANN's published kernel (the NumPy model).
    raw_s, raw_t = jax.jit(jax.vmap(lambda s, t, x: ours(s, t, x, False)))(scales, trackers, found)
    model = [
        cann_kernel(np.asarray(s)[0], int(t[0]), np.float32(x), gf, bf, gi)
        for s, t, x in zip(np.asarray(scales), np.asarray(trackers), np.asarray(found), strict=True)
    ]
    want_raw = np.asarray([m[0] for m in model], jnp.dtype(dtype))
    raw = np.asarray(raw_s).ravel()
    nan = np.isnan(raw.astype(np.float32))
    np.testing.assert_array_equal(nan, np.isnan(want_raw.astype(np.float32)))
    np.testing.assert_array_equal(_bits(raw)[~nan], _bits(want_raw)[~nan])
    np.testing.assert_array_equal(np.asarray(raw_t).ravel(), [m[1] for m in model])
    # With the guard after the call it is the reference's rule "cann", bit for bit.
    got_s, got_t = jax.jit(jax.vmap(lambda s, t, x: ours(s, t, x, True)))(scales, trackers, found)
    want_s, want_t = jax.jit(jax.vmap(ref))(scales, trackers, found)
    np.testing.assert_array_equal(_bits(got_s), _bits(want_s))
    np.testing.assert_array_equal(np.asarray(got_t), np.asarray(want_t))
    assert cann.stats()["gws_calls"] >= 2 * m


def test_float16_growth_to_65536_is_inf_in_the_kernel_and_guarded(cann):
    # CANN's kernel tests finiteness on the float32 product, then casts
    # (amp_update_scale.h:146-147, :165): 32768 * 2 = 65536 is stored as inf.
    s, t = state(jnp.float16, 2.0**15, tracker=0)
    raw_s, raw_t = step(s, t, False, gi=1)
    assert np.isinf(float(raw_s[0])) and int(raw_t[0]) == 0
    assert np.isinf(cann_kernel(np.float16(2.0**15), 0, 0.0, 2.0, 0.5, 1)[0])
    f = jax.jit(
        lambda s, t: ascend_harness.update_scale(
            s, t, False, growth_factor=2.0, backoff_factor=0.5, growth_interval=1, guard=True
        )
    )
    new_s, new_t = f(s, t)
    assert float(new_s[0]) == 2.0**15 and int(new_t[0]) == 0


def test_torch_rule_needs_power_of_two_factors(cann):
    s, t = state(jnp.float32, 3.0, tracker=6)
    with pytest.raises(Exception, match=r"rule 'torch'.*cannot run on aclnnAmpUpdateScale"):
        jax.block_until_ready(step(s, t, False, gf=1.1, bf=0.5, gi=7, rule="torch"))
    assert not [e for e in cann.log() if e["ev"] in ("create", "gws")]  # refused before CANN
    new_s, _ = step(s, t, False, gf=4.0, bf=0.25, gi=7, rule="torch")
    assert float(new_s[0]) == 12.0


def test_interval_out_of_range_is_a_tiling_error_in_the_double(double):
    # amp_update_scale_tiling.cpp:75: the double answers 561002 like CANN; the
    # handler never sends such an interval (checked before CANN is called).
    import ctypes

    lib = ctypes.CDLL(str(double.root / "full" / "libopapi_math.so"))
    nn = ctypes.CDLL(str(double.root / "full" / "libnnopbase.so"))
    nn.aclCreateTensor.restype = ctypes.c_void_p
    p64, u64, i32 = ctypes.POINTER(ctypes.c_int64), ctypes.c_uint64, ctypes.c_int32
    nn.aclCreateTensor.argtypes = [p64, u64, i32, p64, ctypes.c_int64, i32, p64, u64]
    nn.aclCreateTensor.argtypes += [ctypes.c_void_p]
    one = (ctypes.c_int64 * 1)(1)
    bufs = [ctypes.create_string_buffer(4) for _ in range(5)]
    dtypes = [0, 3, 0, 0, 3]
    ts = [
        nn.aclCreateTensor(one, 1, dt, one, 0, 2, one, 1, b)
        for dt, b in zip(dtypes, bufs, strict=True)
    ]
    ws, ex = ctypes.c_uint64(), ctypes.c_void_p()
    lib.aclnnAmpUpdateScaleGetWorkspaceSize.argtypes = [ctypes.c_void_p] * 3 + [
        ctypes.c_double,
        ctypes.c_double,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    try:
        st = lib.aclnnAmpUpdateScaleGetWorkspaceSize(
            ts[0], ts[1], ts[2], 2.0, 0.5, 0, ts[3], ts[4], ctypes.byref(ws), ctypes.byref(ex)
        )
        assert st == 561002
    finally:
        nn.aclDestroyTensor.argtypes = [ctypes.c_void_p]
        for t in ts:
            nn.aclDestroyTensor(t)


_TWO_DEVICES = """
import json
import jax, jax.numpy as jnp
from tests import ascend_harness
import ctypes, os
core = ctypes.CDLL(os.environ["CD_CORE"])
core.cd_set_workspace_size(ctypes.c_uint64(1 << 20))
f = jax.jit(lambda s, t: ascend_harness.update_scale(
    s, t, False, growth_factor=2.0, backoff_factor=0.5, growth_interval=9))
for d in jax.devices()[:2]:
    s = jax.device_put(jnp.ones((1,), jnp.float32), d)
    t = jax.device_put(jnp.zeros((1,), jnp.int32), d)
    for _ in range(3):
        s, t = f(s, t)
    jax.block_until_ready(s)
print(json.dumps(sorted(ascend_harness.testing().workspaces())))
"""


@pytest.mark.slow
@pytest.mark.trimmed
def test_workspace_is_cached_per_device(double, monkeypatch):
    control.use(monkeypatch, double, "full")
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "CD_CORE": str(double.root / "core" / "libcann_double.so"),
    }
    out = subprocess.run(
        [sys.executable, "-c", _TWO_DEVICES],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(Path(__file__).resolve().parents[3]),
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # One buffer per device (null stream on CPU), reused across the steps.
    assert got == [[0, 0, 1 << 20], [1, 0, 1 << 20]]


@pytest.mark.parametrize(("gf", "bf"), [(2.0, 0.5), (4.0, 0.25)])
def test_power_of_two_factors_match_torch_through_the_operator(cann, gf, bf):
    # Where the two published kernels agree (power-of-two factors), the
    # double's aclnnAmpUpdateScale with the library's guard gives
    # torch._amp_update_scale_'s bits (float32, torch's only scale dtype).
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(21)
    bits = rng.integers(0, 2**32, 400, dtype=np.uint64).astype(np.uint32)
    bits[:4] = [0x7F7FFFFF, 0x00000001, 0x7F800000, 0x3F800000]
    values = bits.view(np.float32)
    for found in (0.0, 1.0):

        def ours(s, found=found):
            return ascend_harness.update_scale(
                s,
                jnp.zeros((1,), jnp.int32),
                found,
                growth_factor=gf,
                backoff_factor=bf,
                growth_interval=1,
                rule="torch",
                guard=True,
            )[0]

        got = np.asarray(jax.jit(jax.vmap(ours))(jnp.asarray(values)[:, None])).ravel()
        want = []
        for v in values:
            s = torch.tensor([v])
            torch._amp_update_scale_(
                s, torch.zeros(1, dtype=torch.int32), torch.tensor([found]), gf, bf, 1
            )
            want.append(s.item())
        want = np.asarray(want, np.float32)
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
