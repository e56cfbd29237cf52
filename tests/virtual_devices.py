"""Virtual CPU devices for a test process: XLA's flags, set before JAX starts its CPU backend.

Import it, and call `use`, before anything starts JAX's backends (importing
jax does not).
"""

from __future__ import annotations

import os
from importlib.metadata import version

_COUNT = "--xla_force_host_platform_device_count"
# Eight devices share this machine's two cores, so a collective may wait on
# devices the OS has not scheduled yet; XLA aborts the process when one
# waits past this timeout (CI saw it once, on a loaded machine).  jaxlib
# 0.6.0 has no such flag, and XLA refuses flags it does not know.
_PATIENCE = "--xla_cpu_collective_call_terminate_timeout_seconds"
_PATIENCE_FROM = (0, 10)


def use(count: int = 8) -> None:
    """Adds the device count (unless set) and a 10-minute collective timeout to XLA_FLAGS."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _COUNT not in flags:
        flags += f" {_COUNT}={count}"
    jaxlib = tuple(int(p) for p in version("jaxlib").split(".")[:2])
    if jaxlib >= _PATIENCE_FROM and _PATIENCE not in flags:
        flags += f" {_PATIENCE}=600"
    os.environ["XLA_FLAGS"] = flags.strip()
