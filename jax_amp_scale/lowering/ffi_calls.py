"""The three FFI custom calls: update-scale, the fused gradient pass, the host report.

Each goes through `custom_call.per_platform` (the native call on platforms
with a handler, the reference or a callback elsewhere); the two operators'
calls also through `partitioning` (one call per device's shards).

- update-scale (``jas_update_scale_v2``; ffi/cpu.cc, cuda.cu, ascend.cc):
  in place; a vmapped batch of states in one call; on Ascend the result
  passes through `refuse_infinite_growth`.
- the gradient pass (``jas_unscale_and_check_v1``;
  ffi/unscale_and_check_cpu.cc): the float32 inverse scale and up to
  `LEAVES_PER_CALL` floating leaves in, the unscaled leaves and one
  found-inf flag out, each gradient byte read once and written once.
  XLA:CPU cannot build that pass (it never fuses a reduction with an
  elementwise output).  vmap and jvp take the reference's rules; results
  equal the reference's bit for bit (tests/test_fused_unscale.py).
- the host report (``jas_host_report_v1``; ffi/host_report_cpu.cc):
  `report` runs a Python function on the host on flagged steps, through a
  custom call whose handler calls `run` on CPU (a ``jax.debug.callback``
  would put every step on JAX's synchronous Python dispatch path:
  ARCHITECTURE.md), a callback elsewhere.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.lowering.custom_call import (
    per_platform,
    unavailable,
    vary_like,
    with_reference_rules,
)
from jax_amp_scale.lowering.partitioning import elementwise_pass, per_element
from jax_amp_scale.platforms import handlers
from jax_amp_scale.reference.floats import FORMATS
from jax_amp_scale.reference.gradient_pass import leaf_finite
from jax_amp_scale.state.tree import nonzero_bits

# One update of (scale, tracker, found): the reference bound to a state's attributes.
UpdateFn = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
Pass = Callable[[jax.Array, list[jax.Array]], tuple[jax.Array, list[jax.Array]]]
Report = Callable[..., None]


# ---- update-scale ----------------------------------------------------------

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


# ---- the gradient pass ---------------------------------------------------

# Leaves per custom call.  XLA's compile time grows with the cube of the
# number of input/output aliases on one instruction (one call over 2,000
# aliased leaves: 30 s; 4,000: 209 s), so a large tree is split into calls of
# at most this many leaves: 10,000 leaves then compile in about the time of a
# plain copy of the same tree.  Measured on XLA:CPU (jax 0.10); 64 was the
# fastest of 32, 64, 128 and 256 at 4,000 leaves.
LEAVES_PER_CALL = 64


def _one_call(
    target: str, inv: jax.Array, leaves: list[jax.Array]
) -> tuple[jax.Array, list[jax.Array]]:
    results = [jax.ShapeDtypeStruct((), jnp.bool_)]
    results += [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    # In place, as torch's fused op: each unscaled leaf takes its gradient's
    # buffer.  Inside a step the gradients are dead after this call, so XLA
    # reuses them (no second gradient-sized buffer); a gradient still live
    # elsewhere (a non-donated jit argument, say) gets copied first.
    aliases = {k + 1: k + 1 for k in range(len(leaves))}
    call = jax.ffi.ffi_call(target, tuple(results), input_output_aliases=aliases)
    found, *outs = call(inv, *leaves)
    return found, outs


def _calls(target: str) -> Pass:
    def run(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        found: jax.Array | None = None
        outs: list[jax.Array] = []
        for start in range(0, len(leaves), LEAVES_PER_CALL):
            group_found, group_outs = _one_call(
                target, inv, leaves[start : start + LEAVES_PER_CALL]
            )
            found = group_found if found is None else jnp.logical_or(found, group_found)
            outs += group_outs
        assert found is not None  # leaves is nonempty
        return vary_like((found, outs), inv, leaves)  # type: ignore[no-any-return]

    return run


# dtypes aclnnForeachNonFiniteCheckAndUnscale takes (hicann/ops-nn
# foreach/foreach_non_finite_check_and_unscale/op_host/
# foreach_non_finite_check_and_unscale_def.cpp).
_CANN_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def cann_one_call(
    target: str, inv: jax.Array, leaves: list[jax.Array]
) -> tuple[jax.Array, list[jax.Array]]:
    """One call of the CANN fused pass on leaves of one dtype, in place.

    `inv` goes to the operator's float32 ``invScale`` as is: torch_npu's
    ``float32(1 / float64(scale))`` bit for bit (`reference.inverse`),
    a float32 subnormal above 2**126.  What is exact: the operator receives
    the operand torch_npu's GradScaler passes it, so the NPU computes what it
    computes for torch_npu.  Whether the device's float32 multiply honours a
    subnormal operand is the kernel's arithmetic, not visible in its source.
    The CANN test double multiplies in IEEE's default mode.

    found starts as a float32 zero the result aliases: the kernel only ever
    sets it to 1.0, and the handler's launches (256 leaves each) OR into it.
    """
    results = [jax.ShapeDtypeStruct((1,), jnp.float32)]
    results += [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    aliases = {1: 0, **{k + 2: k + 1 for k in range(len(leaves))}}
    call = jax.ffi.ffi_call(target, tuple(results), input_output_aliases=aliases)
    found, *outs = call(inv.reshape((1,)), jnp.zeros((1,), jnp.float32), *leaves)
    return nonzero_bits(found)[0], outs


def cann_fused_pass(target: str, reference: Pass) -> Pass:
    """The fused pass as the CANN operator takes it: one dtype per call,
    float64 and empty leaves through `reference` (the operator takes neither)."""

    def run(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        outs: list[jax.Array | None] = [None] * len(leaves)
        flags: list[jax.Array] = []
        outside = [
            k for k, x in enumerate(leaves) if x.size == 0 or jnp.dtype(x.dtype) not in _CANN_DTYPES
        ]
        if outside:
            found, done = reference(inv, [leaves[k] for k in outside])
            flags.append(found)
            for k, y in zip(outside, done, strict=True):
                outs[k] = y
        for dtype in _CANN_DTYPES:
            idx = [k for k, x in enumerate(leaves) if outs[k] is None and x.dtype == dtype]
            for start in range(0, len(idx), LEAVES_PER_CALL):
                part = idx[start : start + LEAVES_PER_CALL]
                found, done = cann_one_call(target, inv, [leaves[k] for k in part])
                flags.append(found)
                for k, y in zip(part, done, strict=True):
                    outs[k] = y
        # The kernel checks the scaled *input* (n_d.h:187-209); the library's
        # flag is about the unscaled value.  They differ only when a finite
        # input overflows once unscaled, which needs |inv| > 1 (a scale
        # below 1) or a NaN inv: only then, rarely, the outputs are checked.
        inv_bits = jax.lax.bitcast_convert_type(inv.astype(jnp.float32), jnp.uint32)
        may_overflow = (inv_bits & jnp.uint32(0x7FFFFFFF)) > jnp.uint32(0x3F800000)
        natives = [y for k, y in enumerate(outs) if k not in outside]
        if natives:
            flags.append(
                jax.lax.cond(
                    may_overflow.reshape(()),
                    lambda ys: jnp.logical_not(jnp.all(jnp.stack([leaf_finite(y) for y in ys]))),
                    lambda ys: jnp.array(False),
                    natives,
                )
            )
        found = flags[0]
        for f in flags[1:]:
            found = jnp.logical_or(found, f)
        return vary_like((found, outs), inv, leaves)  # type: ignore[no-any-return]

    return run


def unscale_and_check_native(
    inv: jax.Array,
    leaves: list[jax.Array],
    *,
    target: str,
    native_on: Iterable[str],
    reference: Pass,
    strict: bool,
    cann_platforms: Iterable[str] = (),
) -> tuple[jax.Array, list[jax.Array]]:
    """``(found_inf, unscaled_leaves)`` through the native pass on `native_on`.

    Args:
      inv: float32 scalar, ``1 / scale``.
      leaves: floating arrays (float16, bfloat16, float32, float64), nonempty.
      target: the FFI target name.
      native_on: lowering platforms that run the native pass.
      reference: the pure pass with the same signature and results; it gives
        the vmap and jvp rules, and runs on the other platforms.
      strict: on the other platforms fail at lowering (``backend="ffi"``)
        rather than run `reference` (``"auto"``).
      cann_platforms: platforms of `native_on` whose handler is CANN's
        ``aclnnForeachNonFiniteCheckAndUnscale`` (its calling convention).
    """

    def other(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        out = reference(inv, leaves)  # typed like the native branch
        return unavailable(handlers.UNSCALE_AND_CHECK, out) if strict else out

    # Each device runs the pass on its shards; the flag is OR-reduced (partitioning.py).
    native = with_reference_rules(elementwise_pass(_calls(target)), reference)
    cann = with_reference_rules(elementwise_pass(cann_fused_pass(target, reference)), reference)
    overrides = {p: cann for p in native_on if p in frozenset(cann_platforms)}
    return per_platform(  # type: ignore[no-any-return]
        native, other, inv, leaves, native_on=native_on, overrides=overrides
    )


# ---- the host report -----------------------------------------------------

_lock = threading.Lock()
# Every function reported to, keyed by its id(), for the life of the
# process: a compiled program may call it at any later time (and keeping it
# alive keeps its id unique).
_reports: dict[int, Report] = {}


def _key(fn: Report) -> int:
    with _lock:
        _reports[id(fn)] = fn
    return id(fn)


def run(key: int, values: list[list[Any]]) -> str | None:
    """Called by the native handler (ffi/host_report_cpu.cc): ``fn(*arrays)``;
    None, or ``"ExceptionType: message"`` for an exception it raised (the
    call's error)."""
    with _lock:
        fn = _reports.get(key)
    if fn is None:
        return f"LookupError: no host report {key} in this process"
    try:
        fn(*(np.asarray(v) for v in values))
    except Exception as e:  # a warning turned into an error included
        return f"{type(e).__name__}: {e}"
    return None


def report(
    fn: Report, flag: Any, *values: Any, native_on: frozenset[str], target: str | None
) -> jax.Array:
    """`flag` (a bool array), after ``fn(flag, *values)`` ran on the host where
    some element of `flag` is true.

    `values` are bool, int32 or float32 arrays (other floats are passed as
    float32).  The custom call `target` serves the lowering platforms in
    `native_on`; ``jax.debug.callback`` the others.
    """
    flag = jnp.asarray(flag, jnp.bool_)
    values = tuple(_as_value(v) for v in values)

    def by_callback(flag: jax.Array, *values: jax.Array) -> jax.Array:
        def host(flag: Any, *values: Any) -> None:
            flag = np.asarray(flag)
            if flag.any():  # under vmap the cond below runs for every lane
                fn(flag.reshape(-1), *(np.asarray(v).reshape(-1) for v in values))

        # No host call on an unflagged step (a device-to-host trip on GPU).
        jax.lax.cond(jnp.any(flag), lambda: jax.debug.callback(host, flag, *values), lambda: None)
        return flag

    if not native_on or target is None:
        return by_callback(flag, *values)
    key = _key(fn)

    def by_custom_call(flag: jax.Array, *values: jax.Array) -> jax.Array:
        call = jax.ffi.ffi_call(
            target,
            jax.ShapeDtypeStruct(flag.shape, jnp.bool_),
            has_side_effect=False,  # a JAX effect would bring back the slow path
            vmap_method="broadcast_all",
        )
        return call(flag, *values, report=np.int64(key))  # type: ignore[no-any-return]

    return per_platform(by_custom_call, by_callback, flag, *values, native_on=native_on)  # type: ignore[no-any-return]


def _as_value(x: Any) -> jax.Array:
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_ or x.dtype == jnp.int32:
        return x
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.int32)
    return x.astype(jnp.float32)
