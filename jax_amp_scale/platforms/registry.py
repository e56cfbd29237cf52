"""Which native handler is registered for which lowering platform.

One table for both operators.  Handlers are XLA FFI capsules from the
native modules (``_native_cpu`` always, ``_native_cuda`` and
``_native_ascend`` where built); the target names come from the modules
themselves, where the C++ defines them.
"""

from __future__ import annotations

import threading
from typing import Any

import jax

# The operators that have native handlers, by the name the layers above use.
UPDATE_SCALE = "update_scale"
UNSCALE_AND_CHECK = "unscale_and_check"
OPERATORS: tuple[str, ...] = (UPDATE_SCALE, UNSCALE_AND_CHECK)
# The host report (lowering/host_report.py): native on CPU, never exported.
HOST_REPORT = "host_report"

# Lowering platform name (as `lax.platform_dependent` and `jax.export` spell
# it) -> the name `jax.ffi.register_ffi_target` wants.
XLA_PLATFORM = {"cpu": "cpu", "cuda": "CUDA", "rocm": "ROCM"}

# The native module attribute holding each operator's FFI target name.
_TARGET_ATTRIBUTE = {
    UPDATE_SCALE: "UPDATE_SCALE_TARGET",
    UNSCALE_AND_CHECK: "UNSCALE_AND_CHECK_TARGET",
    HOST_REPORT: "HOST_REPORT_TARGET",
}

_lock = threading.RLock()
_handlers: dict[str, set[str]] = {op: set() for op in (*OPERATORS, HOST_REPORT)}
_load_errors: dict[str, str] = {}
_targets: dict[str, str] = {}


def module_targets(mod: Any) -> dict[str, str]:
    """``{operator: FFI target name}`` as native module `mod` defines them
    (the host report's included)."""
    return {
        op: str(getattr(mod, attr)) for op, attr in _TARGET_ATTRIBUTE.items() if hasattr(mod, attr)
    }


def set_target_names(names: dict[str, str]) -> None:
    """Records the FFI target name of each operator (read from a native module)."""
    with _lock:
        _targets.update(names)


def target(op: str) -> str:
    """The FFI target name of `op` (e.g. ``"jas_update_scale_v2"``)."""
    with _lock:
        return _targets[op]


def register_capsule(op: str, platform: str, capsule: Any) -> None:
    """Registers `capsule` with XLA as `op`'s handler on `platform` (idempotent)."""
    platform = platform.lower()
    with _lock:
        if platform in _handlers[op]:
            return
        jax.ffi.register_ffi_target(
            target(op), capsule, platform=XLA_PLATFORM.get(platform, platform)
        )
        _handlers[op].add(platform)


def served_targets() -> frozenset[str]:
    """Every operator target name registered here (not the host report's:
    its key means nothing in another process)."""
    with _lock:
        return frozenset(name for op, name in _targets.items() if op in OPERATORS)


def mark_registered(op: str, platform: str) -> None:
    """Records a handler registered by other means (the PJRT C API)."""
    with _lock:
        _handlers[op].add(platform.lower())


def platforms(op: str) -> frozenset[str]:
    """Lowering platforms with a registered handler for `op`."""
    with _lock:
        return frozenset(_handlers[op])


def record_load_error(platform: str, message: str) -> None:
    with _lock:
        _load_errors[platform] = message


def load_errors() -> dict[str, str]:
    """Why an optional native module or a plugin registration failed, per platform."""
    with _lock:
        return dict(_load_errors)
