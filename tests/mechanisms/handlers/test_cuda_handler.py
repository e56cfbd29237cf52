"""The CUDA handler: built where a CUDA compiler exists, registered on "CUDA".

Compilation and registration are checked everywhere nvcc is on PATH; the
numerical checks need a GPU and skip without one.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_amp_scale import amp_update_scale
from jax_amp_scale import unscale_and_check as jas_unscale_and_check
from jax_amp_scale.mechanisms import handlers

BUILT = importlib.util.find_spec("jax_amp_scale._native_cuda") is not None


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("cuda"))
    except RuntimeError:
        return False


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH: CUDA handler not built")
def test_cuda_module_is_built_where_nvcc_exists():
    assert BUILT
    import jax_amp_scale._native_cuda as mod

    assert set(mod.registrations()) == {"jas_update_scale_v2"}
    assert "cuda" in handlers.platforms("update_scale")


@pytest.mark.slow
@pytest.mark.trimmed
def test_import_without_cuda_module_still_works():
    # As on a machine without CUDA: the module cannot be imported.
    script = (
        "import sys, json; sys.modules['jax_amp_scale._native_cuda'] = None\n"
        "import jax_amp_scale\n"
        "from jax_amp_scale.mechanisms import handlers\n"
        "print(json.dumps([sorted(handlers.platforms('update_scale')), dict(handlers.LOAD_ERRORS)]))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    platforms, errors = json.loads(out.stdout.strip().splitlines()[-1])
    assert "cpu" in platforms and "cuda" not in platforms
    assert errors["cuda"].startswith("_native_cuda:")


@pytest.mark.skipif(not _has_gpu(), reason="no CUDA GPU in this process")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_cuda_handler_matches_reference_bit_for_bit(dtype):
    rng = np.random.default_rng(7)
    n = 4096
    with np.errstate(over="ignore"):
        scales = jnp.asarray(np.exp(rng.uniform(-80, 80, n)).astype(np.float32), dtype)[:, None]
    trackers = jnp.asarray(rng.choice([0, 2, 3, 2**31 - 1], n), jnp.int32)[:, None]
    found = jnp.asarray(rng.choice([0.0, 1.0, np.nan], n), jnp.float32)
    gpu = jax.devices("cuda")[0]
    args = jax.device_put((scales, trackers, found), gpu)

    def run(backend):
        f = jax.vmap(
            lambda s, t, x: amp_update_scale(
                s, t, x, growth_factor=2.0, backoff_factor=0.5, growth_interval=4, backend=backend
            )
        )
        return jax.jit(f)(*args)

    got, want = run("ffi"), run("reference")
    bits = np.uint32 if jnp.dtype(dtype).itemsize == 4 else np.uint16
    np.testing.assert_array_equal(np.asarray(got[0]).view(bits), np.asarray(want[0]).view(bits))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


def test_gpu_tier_skips_only_the_missing_native_pass_off_the_cpu():
    # The real error: the native gradient pass lowered for CUDA, which has
    # no handler for it (the GPU tier's skip rule, tests/gpu_tier.py).
    from tests.gpu_tier import missing_native_handler

    def f(g):
        return jas_unscale_and_check([g], 2.0**15, backend="ffi")

    traced = jax.jit(f).trace(jnp.ones(4, jnp.float32))
    with pytest.raises(NotImplementedError) as info:
        traced.lower(lowering_platforms=("cuda",))
    reason = missing_native_handler(info.value, "gpu")
    assert reason is not None and "platform 'cuda'" in reason
    assert missing_native_handler(info.value, "cpu") is None
    assert missing_native_handler(ValueError(str(info.value)), "gpu") is None


def test_default_step_lowers_for_cuda_as_pure_jax():
    """What a GPU compiles, lowered here: the default ``loss_scaled`` adam
    step for CUDA has no custom call ("auto" takes the pure-JAX pass and
    update on CUDA), while the same step for CPU has both native calls.
    (Host reports are off: JAX cannot lower a host callback for a platform
    this process has no backend for.)"""
    optax = pytest.importorskip("optax")
    import jax_amp_scale as jas
    from jax_amp_scale.optax import loss_scaled

    params = {"w": jnp.ones((4, 4)), "b": jnp.ones(4)}
    tx = loss_scaled(optax.adam(1e-3), jas.dynamic_scaler(2.0**15), host_reports=False)

    def step(p, s):
        updates, s = tx.update(jax.tree.map(jnp.ones_like, p), s, p)
        return optax.apply_updates(p, updates), s

    traced = jax.jit(step).trace(params, tx.init(params))
    cuda = traced.lower(lowering_platforms=("cuda",)).as_text()
    cpu = traced.lower(lowering_platforms=("cpu",)).as_text()
    assert "custom_call" not in cuda
    assert "jas_unscale_and_check_v1" in cpu and "jas_update_scale_v2" in cpu
