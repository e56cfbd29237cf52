"""The host report: a Python function run on the host from inside a step.

`host_report` runs ``fn(flag, *values)`` on the host on the steps where
`flag` holds a true element.  On CPU it is a native custom call
(``jas_host_report_v1``, ffi/host_report.cc) whose handler takes the GIL
and calls `run` only then; a ``jax.debug.callback`` would put every step of
the program on JAX's synchronous Python dispatch path, even in a branch that
never runs (ARCHITECTURE.md).  Elsewhere, without the native module, and
under ``backend="reference"``, it is a ``jax.debug.callback`` inside a
``lax.cond``.  The target's ``report`` attribute keys a function of this
process, so a program with a report does not export.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.mechanisms import custom_call as cc
from jax_amp_scale.mechanisms import handlers

Report = Callable[..., None]

_lock = threading.Lock()
# Every function reported to, keyed by its id(), for the life of the
# process: a compiled program may call it at any later time (and keeping it
# alive keeps its id unique).
_reports: dict[int, Report] = {}


def run(key: int, values: list[list[Any]]) -> str | None:
    """Called by the native handler (ffi/host_report.cc): ``fn(*arrays)``;
    None, or ``"ExceptionType: message"`` for an exception it raised (the
    call's error)."""
    with _lock:
        fn = _reports.get(key)
    if fn is None:
        return f"LookupError: no host report {key} in this process"
    try:
        fn(*(np.asarray(v) for v in values))
    except Exception as e:  # a warning turned into an error included
        return f"{type(e).__name__}: {e}"
    return None


def host_report(fn: Report, flag: Any, *values: Any, backend: str = "auto") -> jax.Array:
    """`flag` (bool), after ``fn(flag, *values)`` ran on the host, with flat
    NumPy arrays, wherever some element of `flag` is true.  Use the result
    (it keeps the report in the program).  `values` are passed as bool,
    int32 or float32.  `backend` ``"reference"`` takes
    ``jax.debug.callback`` on every platform.

    An exception `fn` raises reaches the caller when the step's result is
    read, as a ``jax.errors.JaxRuntimeError`` (or a ``ValueError`` from
    JAX's C++ dispatch path) holding its type and text; a warning is issued
    while the step runs (``jax.effects_barrier`` does not wait for it)."""
    native_on = frozenset() if backend == "reference" else handlers.platforms(handlers.HOST_REPORT)
    flag = jnp.asarray(flag, jnp.bool_)
    values = tuple(_as_value(v) for v in values)

    def by_callback(flag: jax.Array, *values: jax.Array) -> jax.Array:
        def host(flag: Any, *values: Any) -> None:
            flag = np.asarray(flag)
            if flag.any():  # under vmap the cond below runs for every lane
                fn(flag.reshape(-1), *(np.asarray(v).reshape(-1) for v in values))

        # No host call on an unflagged step (a device-to-host trip on GPU).
        jax.lax.cond(jnp.any(flag), lambda: jax.debug.callback(host, flag, *values), lambda: None)
        return flag

    if not native_on:
        return by_callback(flag, *values)
    target = handlers.target(handlers.HOST_REPORT)
    with _lock:
        _reports[id(fn)] = fn

    def by_custom_call(flag: jax.Array, *values: jax.Array) -> jax.Array:
        call = jax.ffi.ffi_call(
            target,
            jax.ShapeDtypeStruct(flag.shape, jnp.bool_),
            has_side_effect=False,  # a JAX effect would bring back the slow path
            vmap_method="broadcast_all",
        )
        return call(flag, *values, report=np.int64(id(fn)))  # type: ignore[no-any-return]

    return cc.per_platform(by_custom_call, by_callback, flag, *values, native_on=native_on)  # type: ignore[no-any-return]


def _as_value(x: Any) -> jax.Array:
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_ or x.dtype == jnp.int32:
        return x
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.int32)
    return x.astype(jnp.float32)
