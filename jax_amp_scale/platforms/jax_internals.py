"""Where the library reads JAX internals, isolated here.

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
C API route, which works for every plugin with the FFI extension.

3. **A GSPMD sharding group** (``shard_as``), for lowering/sharding_groups.py
   on the jax releases that removed ``jax.experimental.shard_alike`` (0.11
   on): only JAX's internal sharding-op builder makes one.
   `gspmd_shard_group` returns the values ungrouped without it.

Nothing here runs at import; nothing is written.
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


def gspmd_shard_group(ctx: Any, values: list[Any], group: int) -> list[Any]:
    """`values` (MLIR values of a lowering rule with `ctx`), each wrapped in
    a "Sharding" custom call marked ``shard_as`` `group`: GSPMD partitions
    them alike.  Unchanged where JAX lacks the internals."""
    try:
        from jax._src.interpreters.mlir import wrap_with_sharding_op
        from jax._src.lib import xla_client as xc

        s = xc.OpSharding()
        s.type = xc.OpSharding.Type.UNKNOWN
        s.is_shard_group = True
        s.shard_group_id = group
        s.shard_group_type = xc.OpSharding.ShardGroupType.AS
    except (ImportError, AttributeError):  # pragma: no cover - a JAX without them
        return values
    return [
        wrap_with_sharding_op(ctx, v, aval, s, has_side_effect=True)
        for v, aval in zip(values, ctx.avals_out, strict=True)
    ]
