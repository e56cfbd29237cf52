"""Loads the native handlers on first use: no work and no JAX hook at import.

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

import jax

from jax_amp_scale.platforms import pjrt, registry

_DEFAULT_PLUGIN_PLATFORMS = ("ascend", "npu")
# User switch: never load the compiled modules (every operator runs the
# pure-JAX reference; the automatic plugin registration is skipped too).
DISABLE_ENV = "JAX_AMP_SCALE_DISABLE_NATIVE"

_lock = threading.Lock()
_builtins_loaded = False
_plugins_tried: set[str] = set()


def _import(module: str) -> ModuleType:
    return importlib.import_module(f"jax_amp_scale.{module}")


def register_module(mod: ModuleType, platform: str) -> None:
    """Registers every handler `mod` hands out for `platform`, under the
    versioned target names the module defines (ffi/targets.h)."""
    names = registry.module_targets(mod)
    registry.set_target_names(names)
    capsules = mod.registrations()
    for op, name in names.items():
        if name in capsules:
            registry.register_capsule(op, platform, capsules[name])


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
        registry.record_load_error("cpu", _unavailable)
        return
    try:  # built with every install; missing only from a broken or foreign one
        cpu = _import("_native_cpu")
    except ImportError as e:
        _unavailable = f"the compiled module jax_amp_scale._native_cpu could not be loaded ({e})"
        registry.record_load_error("cpu", _unavailable)
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
        register_module(_import("_native_cuda"), "cuda")
    except ImportError as e:
        registry.record_load_error("cuda", f"_native_cuda: {e}")


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
    """`op`'s FFI target name; a RuntimeError without the native modules."""
    with _lock:
        _load_builtins()
    if _unavailable is not None:
        raise RuntimeError(
            f"jax_amp_scale: backend='ffi' needs the native handlers, but {_unavailable}; "
            "use backend='auto' or 'reference'"
        )
    return registry.target(op)


def served_targets() -> frozenset[str]:
    """Every FFI target name the native handlers serve (what a serialized
    program of this library may call)."""
    with _lock:
        _load_builtins()
    return registry.served_targets()


def load_errors() -> dict[str, str]:
    """Why an optional native module or plugin registration did not load."""
    with _lock:
        _load_builtins()
    return registry.load_errors()
