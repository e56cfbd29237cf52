"""Where the library reads JAX internals, isolated here.

Registering a handler on a PJRT plugin platform (`handlers.register_plugin`)
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

Without them (a JAX that renamed or dropped either): `loaded_plugin_c_apis`
returns ``{}``, so `register` without ``library_path=`` raises saying JAX
has loaded no such plugin, and `python_side_forwards` returns False, so
registration takes the PJRT C API route, which every plugin with the FFI
extension serves.

3. **Sharding groups** (`shard_alike`): each gradient and the native
   pass's result for it in one group, so that the partitioner carries
   shardings through the custom call.  ``jax.experimental.shard_alike``
   builds them where it exists; jax 0.11 removed it with no public
   successor.  There, under Shardy (the default partitioner since jax 0.7),
   a group is one ``sdy.sharding_group`` op per array, a public API; under
   GSPMD it is a ``shard_as`` annotation, which only JAX's internal
   sharding-op builder makes (`gspmd_shard_group`; without it, no group:
   the same bits, and XLA may place the collectives otherwise).

Nothing here runs at import but the definition of the grouping primitive.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import jax
from jax.extend.core import Primitive
from jax.extend.mlir.dialects import sdy
from jax.interpreters import ad, batching, mlir


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
    c_apis = {name: getattr(factory, "c_api", None) for name, factory in factories.items()}
    return {name: c_api for name, c_api in c_apis.items() if c_api is not None}


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


# ---- sharding groups ----

# Group ids only need to differ between the groups of one program.
_ids = itertools.count()

_group_p = Primitive("jas_sharding_group")
_group_p.multiple_results = True
_group_p.def_impl(lambda x, y: (x, y))
_group_p.def_abstract_eval(lambda x, y: (x, y))


def _lowering(ctx: Any, x: Any, y: Any) -> list[Any]:
    group = next(_ids)
    # The flag's documented reader; jax's stubs do not declare it.
    if not jax.config.jax_use_shardy_partitioner:  # type: ignore[attr-defined]
        return gspmd_shard_group(ctx, [x, y], group)
    sdy.sharding_group(x, group)
    sdy.sharding_group(y, group)
    return [x, y]


def _batched(args: Sequence[Any], dims: Sequence[Any]) -> tuple[Any, Any]:
    if dims[0] != dims[1]:  # a partitioning hint only: dropped, not aligned
        return list(args), list(dims)
    return _group_p.bind(*args), list(dims)


def _jvp(primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
    return _group_p.bind(*primals), list(tangents)


mlir.register_lowering(_group_p, _lowering)
batching.primitive_batchers[_group_p] = _batched
ad.primitive_jvps[_group_p] = _jvp


def sharding_groups(xs: Sequence[jax.Array], ys: Sequence[jax.Array]) -> tuple[Any, Any]:
    """Our own groups (what shard_alike builds where jax has none)."""
    pairs = [_group_p.bind(x, y) for x, y in zip(xs, ys, strict=True)]
    return [x for x, _ in pairs], [y for _, y in pairs]


try:  # jax < 0.11
    from jax.experimental.shard_alike import shard_alike as _jax_shard_alike
except ImportError:  # jax >= 0.11: the same groups, built here (Shardy and GSPMD)
    _jax_shard_alike = sharding_groups


def shard_alike(xs: Sequence[jax.Array], ys: Sequence[jax.Array]) -> tuple[list[Any], list[Any]]:
    """`xs` and `ys` unchanged, each ``xs[i]`` in one sharding group with ``ys[i]``."""
    x_out, y_out = _jax_shard_alike(list(xs), list(ys))
    return list(x_out), list(y_out)
