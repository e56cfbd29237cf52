"""Which backend runs an operator: one rule and one table for both operators.

``"reference"`` is the pure-JAX lowering (every platform); ``"ffi"`` the
native custom call (a lowering-time error where the platform has no
handler); ``"auto"`` the native call where the table below prefers it and a
handler is registered, the reference elsewhere, chosen per lowering
platform by `lax.platform_dependent`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax

from jax_amp_scale.lowering.custom_call import explicitly_sharded
from jax_amp_scale.platforms import native, registry

UPDATE_SCALE = registry.UPDATE_SCALE
UNSCALE_AND_CHECK = registry.UNSCALE_AND_CHECK

# Where "auto" prefers the native handler, per operator:
# - always: on Ascend the native operator is the point of the library;
# - one device: only in a process with one device, because XLA cannot
#   partition a custom call and would gather a sharded operand around it.
#   On CPU the update-scale call costs ~0.3 us a step more than the reference
#   but compiles in 0.035 s against ~0.5 s, and is 3.5x faster vmapped over
#   1,024 states; the fused gradient pass reads each byte once where the
#   reference makes two passes (bench/RESULTS.md, workloads 2-4).
AUTO_NATIVE: dict[str, dict[str, frozenset[str]]] = {
    UPDATE_SCALE: {"always": frozenset({"ascend", "npu"}), "one_device": frozenset({"cpu"})},
    UNSCALE_AND_CHECK: {"always": frozenset({"ascend", "npu"}), "one_device": frozenset({"cpu"})},
}


# Platforms whose handlers are CANN operators (aclnnAmpUpdateScale,
# aclnnForeachNonFiniteCheckAndUnscale).  The update-scale kernel computes
# rule "cann" without the library's guard, so there:
# - the result passes through the guard (lowering.refuse_infinite_growth);
# - a rule "torch" state runs natively only when both factors are powers of
#   two exact in float32 (then the kernel's bits are torch's: tests/
#   test_rule_choice.py); "auto" plans the reference for any other.
# The fused pass there takes the operator's calling convention
# (lowering.gradient_pass: float32 found flag, per-dtype calls, float64 and
# empty leaves outside it).
ASCEND_PLATFORMS: frozenset[str] = frozenset({"ascend", "npu"})


class Plan(NamedTuple):
    """How to run an operator: ``mode`` is ``"reference"``, ``"native"`` (the
    reference on platforms not in ``platforms``) or ``"strict"`` (an error
    there).  ``cann_platforms``: platforms where the native handler is a CANN
    operator (its calling convention, and for update-scale the guard)."""

    mode: str
    platforms: frozenset[str]
    target: str = ""  # the FFI target name, unless mode is "reference"
    cann_platforms: frozenset[str] = frozenset()


def exact_on_cann(factor: float) -> bool:
    """Whether `factor` is a power of two that is a normal float32."""
    mantissa, exponent = math.frexp(factor)
    return mantissa == 0.5 and -126 <= exponent - 1 <= 127


def cann_serves(rule: str, growth_factor: float, backoff_factor: float) -> bool:
    """Whether aclnnAmpUpdateScale (plus the guard) gives `rule`'s bits."""
    return rule == "cann" or (exact_on_cann(growth_factor) and exact_on_cann(backoff_factor))


def _platform_name(platform: str | None) -> str:
    platform = (platform or jax.default_backend()).lower()
    return "cuda" if platform == "gpu" else platform


def _auto_prefers(op: str, platform: str) -> bool:
    table = AUTO_NATIVE[op]
    if platform in table["always"]:
        return True
    return platform in table["one_device"] and jax.device_count() == 1


def available_backends(platform: str | None = None, op: str = UPDATE_SCALE) -> tuple[str, ...]:
    """Backends that run `op` on `platform` (default: JAX's default backend)."""
    if platform_has_native(op, _platform_name(platform)):
        return ("reference", "ffi")
    return ("reference",)


def platform_has_native(op: str, platform: str) -> bool:
    return platform in native.platforms(op)


def auto_backend(platform: str | None = None, op: str = UPDATE_SCALE) -> str:
    """The backend ``"auto"`` picks for `op` on `platform` in this process."""
    name = _platform_name(platform)
    if _auto_prefers(op, name) and platform_has_native(op, name):
        return "ffi"
    return "reference"


def plan(op: str, backend: str, operands: list[Any], attrs: dict[str, Any] | None = None) -> Plan:
    """The plan for `op` with a checked `backend` on these operands (at trace time).

    `attrs` (update-scale: ``rule``, ``growth_factor``, ``backoff_factor``)
    decide whether the Ascend operator can serve the state.
    """
    if backend == "reference":
        return Plan("reference", frozenset())
    have = native.platforms(op)
    cann = have & ASCEND_PLATFORMS
    if op == UPDATE_SCALE:
        a = attrs or {}
        if backend == "auto" and not cann_serves(
            a.get("rule", "torch"), a.get("growth_factor", 2.0), a.get("backoff_factor", 0.5)
        ):
            have = have - ASCEND_PLATFORMS
    sharded = any(explicitly_sharded(x) for x in operands)
    if backend == "ffi":
        if sharded and op == UNSCALE_AND_CHECK:
            raise ValueError(
                "unscale_and_check: backend='ffi' cannot take explicitly sharded leaves "
                "(XLA cannot partition the custom call); use backend='auto' or "
                "'reference', or call it inside shard_map"
            )
        return Plan("strict", have, native.target(op), cann)
    # "auto": never for an explicitly sharded operand (a custom call's result
    # carries no sharding).
    prefer = frozenset(p for p in have if _auto_prefers(op, p))
    if not prefer or sharded:
        return Plan("reference", frozenset())
    return Plan("native", prefer, native.target(op), cann)


def native_expected(
    op: str, backend: str, operands: list[Any], attrs: dict[str, Any] | None = None
) -> bool:
    """Whether `op` will run natively on JAX's default platform.

    Decided at trace time; callers use it to pick how to consume a result,
    never for the result itself (every path gives the same bits).
    """
    p = plan(op, backend, operands, attrs)
    return p.mode != "reference" and _platform_name(None) in p.platforms
