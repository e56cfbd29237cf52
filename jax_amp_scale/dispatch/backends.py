"""Which backend runs an operator: one rule and one table for both operators.

``"reference"`` is the pure-JAX lowering (every platform); ``"ffi"`` the
native custom call (a lowering-time error where the platform has no
handler); ``"auto"`` the native call where the table below prefers it and a
handler is registered, the reference elsewhere, chosen per lowering
platform by `lax.platform_dependent`.
"""

from __future__ import annotations

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


class Plan(NamedTuple):
    """How to run an operator: ``mode`` is ``"reference"``, ``"native"`` (the
    reference on platforms not in ``platforms``) or ``"strict"`` (an error
    there)."""

    mode: str
    platforms: frozenset[str]
    target: str = ""  # the FFI target name, unless mode is "reference"


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


def plan(op: str, backend: str, operands: list[Any]) -> Plan:
    """The plan for `op` with a checked `backend` on these operands (at trace time)."""
    if backend == "reference":
        return Plan("reference", frozenset())
    have = native.platforms(op)
    sharded = any(explicitly_sharded(x) for x in operands)
    if backend == "ffi":
        if sharded and op == UNSCALE_AND_CHECK:
            raise ValueError(
                "unscale_and_check: backend='ffi' cannot take explicitly sharded leaves "
                "(XLA cannot partition the custom call); use backend='auto' or "
                "'reference', or call it inside shard_map"
            )
        return Plan("strict", have, native.target(op))
    # "auto": never for an explicitly sharded operand (a custom call's result
    # carries no sharding).
    prefer = frozenset(p for p in have if _auto_prefers(op, p))
    if not prefer or sharded:
        return Plan("reference", frozenset())
    return Plan("native", prefer, native.target(op))


def native_expected(op: str, backend: str, operands: list[Any]) -> bool:
    """Whether `op` will run natively on JAX's default platform.

    Decided at trace time; callers use it to pick how to consume a result,
    never for the result itself (every path gives the same bits).
    """
    p = plan(op, backend, operands)
    return p.mode != "reference" and _platform_name(None) in p.platforms
