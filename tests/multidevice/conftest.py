"""Eight virtual CPU devices for the sharding, shard_map and population tests.

XLA reads the flag once, when JAX starts its CPU backend, so this process
must be started for these tests alone: `python -m pytest tests/multidevice`
with ``JAS_MULTIDEVICE=1`` (tests/test_multidevice.py does that).
"""

from tests import virtual_devices

virtual_devices.use(8)

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
