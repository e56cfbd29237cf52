"""Which backend runs an operator: one rule and one configuration for both.

``"reference"`` is the pure-JAX lowering (every platform); ``"ffi"`` the
native custom call (a lowering-time error where the platform has no
handler); ``"auto"`` the native call where the configuration prefers it and
a handler is registered, the reference elsewhere, per lowering platform.
The choice reads one immutable `DispatchConfig`, which only `configured`
replaces, for a block.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

import jax

from jax_amp_scale.lowering import partitioning
from jax_amp_scale.platforms import handlers
from jax_amp_scale.reference.floats import power_of_two_exponent

UPDATE_SCALE = handlers.UPDATE_SCALE
UNSCALE_AND_CHECK = handlers.UNSCALE_AND_CHECK

_ASCEND = frozenset({"ascend", "npu"})

Backend = Literal["auto", "reference", "ffi"]
BACKENDS: tuple[str, ...] = ("auto", "reference", "ffi")


def check_backend(backend: Any) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return str(backend)


def _frozen(table: Mapping[str, Any], value: Any = frozenset) -> Mapping[str, Any]:
    return MappingProxyType({k: value(v) for k, v in table.items()})


@dataclasses.dataclass(frozen=True)
class DispatchConfig:
    """What ``"auto"`` prefers, and which platforms run CANN operators.

    Attributes:
      auto_native: operator -> lowering platforms where ``"auto"`` prefers the
        native handler (where one is registered), with any number of devices:
        the native calls partition like the elementwise operators they are
        (`lowering.partitioning`).
      cann_platforms: platforms whose handlers are CANN operators
        (aclnnAmpUpdateScale, aclnnForeachNonFiniteCheckAndUnscale).  The
        update-scale kernel computes rule "cann" without the library's
        guard, so there the result passes through the guard
        (`lowering.ffi_calls.refuse_infinite_growth`), and a rule "torch"
        state runs natively only when both factors are powers of two exact
        in float32 (`cann_serves`; "auto" plans the reference for any
        other).  The fused pass there takes the operator's calling
        convention (float32 flag, one dtype per call, float64 and empty
        leaves outside it).
      targets: operator -> FFI target name to call instead of the native
        module's own (a handler registered under another name).
    """

    auto_native: Mapping[str, frozenset[str]]
    cann_platforms: frozenset[str] = _ASCEND
    targets: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = (set(self.auto_native) | set(self.targets)) - set(handlers.OPERATORS)
        if unknown:
            raise ValueError(f"DispatchConfig: unknown operators {sorted(unknown)}")
        object.__setattr__(self, "auto_native", _frozen(self.auto_native))
        object.__setattr__(self, "cann_platforms", frozenset(self.cann_platforms))
        object.__setattr__(self, "targets", _frozen(self.targets, str))


# On Ascend the native operator is the point of the library; on CPU the
# native calls are faster than the reference, on CUDA not (XLA fuses the
# reference there): the figures are in bench/RESULTS.md.
DEFAULT_CONFIG = DispatchConfig(
    auto_native={
        UPDATE_SCALE: frozenset({"cpu"}) | _ASCEND,
        UNSCALE_AND_CHECK: frozenset({"cpu"}) | _ASCEND,
    }
)

_config: contextvars.ContextVar[DispatchConfig] = contextvars.ContextVar(
    "jax_amp_scale_dispatch", default=DEFAULT_CONFIG
)


def config() -> DispatchConfig:
    """The configuration dispatch decisions read now."""
    return _config.get()


@contextlib.contextmanager
def configured(config: DispatchConfig | None = None, /, **changes: Any) -> Iterator[DispatchConfig]:
    """Dispatch reads `config` (or the current one with `changes`) in this block.

    Decisions are taken when a function is traced, and `jax.jit` caches
    traces without knowing the configuration, so JAX's caches are cleared on
    entry and on exit: functions traced inside keep that path; call them
    again after leaving to trace them afresh.
    """
    new = dataclasses.replace(config or _config.get(), **changes)
    token = _config.set(new)
    jax.clear_caches()
    try:
        yield new
    finally:
        _config.reset(token)
        jax.clear_caches()


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
    """Whether `factor` is a power of two that is a normal float32 (then
    CANN's float32 product gives torch's bits)."""
    k = power_of_two_exponent(factor)
    return k is not None and -126 <= k <= 127


def cann_serves(rule: str, growth_factor: float, backoff_factor: float) -> bool:
    """Whether aclnnAmpUpdateScale (plus the guard) gives `rule`'s bits."""
    return rule == "cann" or (exact_on_cann(growth_factor) and exact_on_cann(backoff_factor))


def _platform_name(platform: str | None) -> str:
    platform = (platform or jax.default_backend()).lower()
    return "cuda" if platform == "gpu" else platform


def _auto_prefers(op: str, platform: str) -> bool:
    return platform in config().auto_native.get(op, frozenset())


def _target(op: str) -> str:
    return config().targets.get(op) or handlers.target(op)


def host_report_plan(backend: str) -> tuple[frozenset[str], str | None]:
    """``(platforms, target)`` of the native host report (`lowering.ffi_calls.report`):
    none for ``"reference"`` (pure JAX throughout) or without the native module."""
    if backend == "reference":
        return frozenset(), None
    on = handlers.platforms(handlers.HOST_REPORT)
    return on, (_target(handlers.HOST_REPORT) if on else None)


def available_backends(platform: str | None = None, op: str = UPDATE_SCALE) -> tuple[str, ...]:
    """Backends that run `op` on `platform` (default: JAX's default backend)."""
    if platform_has_native(op, _platform_name(platform)):
        return ("reference", "ffi")
    return ("reference",)


def platform_has_native(op: str, platform: str) -> bool:
    return platform in handlers.platforms(op)


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
    have = handlers.platforms(op)
    cann = have & config().cann_platforms
    if op == UPDATE_SCALE:
        a = attrs or {}
        if (
            cann
            and backend == "auto"
            and not cann_serves(
                a.get("rule", "torch"), a.get("growth_factor", 2.0), a.get("backoff_factor", 0.5)
            )
        ):
            have = have - cann
    partitions = partitioning.partitions(operands)
    if backend == "ffi":
        if not partitions and op == UNSCALE_AND_CHECK:
            raise ValueError(
                "unscale_and_check: backend='ffi' cannot take explicitly sharded leaves "
                "on jax < 0.7 (its collective does not lower there); use backend='auto' "
                "or 'reference', jax >= 0.7, or call it inside shard_map"
            )
        return Plan("strict", have, _target(op), cann)
    prefer = frozenset(p for p in have if _auto_prefers(op, p))
    if not prefer or not partitions:
        return Plan("reference", frozenset())
    # The target is looked up only for a native plan: without the compiled
    # modules "auto" plans the reference and must not need their names.
    return Plan("native", prefer, _target(op), cann)
