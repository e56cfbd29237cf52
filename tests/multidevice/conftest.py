"""Eight virtual CPU devices for the sharding, shard_map and population tests.

XLA reads the flag once, when JAX starts its CPU backend, so this process
must be started for these tests alone: `python -m pytest tests/multidevice`
with ``JAS_MULTIDEVICE=1`` (tests/test_multidevice.py does that).
"""

import os

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}=8".strip()
