"""Eight virtual CPU devices for the sharding, shard_map and population tests.

XLA reads the flag once, when JAX starts its CPU backend, so this process
must be started for these tests alone: `python -m pytest tests/multidevice`
with ``JAS_MULTIDEVICE=1`` (tests/test_multidevice.py does that).
"""

import os

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}=8".strip()

import jax  # noqa: E402  (after the flag: XLA reads it when JAX starts its backend)
import pytest  # noqa: E402


@pytest.fixture(params=[True, False], ids=["shardy", "gspmd"])
def partitioner(request):
    """Each test once under Shardy and once under GSPMD (jit's caches cleared)."""
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", request.param)
    jax.clear_caches()
    yield request.param
    jax.config.update("jax_use_shardy_partitioner", old)
    jax.clear_caches()
