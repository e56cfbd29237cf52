"""The Ascend overflow flag, for a device in saturation mode, where the
gradients hold no inf/NaN and the hardware's float status register records
the overflow instead (docs/ascend.md: why, and the anchors it follows).

Inside the jitted step, ordered by data (XLA orders nothing else):
`clear_before_backward` clears it after the forward pass and before the
backward; `or_flag` reads it after the gradient pass, ORs it into
found_inf, and clears it again.  Where no CANN platform is being lowered,
or its device is in INF_NAN mode, both are the identity.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning

from jax_amp_scale.mechanisms import cann_device, handlers
from jax_amp_scale.mechanisms import custom_call as cc

# aclrtGetOverflowStatus writes 64 bytes (ffi/cann_abi.h kOverflowStatusBytes).
STATUS_BYTES = 64


def saturation_platforms() -> frozenset[str]:
    """The CANN platforms with the flag's handlers whose device saturates."""
    have = handlers.platforms(handlers.FLOAT_STATUS_READ) & handlers.CANN_PLATFORMS
    have = have & handlers.platforms(handlers.FLOAT_STATUS_CLEAR)
    found = cann_device.device() if have else None
    return have if found is not None and found.saturation else frozenset()


# Neither call is marked side-effecting: their results are consumed (so XLA
# keeps them), their operands differ within a step (so it merges none), and
# XLA's SPMD partitioner refuses a side-effecting call with a replicated
# sharding, which is what each device running its own clear is.


def _clear(x: jax.Array, *order: jax.Array) -> jax.Array:
    """`x` handed on by the clear; `order` only orders the clear after them."""
    call = jax.ffi.ffi_call(
        handlers.target(handlers.FLOAT_STATUS_CLEAR),
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        input_output_aliases={0: 0},
        vmap_method="sequential",
    )
    return cc.vary_like(call(x, *order), x, order)  # type: ignore[no-any-return]


def _read(*order: jax.Array) -> jax.Array:
    """True (bool scalar) when the device's flag is set."""
    call = jax.ffi.ffi_call(
        handlers.target(handlers.FLOAT_STATUS_READ),
        jax.ShapeDtypeStruct((STATUS_BYTES,), jnp.uint8),
        vmap_method="sequential",
    )
    return jnp.any(cc.vary_like(call(*order), order) != 0)


def _read_everywhere(found: jax.Array, grads: list[jax.Array]) -> jax.Array:
    """`_read` after `found` and `grads`, ORed over every device of the mesh
    under ``jit`` with several devices: the register is per device, and XLA,
    which cannot see inside the call, would otherwise take the per-device
    answers for one replicated value.  Inside ``shard_map`` the call is
    inlined: each device's own flag, which ``axis_name`` reduces."""
    if cc.unwrapped():
        return _read(found, *grads)

    @custom_partitioning
    def call(f: jax.Array, *gs: jax.Array) -> jax.Array:
        return _read(f, *gs)

    def shardings(mesh: Any, arg_shapes: Any) -> tuple[Any, list[Any], tuple[Any, ...]]:
        # Without mesh axis names, no axis to reduce over: replicated (gathers).
        rep, own, named = cc.operand_shardings(mesh, arg_shapes[1:])
        return rep, own, tuple(mesh.axis_names) if named else ()

    def partition(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        rep, own, axes = shardings(mesh, arg_shapes)

        def local(f: jax.Array, *gs: jax.Array) -> jax.Array:
            with cc.local_shapes():
                flag = _read(f, *gs)
                if axes:  # one scalar all-reduce: the OR over every device
                    flag = jax.lax.pmax(flag.astype(jnp.int32), axes) > 0
            return flag

        return mesh, local, rep, (rep, *own)

    def infer(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        return shardings(mesh, arg_shapes)[0]

    # The Shardy rule: a replicated flag, then each gradient with dimensions
    # of its own (any may stay sharded) -> a replicated flag.
    dims = [" ".join(f"g{k}d{d}" for d in range(g.ndim)) for k, g in enumerate(grads)]
    call.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=", ".join(["", *dims]) + " -> ",
    )
    return call(found, *grads)  # type: ignore[no-any-return]


def clear_before_backward(scale: jax.Array, loss: Any) -> jax.Array:
    """`scale`, passed through the clear after `loss` is computed (the
    scaled loss consumes it, so the backward follows the clear)."""
    on = saturation_platforms()
    if not on:
        return scale
    order = [jax.lax.stop_gradient(x) for x in jax.tree_util.tree_leaves(loss)]
    order = [x for x in order if hasattr(x, "dtype")]
    return cc.per_platform(_clear, _first, scale, *order, native_on=on)  # type: ignore[no-any-return]


def or_flag(found: jax.Array, grads: list[jax.Array]) -> jax.Array:
    """`found` (bool scalar) ORed with the device's overflow flag, read after
    `found` and `grads` (the read takes them as operands: MindSpore's
    ``depend``), then cleared; `found` itself elsewhere."""
    on = saturation_platforms()
    if not on:
        return found

    def native(f: jax.Array, *gs: jax.Array) -> jax.Array:
        return _clear(jnp.logical_or(f, _read_everywhere(f, list(gs))))

    return cc.per_platform(native, _first, found, *grads, native_on=on)  # type: ignore[no-any-return]


def _first(x: jax.Array, *order: jax.Array) -> jax.Array:
    """The other platforms' branch: `x` as it is."""
    return x
