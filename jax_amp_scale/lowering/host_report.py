"""Reports to the host from inside a jitted step, without a host callback on CPU.

``report(fn, flag, *values)`` runs ``fn(flag, *values)`` on the host, with
NumPy arrays, whenever the call executes with some element of `flag` true,
and returns `flag` (use the result: it keeps the call in the program).

On CPU this is one custom call (``jas_host_report_v1``,
ffi/host_report_cpu.cc) that calls back into this module.  JAX runs a
program holding a ``jax.debug.callback`` synchronously, through its Python
dispatch path, on every step, even when the callback sits in a branch that
never runs (bench/probe_step_overhead.py measures it); an ordinary custom
call keeps the step on JAX's fast, asynchronous path.  Elsewhere (and
without the native module) the report is a ``jax.debug.callback``.

What this changes for the caller: an exception `fn` raises reaches the
caller as a ``jax.errors.JaxRuntimeError`` (or a ``ValueError`` from JAX's
C++ dispatch path) whose message holds the exception's type and text, when
the step's result is read; a warning is
issued while the step runs, so read a result (``jax.block_until_ready``)
before you expect it (``jax.effects_barrier`` does not wait for it).  The
values reach `fn` flattened to one dimension (a ``vmap`` batch, for
example).  Programs with a report do not export (`jax.export` cannot
serialize it, nor a host callback).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.lowering.custom_call import per_platform

Report = Callable[..., None]

_lock = threading.Lock()
# Every function reported to, keyed by its id(), for the life of the
# process: a compiled program may call it at any later time (and keeping it
# alive keeps its id unique).
_reports: dict[int, Report] = {}


def _key(fn: Report) -> int:
    with _lock:
        _reports[id(fn)] = fn
    return id(fn)


def run(key: int, values: list[list[Any]]) -> str | None:
    """Called by the native handler (ffi/host_report_cpu.cc): ``fn(*arrays)``;
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


def report(
    fn: Report, flag: Any, *values: Any, native_on: frozenset[str], target: str | None
) -> jax.Array:
    """`flag` (a bool array), after ``fn(flag, *values)`` ran on the host where
    some element of `flag` is true.

    `values` are bool, int32 or float32 arrays (other floats are passed as
    float32).  The custom call `target` serves the lowering platforms in
    `native_on`; ``jax.debug.callback`` the others.
    """
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

    if not native_on or target is None:
        return by_callback(flag, *values)
    key = _key(fn)

    def by_custom_call(flag: jax.Array, *values: jax.Array) -> jax.Array:
        call = jax.ffi.ffi_call(
            target,
            jax.ShapeDtypeStruct(flag.shape, jnp.bool_),
            has_side_effect=False,  # a JAX effect would bring back the slow path
            vmap_method="broadcast_all",
        )
        return call(flag, *values, report=np.int64(key))  # type: ignore[no-any-return]

    return per_platform(by_custom_call, by_callback, flag, *values, native_on=native_on)  # type: ignore[no-any-return]


def _as_value(x: Any) -> jax.Array:
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_ or x.dtype == jnp.int32:
        return x
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.int32)
    return x.astype(jnp.float32)
