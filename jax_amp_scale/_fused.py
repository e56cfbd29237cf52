"""The fused native gradient pass: unscale and check every leaf in one pass.

One XLA FFI custom call (``jas_unscale_and_check``, ffi/unscale_and_check_cpu.cc)
per group of up to `LEAVES_PER_CALL` leaves takes the float32 inverse scale
and the group's floating gradient leaves, and returns
the unscaled leaves and one found-inf flag: each gradient byte is read once
and written once, on XLA's intra-op threads.  XLA:CPU cannot build that pass
itself (it never fuses a reduction with an elementwise output, so the pure
path runs one kernel and one mask reduction per leaf, and compiles them all).

The call is wrapped so that every JAX transformation still works:

- ``vmap``: a batched call runs the pure reference vmapped (one vectorised
  program rather than a loop of calls);
- ``jvp``/``grad``: tangents come from the reference's linear map;
- ``shard_map``: results carry the inputs' varying axes.

Results equal the reference's bit for bit (tests/test_fused_unscale.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jax_amp_scale import _ffi

Pass = Callable[[jax.Array, list[jax.Array]], tuple[jax.Array, list[jax.Array]]]


# Leaves per custom call.  XLA's compile time grows with the cube of the
# number of input/output aliases on one instruction (one call over 2,000
# aliased leaves: 30 s; 4,000: 209 s), so a large tree is split into calls of
# at most this many leaves: 10,000 leaves then compile in about the time of a
# plain copy of the same tree.  Measured on XLA:CPU (jax 0.10); 64 was the
# fastest of 32, 64, 128 and 256 at 4,000 leaves.
LEAVES_PER_CALL = 64


def _one_call(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
    results = [jax.ShapeDtypeStruct((), jnp.bool_)]
    results += [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    # In place, as torch's fused op: each unscaled leaf takes its gradient's
    # buffer.  Inside a step the gradients are dead after this call, so XLA
    # reuses them (no second gradient-sized buffer); a gradient still live
    # elsewhere (a non-donated jit argument, say) gets copied first.
    aliases = {k + 1: k + 1 for k in range(len(leaves))}
    call = jax.ffi.ffi_call(_ffi.UNSCALE_TARGET, tuple(results), input_output_aliases=aliases)
    found, *outs = call(inv, *leaves)
    return found, outs


def _native_call(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
    found: jax.Array | None = None
    outs: list[jax.Array] = []
    for start in range(0, len(leaves), LEAVES_PER_CALL):
        group_found, group_outs = _one_call(inv, leaves[start : start + LEAVES_PER_CALL])
        found = group_found if found is None else jnp.logical_or(found, group_found)
        outs += group_outs
    assert found is not None  # leaves is nonempty
    axes = frozenset().union(*(_ffi._varying_axes(x) for x in (inv, *leaves)))
    return _ffi._vary(found, axes), [_ffi._vary(u, axes) for u in outs]


def _transformable(fallback: Pass) -> Pass:
    """`_native_call` with vmap and jvp rules taken from `fallback`."""
    native = jax.custom_batching.custom_vmap(_native_call)

    @native.def_vmap
    def _batched(
        axis_size: int, in_batched: Any, inv: jax.Array, leaves: list[jax.Array]
    ) -> tuple[Any, Any]:
        inv_batched, leaves_batched = in_batched
        run = jax.vmap(
            fallback,
            in_axes=(0 if inv_batched else None, [0 if b else None for b in leaves_batched]),
            axis_size=axis_size,
        )
        found, outs = run(inv, leaves)
        return (found, outs), (True, [True] * len(outs))

    @jax.custom_jvp
    def fused(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        return native(inv, leaves)

    @fused.defjvp
    def _jvp(primals: Any, tangents: Any) -> tuple[Any, Any]:
        # The unscale is linear in each leaf (and in inv): the reference's
        # tangent map is exact; its primal half is dead code XLA removes.
        _, tangent_out = jax.jvp(fallback, primals, tangents)
        return fused(*primals), tangent_out

    return fused


def unscale_and_check_fused(
    inv: jax.Array,
    leaves: list[jax.Array],
    *,
    fallback: Pass,
    strict: bool,
) -> tuple[jax.Array, list[jax.Array]]:
    """``(found_inf, unscaled_leaves)`` through the native pass where it exists.

    Args:
      inv: float32 scalar, ``1 / scale``.
      leaves: floating arrays (float16, bfloat16, float32, float64), nonempty.
      fallback: the pure reference with the same signature and results.
      strict: on a lowering platform without a handler, fail with a clear
        error (``backend="ffi"``) rather than run `fallback` (``"auto"``).
    """

    def other(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        if not strict:
            return fallback(inv, leaves)
        found, outs = fallback(inv, leaves)  # typed like the native branch
        checked = _ffi._unavailable_p.bind(found, *outs, target=_ffi.UNSCALE_TARGET)
        return checked[0], list(checked[1:])

    # Every branch must return the same type, varying axes included.
    axes = frozenset().union(*(_ffi._varying_axes(x) for x in (inv, *leaves)))
    inv = _ffi._vary(inv, axes)
    leaves = [_ffi._vary(x, axes) for x in leaves]
    fused = _transformable(fallback)
    branches = {p: fused for p in sorted(_ffi.unscale_platforms())}
    return jax.lax.platform_dependent(inv, leaves, default=other, **branches)
