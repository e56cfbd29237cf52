"""Register the native handlers on a PJRT plugin platform (Ascend, CUDA).

A plugin's Python side may forward ``jax.ffi.register_ffi_target(...,
platform=name)`` to the plugin (the jax CUDA plugin does when its
``jax_cuda12_plugin`` companion is installed); the public experimental
Ascend plugin does not.  `register` takes whichever route works:
``"jax.ffi"`` where that forwarding exists, else ``"pjrt"``: the plugin
library's PJRT C API FFI extension (``plugin/pjrt_register.cc``).  Without
a call, `jax_amp_scale.platforms.handlers` registers the platforms named in
``$JAX_AMP_SCALE_PLUGIN_PLATFORMS`` at first use (docs/guide/plugins.md).
The two JAX internals a registration reads are isolated in
`jax_amp_scale.platforms.jax_internals`.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import threading
from typing import Any

from jax_amp_scale.platforms import handlers, jax_internals

__all__ = ["PluginRegistrationError", "register", "register_in_api", "registrations"]

# Lowering platform -> the platform name the plugin's FFI registry uses.
_REGISTRY_PLATFORM = {"cuda": "CUDA", "gpu": "CUDA", "rocm": "ROCM"}


class PluginRegistrationError(RuntimeError):
    """The handler could not be registered on the plugin platform."""


_lock = threading.Lock()
# (PJRT_Api address, registry platform lowercased, target) -> handler address.
_done: dict[tuple[int, str, str], int] = {}
_routes: dict[str, str] = {}


def _capsule_pointer(capsule: Any, name: bytes | None) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    if name is None:
        name = get_name(capsule)
    return int(get(capsule, name))


def _default_handler(platform: str, op: str = handlers.UPDATE_SCALE) -> Any:
    if platform in ("cuda", "gpu"):
        try:
            mod = importlib.import_module("jax_amp_scale._native_cuda")
        except ImportError as e:
            raise PluginRegistrationError(
                "the CUDA handler was not built (jax_amp_scale._native_cuda is "
                f"missing: {e}); rebuild with a CUDA compiler on PATH"
            ) from None
        return mod.registrations()[handlers.module_targets(mod)[handlers.UPDATE_SCALE]]
    from jax_amp_scale.platforms import ascend

    return ascend.handler_capsule(op)


def loaded_plugin_api(platform: str) -> int:
    c_apis = jax_internals.loaded_plugin_c_apis()
    c_api = c_apis.get(platform)
    if c_api is None:
        raise PluginRegistrationError(
            f"JAX has not loaded a PJRT plugin named {platform!r} (PJRT plugins "
            f"loaded: {sorted(c_apis) or 'none'}); install the plugin, or pass "
            "library_path= to the plugin's .so"
        )
    return _capsule_pointer(c_api, b"pjrt_c_api")


def _check_is_loaded_plugin(platform: str, path: str, api: int) -> None:
    """Raises unless `path`'s PJRT API is the one JAX loaded for `platform`.

    ``GetPjrtApi()`` returns one static table per loaded library, and
    dlopen of a library already loaded returns that library: the same file
    gives the same address, another file (another plugin, another copy)
    another one.
    """
    try:
        loaded = loaded_plugin_api(platform)
    except PluginRegistrationError:
        plugins = sorted(jax_internals.loaded_plugin_c_apis())
        raise PluginRegistrationError(
            f"cannot register on platform {platform!r} through {path}: JAX has not "
            f"loaded a PJRT plugin for {platform!r} (PJRT plugins loaded: "
            f"{plugins or 'none'}), so a handler registered there would never run. "
            "Install and select the platform's plugin (JAX_PLATFORMS); a plugin "
            "this process loads itself goes through pjrt.register_in_api"
        ) from None
    if loaded != api:
        raise PluginRegistrationError(
            f"{path} is not the PJRT plugin JAX loaded for platform {platform!r} "
            f"(its PJRT API is at 0x{api:x}, JAX's at 0x{loaded:x}); registering in "
            "it would not reach that platform. Omit library_path= to use the "
            "loaded plugin"
        )


def register(
    platform: str = "ascend",
    library_path: str | os.PathLike[str] | None = None,
    *,
    registry_platform: str | None = None,
    handler: Any = None,
    target: str | None = None,
) -> str:
    """Registers the update-scale handler on the PJRT plugin platform `platform`.

    Args:
      platform: the JAX platform name of the plugin (``"ascend"`` for the
        Ascend plugin; ``"cuda"`` for the jax CUDA plugin).
      library_path: the plugin's shared library.  Default: the library JAX
        loaded for `platform` (JAX must have discovered the plugin).  A path
        must be that same library (its ``GetPjrtApi()`` must return the API
        JAX loaded for `platform`): a handler registered in another plugin,
        or under a platform JAX does not run, would never be called, or
        would be called for the wrong device.
      registry_platform: the platform name inside the plugin's FFI registry
        (default: ``"CUDA"`` for cuda, else `platform`).
      handler: an XLA FFI handler capsule (default: the Ascend handler, or the
        CUDA one for cuda).
      target: the custom-call target name (default: the update-scale
        target, ``"jas_update_scale_v2"``; on Ascend, with the default handler,
        the fused gradient pass ``"jas_unscale_and_check_v1"`` is registered
        too).

    Returns:
      The route used: ``"jax.ffi"``, ``"pjrt"`` (C API, newer argument
      layout) or ``"pjrt-versioned"`` (C API, older layout with api_version).

    Idempotent: registering the same handler again returns without calling
    the plugin.  Raises `PluginRegistrationError` when the library is not a
    PJRT plugin or not the one JAX loaded for `platform`, has no FFI
    extension, has an FFI extension of a version this module does not know,
    when the plugin reports an error, or when another handler was already
    registered here for the same target and platform.
    """
    platform = str(platform).lower()
    reg_platform = registry_platform or _REGISTRY_PLATFORM.get(platform, platform)
    if handler is None:
        _default_handler(platform)  # a handler that was not built: say so first
    if library_path is None and jax_internals.python_side_forwards(reg_platform):
        return _register(platform, None, reg_platform, handler, target)
    try:
        if library_path is not None:
            plugin_module = importlib.import_module("jax_amp_scale._native_plugin")
            api = plugin_module.api_from_library(os.fspath(library_path))
            _check_is_loaded_plugin(platform, os.fspath(library_path), api)
        else:
            api = loaded_plugin_api(platform)
    except RuntimeError as e:
        if isinstance(e, PluginRegistrationError):
            raise
        raise PluginRegistrationError(str(e)) from None
    return _register(platform, api, reg_platform, handler, target)


def register_in_api(
    api: int,
    platform: str,
    *,
    registry_platform: str | None = None,
    handler: Any = None,
    target: str | None = None,
) -> str:
    """`register` into the PJRT API table at address `api` (a ``PJRT_Api*``,
    e.g. from ``jax_amp_scale._native_plugin.api_from_library``), which the
    caller vouches is the plugin that runs `platform`: no check that JAX
    loaded it.  For embedders that load a plugin themselves, and test
    doubles.  Returns the route (``"pjrt"`` or ``"pjrt-versioned"``)."""
    platform = str(platform).lower()
    reg_platform = registry_platform or _REGISTRY_PLATFORM.get(platform, platform)
    return _register(platform, int(api), reg_platform, handler, target)


def _register(
    platform: str, api: int | None, reg_platform: str, handler: Any, target: str | None
) -> str:
    """Registers through ``jax.ffi`` (`api` None) or the PJRT C API at `api`."""
    targets = handlers.module_targets(importlib.import_module("jax_amp_scale._native_cpu"))
    if handler is None and target is None and platform not in ("cuda", "gpu"):
        # Ascend: the fused gradient pass too (aclnnForeachNonFiniteCheckAndUnscale).
        _register(
            platform,
            api,
            reg_platform,
            _default_handler(platform, handlers.UNSCALE_AND_CHECK),
            targets[handlers.UNSCALE_AND_CHECK],
        )
    target = targets[handlers.UPDATE_SCALE] if target is None else str(target)
    op = {v: k for k, v in targets.items()}.get(target)
    capsule = handler if handler is not None else _default_handler(platform)
    handler_address = _capsule_pointer(capsule, None)

    with _lock:
        key = (0 if api is None else api, reg_platform.lower(), target)
        previous = _done.get(key)
        if previous is not None:
            if previous != handler_address:
                raise PluginRegistrationError(
                    f"conflicting registration: target {target!r} on platform "
                    f"{reg_platform!r} already has another handler (0x{previous:x}) "
                    f"in this plugin; not replacing it with 0x{handler_address:x}"
                )
            if op is not None:
                handlers.mark_registered(op, platform)
            return _routes[platform]
        if api is None:
            import jax

            jax.ffi.register_ffi_target(target, capsule, platform=reg_platform)
            route = "jax.ffi"
        else:
            native = importlib.import_module("jax_amp_scale._native_plugin")
            try:
                layout = native.register_handler(api, target, capsule, reg_platform)
            except RuntimeError as e:
                raise PluginRegistrationError(str(e)) from None
            route = "pjrt" if layout == "typed" else "pjrt-versioned"
        _done[key] = handler_address
        _routes[platform] = route
    if op is not None:
        handlers.mark_registered(op, platform)
    return route


def registrations() -> dict[str, str]:
    """Platforms registered by `register` in this process, with the route used."""
    with _lock:
        return dict(_routes)
