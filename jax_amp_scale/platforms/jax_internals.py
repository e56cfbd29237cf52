"""The two places the platforms layer reads JAX internals, isolated here
(lowering/sharding_groups.py reads two more, for GSPMD on jax >= 0.11).

Registering a handler on a PJRT plugin platform (`platforms.pjrt.register`)
needs two facts JAX has no public API for:

1. **The PJRT C API of the plugin JAX loaded for a platform** (its
   ``PJRT_Api*``, to reach the plugin's FFI extension).  JAX keeps it on the
   plugin's backend factory (``jax._src.xla_bridge._backend_factories[name]
   .c_api``, a ``"pjrt_c_api"`` capsule); ``jax.extend.backend`` exposes the
   clients but not their C API.  `loaded_plugin_c_apis` reads it.
2. **Whether the plugin's Python side forwards ``jax.ffi.register_ffi_target``**
   to the plugin for a platform (the jax CUDA plugin registers such a
   handler; the Ascend plugin does not).  JAX keeps those handlers in
   ``jax._src.lib.xla_client._custom_callback_handler``;
   `python_side_forwards` reads it.

Tested with jax 0.6.x (the oldest CI job) and 0.10.2.  Without them (a JAX
that renamed or dropped either): `loaded_plugin_c_apis` returns ``{}``, so
`register` without ``library_path=`` raises `PluginRegistrationError` saying
JAX has loaded no such plugin (pass the plugin's library path instead), and
`python_side_forwards` returns False, so registration goes through the PJRT
C API route, which works for every plugin with the FFI extension.  Nothing
here runs at import; nothing is written.
"""

from __future__ import annotations

from typing import Any


def loaded_plugin_c_apis(discover: bool = True) -> dict[str, Any]:
    """``{platform: "pjrt_c_api" capsule}`` for the PJRT plugins JAX loaded.

    `discover` runs JAX's plugin discovery first (as its first backend use
    would), so that an installed plugin is found before any computation.
    """
    try:
        from jax._src import xla_bridge as xb
    except ImportError:  # pragma: no cover - a JAX without the module
        return {}
    run = getattr(xb, "_discover_and_register_pjrt_plugins", None)
    if discover and run is not None:
        run()
    factories = dict(getattr(xb, "_backend_factories", {}))
    out = {}
    for name, factory in factories.items():
        c_api = getattr(factory, "c_api", None)
        if c_api is not None:
            out[name] = c_api
    return out


def python_side_forwards(registry_platform: str) -> bool:
    """Whether ``jax.ffi.register_ffi_target(..., platform=registry_platform)``
    reaches a plugin (its Python side registered a custom-call handler)."""
    try:
        from jax._src.lib import xla_client
    except ImportError:  # pragma: no cover - a JAX without the module
        return False
    return registry_platform in getattr(xla_client, "_custom_callback_handler", {})
