"""Session-wide test setup."""

import os

# Tests that check bits compare against NumPy; keep JAX on the host CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Eight virtual CPU devices for the multi-device tests (test_sharding.py,
# test_shard_map.py, test_population.py).  XLA reads the flag once, when JAX
# starts its CPU backend, so it is set here, before any test module touches
# JAX; pytest imports this file first.  Single-device tests are unaffected:
# un-sharded arrays live on device 0.  An explicit setting in the environment
# wins; the multi-device tests skip when fewer than 8 devices are present.
_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
if _DEVICE_COUNT_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_COUNT_FLAG}=8".strip()
