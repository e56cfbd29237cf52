"""Host reports from a jitted step: a function run on the host on flagged steps.

`report` is what the training layer's warnings and errors run through
(`lowering.host_report` says how: a native custom call on CPU, a
``jax.debug.callback`` elsewhere and under ``backend="reference"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jax_amp_scale.lowering import host_report
from jax_amp_scale.ops import dispatch


def report(fn: Callable[..., None], flag: Any, *values: Any, backend: str = "auto") -> jax.Array:
    """`flag` (bool), after ``fn(flag, *values)`` ran on the host, with flat
    NumPy arrays, wherever some element of `flag` is true.  Use the result
    (it keeps the report in the program).  `backend` ``"reference"`` takes
    ``jax.debug.callback`` on every platform."""
    native_on, target = dispatch.host_report_plan(backend)
    return host_report.report(fn, flag, *values, native_on=native_on, target=target)
