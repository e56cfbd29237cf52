"""The backend choice: one rule, one immutable configuration, for both operators.

`configured` is the one seam for changing it (the Ascend-on-CPU test harness
uses it); `DispatchConfig` documents what can change.
"""

from jax_amp_scale.dispatch.backends import DEFAULT_CONFIG, DispatchConfig, config, configured

__all__ = ["DEFAULT_CONFIG", "DispatchConfig", "config", "configured"]
