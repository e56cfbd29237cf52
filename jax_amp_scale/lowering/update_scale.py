"""The update-scale custom call (``jas_update_scale_v2``, ffi/targets.h: ffi/cpu.cc, cuda.cu, ascend.cc)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.lowering.custom_call import per_platform, unavailable, vary_like
from jax_amp_scale.lowering.partitioning import per_element
from jax_amp_scale.platforms import handlers
from jax_amp_scale.reference.floats import FORMATS

# One update of (scale, tracker, found): the reference bound to a state's attributes.
UpdateFn = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


# The operator's attributes and the types its handlers decode them as.
ATTRIBUTES = {
    "growth_factor": np.float64,
    "backoff_factor": np.float64,
    "growth_interval": np.int64,
    "rule": str,
}


def call_native(
    target: str, scale: jax.Array, tracker: jax.Array, found: jax.Array, **attrs: Any
) -> tuple[jax.Array, jax.Array]:
    """One ``ffi_call`` of `target` with the operator's `ATTRIBUTES` (all of
    them); `found` is bool."""
    # The operator's dtype rule: found_inf has the scale's dtype (1 or 0).
    found_inf = found.astype(scale.dtype)
    attrs = {name: kind(attrs[name]) for name, kind in ATTRIBUTES.items()}

    def call(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, ...]:
        ffi = jax.ffi.ffi_call(
            target,
            (jax.ShapeDtypeStruct(s.shape, s.dtype), jax.ShapeDtypeStruct(t.shape, jnp.int32)),
            # A vmapped batch of states goes to the handler in one call.
            vmap_method="broadcast_all",
            # In place, as torch_npu calls aclnnAmpUpdateScale.
            input_output_aliases={0: 0, 1: 1},
        )
        return tuple(ffi(s, t, f, **attrs))

    # Each device updates the states it holds (lowering/partitioning.py).
    new_scale, new_tracker = per_element(call)(scale, tracker, found_inf)
    # ffi_call types its results from the ShapeDtypeStructs above, which say
    # nothing of shard_map's varying axes; the state varies wherever an input
    # does, and shard_map's replication check relies on knowing that.
    return vary_like((new_scale, new_tracker), scale, tracker, found)


def refuse_infinite_growth(
    old_scale: jax.Array, found: jax.Array, new_scale: jax.Array
) -> jax.Array:
    """`new_scale`, except where growth stored an infinite value: there `old_scale`.

    The library's guard around ``aclnnAmpUpdateScale``, whose kernel tests
    finiteness on the float32 product and casts to float16/bfloat16 after
    (hicann/ops-math ``math/amp_update_scale/op_kernel/amp_update_scale.h``
    :146-147, :162-172), so float16 32768 grown x2 is stored as inf.  Without
    `found` the scale changes only by growth, so a finite scale that became
    infinite did so there; the tracker is 0 either way.  Bits only, no float
    comparison.  float32 needs no guard (the kernel's own test covers it).
    """
    fm = FORMATS[jnp.dtype(old_scale.dtype)]
    if jnp.dtype(old_scale.dtype) == jnp.float32:
        return new_scale
    mask = jnp.asarray(~fm.sign_bit & 0xFFFF, fm.bits_dtype)
    inf = jnp.asarray(fm.inf_bits, fm.bits_dtype)

    def is_inf(x: jax.Array) -> jax.Array:
        return (jax.lax.bitcast_convert_type(x, fm.bits_dtype) & mask) == inf

    return jnp.where(~found & is_inf(new_scale) & ~is_inf(old_scale), old_scale, new_scale)


def update_scale_native(
    scale: jax.Array,
    tracker: jax.Array,
    found: jax.Array,
    *,
    target: str,
    native_on: Iterable[str],
    fallback: UpdateFn | None,
    guarded: Iterable[str] = (),
    **attrs: float | str,
) -> tuple[jax.Array, jax.Array]:
    """The custom call on platforms in `native_on`; elsewhere `fallback`
    (bound to the same attributes) or, when it is None, a lowering-time error.
    On platforms in `guarded` (Ascend: the operator is CANN's kernel) the
    result passes through `refuse_infinite_growth`."""

    def native(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        return call_native(target, s, t, f, **attrs)  # type: ignore[arg-type]

    def native_guarded(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        new_s, new_t = native(s, t, f)
        return refuse_infinite_growth(s, f, new_s), new_t

    def other(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        if fallback is not None:
            return fallback(s, t, f)
        return unavailable(handlers.UPDATE_SCALE, (s, t))  # type: ignore[no-any-return]

    guarded = frozenset(guarded)
    overrides = {p: native_guarded for p in native_on if p in guarded}
    return per_platform(  # type: ignore[no-any-return]
        native, other, scale, tracker, found, native_on=native_on, overrides=overrides
    )
