"""Loads the native handlers on first use: no work and no JAX hook at import.

The built-in modules (``_native_cpu`` required, ``_native_cuda`` where it was
built) register their capsules the first time a layer above asks which
platforms have a handler.  Plugin platforms named in
``$JAX_AMP_SCALE_PLUGIN_PLATFORMS`` (default ``ascend,npu``) are registered
through `jax_amp_scale.plugin.register` at that moment too, when JAX runs
such a backend; a failure is kept in `load_errors` instead of raised.
"""

from __future__ import annotations

import importlib
import os
import threading
from types import ModuleType

import jax

from jax_amp_scale.platforms import pjrt, registry

_DEFAULT_PLUGIN_PLATFORMS = ("ascend", "npu")

_lock = threading.Lock()
_builtins_loaded = False
_plugins_tried: set[str] = set()


def _import(module: str) -> ModuleType:
    return importlib.import_module(f"jax_amp_scale.{module}")


def register_module(mod: ModuleType, platform: str) -> None:
    """Registers every handler `mod` hands out for `platform`: the current
    targets, and the older versions that serialized programs may name
    (ffi/targets.h)."""
    names = registry.module_targets(mod)
    registry.set_target_names(names)
    capsules = mod.registrations()
    for op, name in names.items():
        if name in capsules:
            registry.register_capsule(op, platform, capsules[name])
    current = set(names.values())
    for name, capsule in capsules.items():
        if name not in current:
            registry.register_older_target(name, platform, capsule)


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    register_module(_import("_native_cpu"), "cpu")  # always built: fail loudly
    try:  # optional: built only where CMake found a working CUDA compiler
        register_module(_import("_native_cuda"), "cuda")
    except ImportError as e:
        registry.record_load_error("cuda", f"_native_cuda: {e}")
    _builtins_loaded = True


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
    for platform in plugin_platforms():
        if platform in _plugins_tried:
            continue
        _plugins_tried.add(platform)  # JAX's backends do not change once running
        if not _backend_running(platform):
            continue
        try:
            pjrt.register(platform=platform)
        except Exception as e:  # kept for load_errors(); "auto" takes the reference
            registry.record_load_error(platform, f"automatic plugin registration: {e}")


def platforms(op: str) -> frozenset[str]:
    """Lowering platforms with a native handler for `op`, loading them first."""
    with _lock:
        _load_builtins()
        _register_plugins()
    return registry.platforms(op)


def target(op: str) -> str:
    """`op`'s FFI target name."""
    with _lock:
        _load_builtins()
    return registry.target(op)


def served_targets() -> frozenset[str]:
    """Every FFI target name the native handlers serve, current and older
    versions (what a serialized program of this library may call)."""
    with _lock:
        _load_builtins()
    return registry.served_targets()


def load_errors() -> dict[str, str]:
    """Why an optional native module or plugin registration did not load."""
    with _lock:
        _load_builtins()
    return registry.load_errors()
