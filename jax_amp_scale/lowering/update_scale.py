"""The update-scale custom call (``jas_update_scale``: ffi/cpu.cc, cuda.cu, ascend.cc)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.lowering.custom_call import per_platform, unavailable, vary_like
from jax_amp_scale.platforms import registry

Rule = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def call_native(
    target: str,
    scale: jax.Array,
    tracker: jax.Array,
    found: jax.Array,
    *,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> tuple[jax.Array, jax.Array]:
    """One ``ffi_call`` of `target` with the operator's arguments; `found` is bool."""
    # The operator's dtype rule: found_inf has the scale's dtype (1 or 0).
    found_inf = found.astype(scale.dtype)
    call = jax.ffi.ffi_call(
        target,
        (
            jax.ShapeDtypeStruct(scale.shape, scale.dtype),
            jax.ShapeDtypeStruct(tracker.shape, jnp.int32),
        ),
        # A vmapped batch of states goes to the handler in one call.
        vmap_method="broadcast_all",
        # In place, as torch_npu calls aclnnAmpUpdateScale.
        input_output_aliases={0: 0, 1: 1},
    )
    new_scale, new_tracker = call(
        scale,
        tracker,
        found_inf,
        growth_factor=np.float64(growth_factor),
        backoff_factor=np.float64(backoff_factor),
        growth_interval=np.int64(growth_interval),
    )
    # ffi_call types its results from the ShapeDtypeStructs above, which say
    # nothing of shard_map's varying axes; the state varies wherever an input
    # does, and shard_map's replication check relies on knowing that.
    return vary_like((new_scale, new_tracker), scale, tracker, found)


def update_scale_native(
    scale: jax.Array,
    tracker: jax.Array,
    found: jax.Array,
    *,
    target: str,
    native_on: Iterable[str],
    fallback: Rule | None,
    **attrs: float,
) -> tuple[jax.Array, jax.Array]:
    """The custom call on platforms in `native_on`; elsewhere `fallback`
    (bound to the same attributes) or, when it is None, a lowering-time error."""

    def native(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        return call_native(target, s, t, f, **attrs)  # type: ignore[arg-type]

    def other(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        if fallback is not None:
            return fallback(s, t, f)
        return unavailable(registry.UPDATE_SCALE, (s, t))  # type: ignore[no-any-return]

    return per_platform(native, other, scale, tracker, found, native_on=native_on)  # type: ignore[no-any-return]
