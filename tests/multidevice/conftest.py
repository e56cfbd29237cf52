"""Eight virtual CPU devices for the sharding, shard_map and population tests.

XLA reads the flag once, when JAX starts its CPU backend, so this process
must be started for these tests alone: `python -m pytest tests/multidevice`
with ``JAS_MULTIDEVICE=1`` (tests/test_multidevice.py does that).
"""

from tests import virtual_devices

virtual_devices.use(8)

import jax  # noqa: E402  (after the flag: XLA reads it when JAX starts its backend)
import pytest  # noqa: E402

# The partitioner this jax uses by default runs in the quick tier, the other
# in the slow one: each jax CI tests (the oldest too) keeps the default its
# users get.  Not "trimmed": several of these tests have slow cases of their
# own, which the fixed-file runs must not select.
_SHARDY_DEFAULT = jax.config.jax_use_shardy_partitioner
_OTHER = pytest.mark.slow


@pytest.fixture(
    params=[
        pytest.param(True, marks=() if _SHARDY_DEFAULT else _OTHER),
        pytest.param(False, marks=_OTHER if _SHARDY_DEFAULT else ()),
    ],
    ids=["shardy", "gspmd"],
)
def partitioner(request):
    """Each test once under Shardy and once under GSPMD (jit's caches cleared)."""
    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", request.param)
    jax.clear_caches()
    yield request.param
    jax.config.update("jax_use_shardy_partitioner", old)
    jax.clear_caches()
