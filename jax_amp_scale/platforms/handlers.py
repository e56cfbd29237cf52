"""The native handlers: which runs on which lowering platform, loaded on first use.

One table for both operators (and the host report): XLA FFI capsules from
the native modules, registered under the target names the modules define
(ffi/targets.h).  Importing this module does no work and sets no JAX hook.

The built-in modules (``_native_cpu`` required, ``_native_cuda`` where it was
built) register their capsules the first time a layer above asks which
platforms have a handler.  Plugin platforms named in
``$JAX_AMP_SCALE_PLUGIN_PLATFORMS`` (default ``ascend,npu``) are registered
through `jax_amp_scale.plugin.register` at that moment too, when JAX runs
such a backend; a failure is kept in `load_errors` instead of raised.

Without the compiled modules (an install whose ``_native_cpu`` does not load,
or ``JAX_AMP_SCALE_DISABLE_NATIVE=1``) the package still imports and works:
no platform has a native handler, so ``backend="auto"`` runs the pure-JAX
reference everywhere (the same bits) and ``backend="ffi"`` raises an error
saying why.  A module that fails to load is reported once, as a
`RuntimeWarning` at first use, and kept in `load_errors`.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import warnings
from types import ModuleType
from typing import Any

import jax

# The operators that have native handlers, by the name the layers above use.
UPDATE_SCALE = "update_scale"
UNSCALE_AND_CHECK = "unscale_and_check"
OPERATORS: tuple[str, ...] = (UPDATE_SCALE, UNSCALE_AND_CHECK)
# The host report (lowering/ffi_calls.py): native on CPU, never exported.
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

# One lock for the table and the loading (which writes the table).
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


def register_capsule(op: str, platform: str, capsule: Any) -> None:
    """Registers `capsule` with XLA as `op`'s handler on `platform` (idempotent)."""
    platform = platform.lower()
    with _lock:
        if platform in _handlers[op]:
            return
        jax.ffi.register_ffi_target(
            _targets[op], capsule, platform=XLA_PLATFORM.get(platform, platform)
        )
        _handlers[op].add(platform)


def mark_registered(op: str, platform: str) -> None:
    """Records a handler registered by other means (the PJRT C API)."""
    with _lock:
        _handlers[op].add(platform.lower())


def registered_platforms(op: str) -> frozenset[str]:
    """Lowering platforms with a handler registered so far for `op` (no loading)."""
    with _lock:
        return frozenset(_handlers[op])


def record_load_error(platform: str, message: str) -> None:
    with _lock:
        _load_errors[platform] = message


_DEFAULT_PLUGIN_PLATFORMS = ("ascend", "npu")
# User switch: never load the compiled modules (every operator runs the
# pure-JAX reference; the automatic plugin registration is skipped too).
DISABLE_ENV = "JAX_AMP_SCALE_DISABLE_NATIVE"

_builtins_loaded = False
_plugins_tried: set[str] = set()


def register_module(mod: ModuleType, platform: str) -> None:
    """Registers every handler `mod` hands out for `platform`, under the
    versioned target names the module defines (ffi/targets.h)."""
    names = module_targets(mod)
    with _lock:
        _targets.update(names)
    capsules = mod.registrations()
    for op, name in names.items():
        if name in capsules:
            register_capsule(op, platform, capsules[name])


def native_disabled() -> bool:
    """Whether ``$JAX_AMP_SCALE_DISABLE_NATIVE`` turns the compiled modules off."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


# Why the compiled modules are not in use (None while they are).
_unavailable: str | None = None
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _caller_stacklevel() -> int:
    """The `warnings.warn` stacklevel of the first frame outside this package and JAX."""
    inside = (_PACKAGE_DIR + os.sep, os.path.dirname(os.path.abspath(jax.__file__)) + os.sep)
    frame, level = sys._getframe(1), 1  # the caller of this function: where warn is called
    while frame.f_back is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def _load_builtins() -> None:
    global _builtins_loaded, _unavailable
    if _builtins_loaded:
        return
    _builtins_loaded = True  # one try (and at most one warning) per process
    if native_disabled():
        _unavailable = f"the native modules are turned off by {DISABLE_ENV}=1"
        record_load_error("cpu", _unavailable)
        return
    try:  # built with every install; missing only from a broken or foreign one
        cpu = importlib.import_module("jax_amp_scale._native_cpu")
    except ImportError as e:
        _unavailable = f"the compiled module jax_amp_scale._native_cpu could not be loaded ({e})"
        record_load_error("cpu", _unavailable)
        warnings.warn(
            f"jax_amp_scale: {_unavailable}. Every operator runs the pure-JAX reference "
            'backend (backend="auto" picks it; the results are the same bits, only the '
            'native speed-ups are lost), and backend="ffi" raises. Install a wheel built '
            "for this platform, or build from source (a C++17 compiler and CMake); set "
            f"{DISABLE_ENV}=1 to use the reference without this warning.",
            RuntimeWarning,
            stacklevel=_caller_stacklevel(),
        )
        return
    register_module(cpu, "cpu")
    try:  # optional: built only where CMake found a working CUDA compiler
        register_module(importlib.import_module("jax_amp_scale._native_cuda"), "cuda")
    except ImportError as e:
        record_load_error("cuda", f"_native_cuda: {e}")


def plugin_platforms() -> tuple[str, ...]:
    """Plugin platforms registered automatically (``$JAX_AMP_SCALE_PLUGIN_PLATFORMS``)."""
    raw = os.environ.get("JAX_AMP_SCALE_PLUGIN_PLATFORMS")
    if raw is None:
        return _DEFAULT_PLUGIN_PLATFORMS
    return tuple(p.strip().lower() for p in raw.split(",") if p.strip())


def _backend_running(platform: str) -> bool:
    try:
        return bool(jax.devices(platform))
    except RuntimeError:  # JAX has no such backend in this process
        return False


def _register_plugins() -> None:
    if _unavailable is not None:
        return
    for platform in plugin_platforms():
        if platform in _plugins_tried:
            continue
        _plugins_tried.add(platform)  # JAX's backends do not change once running
        if not _backend_running(platform):
            continue
        # pjrt registers through this module's table: imported here, at
        # first use, so that neither module needs the other while loading.
        from jax_amp_scale.platforms import pjrt

        try:
            pjrt.register(platform=platform)
        except Exception as e:  # kept for load_errors(); "auto" takes the reference
            record_load_error(platform, f"automatic plugin registration: {e}")


def platforms(op: str) -> frozenset[str]:
    """Lowering platforms with a native handler for `op`, loading them first."""
    with _lock:
        _load_builtins()
        _register_plugins()
    return registered_platforms(op)


def target(op: str) -> str:
    """`op`'s FFI target name; a RuntimeError without the native modules."""
    with _lock:
        _load_builtins()
    if _unavailable is not None:
        raise RuntimeError(
            f"jax_amp_scale: backend='ffi' needs the native handlers, but {_unavailable}; "
            "use backend='auto' or 'reference'"
        )
    with _lock:
        return _targets[op]


def served_targets() -> frozenset[str]:
    """Every FFI target name the native handlers serve (what a serialized
    program of this library may call)."""
    with _lock:
        _load_builtins()
        return frozenset(name for op, name in _targets.items() if op in OPERATORS)


def load_errors() -> dict[str, str]:
    """Why an optional native module or plugin registration did not load."""
    with _lock:
        _load_builtins()
        return dict(_load_errors)
