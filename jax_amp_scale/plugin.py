"""Without a call of `register`, the platforms named in
``$JAX_AMP_SCALE_PLUGIN_PLATFORMS`` (default ``ascend,npu``) are registered at
the library's first use (docs/guide/plugins.md).  A call picks the plugin
library explicitly and raises what the automatic registration only records.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import jax
import jax.numpy as jnp

from jax_amp_scale.mechanisms import handlers, jax_internals
from jax_amp_scale.mechanisms.handlers import CannLoadError, PluginRegistrationError, load_cann

__all__ = [
    "CannLoadError",
    "PluginRegistrationError",
    "load_cann",
    "register",
    "register_in_api",
    "registrations",
    "saturated_as_overflow",
]


def _library_api(platform: str, library_path: str | os.PathLike[str], handler: Any) -> int:
    """The PJRT API table of `library_path`, checked to be the plugin JAX
    loaded for `platform` (`register`'s ``library_path``).

    ``GetPjrtApi()`` returns one static table per loaded library, and dlopen of
    a library already loaded returns that library: the same file gives the same
    address, another file (another plugin, another copy) another one.
    """
    if handler is None:
        handlers.default_handler(platform)  # a handler that was not built: say so first
    path = os.fspath(library_path)
    try:
        plugin_module = importlib.import_module("jax_amp_scale._native_plugin")
        api: int = plugin_module.api_from_library(path)
    except RuntimeError as e:
        raise PluginRegistrationError(str(e)) from None
    try:
        loaded = handlers.loaded_plugin_api(platform)
    except PluginRegistrationError:
        plugins = sorted(jax_internals.loaded_plugin_c_apis())
        raise PluginRegistrationError(
            f"cannot register on platform {platform!r} through {path}: JAX has not "
            f"loaded a PJRT plugin for {platform!r} (PJRT plugins loaded: "
            f"{plugins or 'none'}), so a handler registered there would never run. "
            "Install and select the platform's plugin (JAX_PLATFORMS); a plugin "
            "this process loads itself goes through register_in_api"
        ) from None
    if loaded != api:
        raise PluginRegistrationError(
            f"{path} is not the PJRT plugin JAX loaded for platform {platform!r} "
            f"(its PJRT API is at 0x{api:x}, JAX's at 0x{loaded:x}); registering in "
            "it would not reach that platform. Omit library_path= to use the "
            "loaded plugin"
        )
    return api


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
        Ascend plugin; ``"cuda"`` for the jax CUDA plugin; any case).
      library_path: the plugin's shared library.  Default: the library JAX
        loaded for `platform` (JAX must have discovered the plugin), except
        where the plugin's Python side forwards
        ``jax.ffi.register_ffi_target`` for `registry_platform` (as the jax
        CUDA plugin's does): then through ``jax.ffi``, with no library.  A
        path must be that same library (its ``GetPjrtApi()`` must return the
        API JAX loaded for `platform`), or the handler would never run.
      registry_platform: the platform name inside the plugin's FFI registry
        (default: ``"CUDA"`` for cuda or gpu, ``"ROCM"`` for rocm, else
        `platform` lowercased).
      handler: an XLA FFI handler capsule (default: the CUDA handler for
        cuda or gpu, else the Ascend one).
      target: the custom-call target name (default: the update-scale
        target, ``"jas_update_scale_v2"``; with the default handler and
        target, on a platform other than cuda or gpu, the gradient pass
        ``"jas_unscale_and_check_v1"`` is registered too).

    Returns:
      The route used: ``"jax.ffi"``, ``"pjrt"`` (C API, newer argument
      layout) or ``"pjrt-versioned"`` (C API, older layout with api_version).

    Idempotent: registering the same handler again returns without calling
    the plugin.  Raises `PluginRegistrationError` when the default handler
    was not built (the CUDA one), when nothing forwards the registration and
    JAX loaded no plugin for `platform`, when the library is not that plugin
    or has no FFI extension of a known version, when the plugin reports an
    error, or when another handler holds the target on that platform.
    """
    platform = str(platform).lower()
    api = None if library_path is None else _library_api(platform, library_path, handler)
    try:
        return handlers.register_plugin(
            platform, api, registry_platform=registry_platform, handler=handler, target=target
        )
    except RuntimeError as e:
        if isinstance(e, PluginRegistrationError):
            raise
        raise PluginRegistrationError(str(e)) from None


def register_in_api(
    api: int,
    platform: str,
    *,
    registry_platform: str | None = None,
    handler: Any = None,
    target: str | None = None,
) -> str:
    """`register` into the PJRT API table at address `api`, which the caller
    vouches is the plugin that runs `platform`: no check that JAX loaded it.
    For embedders that load a plugin themselves.

    Args:
      api: the address of the plugin's ``PJRT_Api`` table, an int (e.g.
        from ``jax_amp_scale._native_plugin.api_from_library``).
      platform: the JAX platform name of the plugin (``"ascend"``,
        ``"cuda"``, ...; any case).
      registry_platform: as in `register`.
      handler: as in `register`.
      target: as in `register`.

    Returns:
      The route: ``"pjrt"`` or ``"pjrt-versioned"``.
    """
    return handlers.register_plugin(
        platform, int(api), registry_platform=registry_platform, handler=handler, target=target
    )


def registrations() -> dict[str, str]:
    """Platforms registered on plugins in this process, with the route used."""
    return dict(handlers.ROUTES)


# float16's largest finite value: where a saturated overflow lands.
FLOAT16_MAX = 65504.0


def saturated_as_overflow(tree: Any) -> Any:
    """Every float16 entry of `tree` at +-65504 becomes +-inf; the rest is
    returned as it is.

    On an Ascend device in saturation mode a float16 overflow stores +-65504
    and NaN stores 0 (hiascend Pytorch/600 Envvariables Envir_004), so the
    gradients hold no inf/NaN.  Where the overflow flag cannot be read there
    (operators/float_status.py reads it where it can), call this on the
    gradients of the scaled loss, before `update` (or `unscale_and_check`):
    a heuristic, opt in (docs/ascend.md), which composes with any check.
    What it cannot see: a NaN that saturation turned into 0; an overflow in
    an intermediate value that later operations scaled down or normalised
    (only one that lands in a final gradient entry shows); anything in
    float32 or bfloat16 leaves.  A gradient that is genuinely 65504 counts
    as an overflow (a false positive, and a halved scale).

    Args:
      tree: any pytree; non-float16 leaves pass unchanged.
    """

    def one(x: Any) -> Any:
        if getattr(x, "dtype", None) != jnp.float16:
            return x
        return jnp.where(jnp.abs(x) == FLOAT16_MAX, x * jnp.float16(jnp.inf), x)

    return jax.tree_util.tree_map(one, tree)
