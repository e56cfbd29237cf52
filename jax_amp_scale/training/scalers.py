"""Scalers: immutable pytrees holding one `ScaleState` and the policy that
adjusts it (`DynamicScaler`, `StaticScaler`, `NoOpScaler`; interface `Scaler`).

``update(found_inf)`` takes torch's flag (True: an overflow); jmp's
``adjust(grads_finite)`` takes the opposite, so ``adjust`` raises a TypeError
that shows the fix instead of silently inverting it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import warnings
from collections.abc import Hashable
from typing import Any, ClassVar, NoReturn, Protocol, TypeVar, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.mechanisms.floats import is_float_leaf
from jax_amp_scale.mechanisms.handlers import Backend
from jax_amp_scale.operators import unscale_and_check as gradient_pass
from jax_amp_scale.operators.unscale_and_check import PyTree
from jax_amp_scale.operators.update_scale import (
    DEFAULT_BACKOFF_FACTOR,
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_GROWTH_INTERVAL,
    DEFAULT_INIT_SCALE,
    DEFAULT_RULE,
    INT32_MAX,
    ScaleState,
    check_bool,
    check_dtype,
    check_factor,
    checked_once,
    found_to_bool,
    init_scale_state,
    or_across,
    update_scale,
)
from jax_amp_scale.training import scaling, serialization

_Fixed = TypeVar("_Fixed", bound="_Common")  # typing.Self is 3.11+

ADJUST_ERROR = (
    "{cls}.adjust does not exist here: jmp's adjust(grads_finite) takes True for a GOOD "
    "step, and this library's flag is torch's found_inf (True for an overflow). Write "
    "scaler = scaler.update(found_inf), or from jmp code scaler = scaler.update(~grads_finite)."
)


@runtime_checkable
class Scaler(Protocol):
    """The interface of `DynamicScaler`, `StaticScaler` and `NoOpScaler`."""

    @property
    def scale(self) -> jax.Array: ...
    @property
    def scale_state(self) -> ScaleState: ...
    @property
    def drop_overflow_update(self) -> bool: ...
    @property
    def is_identity(self) -> bool: ...
    def scale_loss(self, loss: PyTree) -> PyTree: ...
    def unscale(self, grads: PyTree) -> PyTree: ...
    def unscale_and_check(
        self, grads: PyTree, *, backend: Backend = "auto"
    ) -> tuple[PyTree, jax.Array]: ...
    def update(
        self, found_inf: Any, *, axis_name: Hashable | None = None, backend: Backend = "auto"
    ) -> Scaler: ...


class _Common:
    """What every scaler shares; subclasses define ``state`` and ``update``."""

    state: ScaleState
    drop_overflow_update: bool

    def __post_init__(self) -> None:
        flag = checked_once(check_bool, self.drop_overflow_update, "drop_overflow_update")
        object.__setattr__(self, "drop_overflow_update", flag)

    @property
    def is_identity(self) -> bool:
        return False

    @property
    def scale(self) -> jax.Array:
        """The current scale (float array, shape () or (1,))."""
        return self.state.scale

    @property
    def scale_state(self) -> ScaleState:
        return self.state

    def scale_loss(self, loss: PyTree) -> PyTree:
        """``loss * scale`` (see `jax_amp_scale.scale_loss`)."""
        return scaling.scale_loss(loss, self)

    def unscale(self, grads: PyTree) -> PyTree:
        """Every floating leaf times ``float32(1 / scale)``."""
        return scaling.unscale(grads, self)

    def unscale_and_check(
        self, grads: PyTree, *, backend: Backend = "auto"
    ) -> tuple[PyTree, jax.Array]:
        """``(unscaled, found_inf)`` (see `jax_amp_scale.unscale_and_check`)."""
        scale = None if self.is_identity else self.state.scale.reshape(())
        return gradient_pass.unscale_and_check(grads, scale, backend)

    def update(
        self: _Fixed,
        found_inf: Any,
        *,
        axis_name: Hashable | None = None,
        backend: Backend = "auto",
    ) -> _Fixed:
        """A fixed scale's update: `found_inf` is checked, the scaler returned as it is."""
        _found(found_inf, self.state, None)  # validates; the decision is unused
        return self

    def adjust(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(ADJUST_ERROR.format(cls=type(self).__name__))

    def unscale_and_update(
        self: _Fixed,
        grads: PyTree,
        *,
        axis_name: Hashable | None = None,
        backend: Backend = "auto",
        update_backend: Backend | None = None,
    ) -> tuple[PyTree, jax.Array, _Fixed]:
        """``(unscaled, found_inf, next scaler)``: `unscale_and_check`, the flag
        OR-reduced over `axis_name`, then `update` (with `update_backend`,
        default `backend`); `AmaxScaler` also measures the amax in the pass."""
        grads, found = self.unscale_and_check(grads, backend=backend)
        found = or_across(found, axis_name)
        return grads, found, self.update(found, backend=update_backend or backend)


def _found(found_inf: Any, state: ScaleState, axis_name: Hashable | None) -> jax.Array:
    return or_across(found_to_bool(found_inf, tuple(state.scale.shape)), axis_name)


@dataclasses.dataclass(frozen=True)
class DynamicScaler(_Common):
    """torch ``GradScaler``'s dynamic scale, optionally bounded and with hysteresis.

    ``update`` runs the core `update_scale` and then, only where configured,
    corrects its result::

      found = found_inf (OR-reduced over axis_name)
      left  = hysteresis if not found else max(left - 1, 0)
      new   = update_scale(state, found)             # the core rule, untouched
      if found and left > 0:                          # a tolerated overflow
          new.scale = state.scale                     # (tracker still resets)
      new.scale = clip(new.scale, min_scale, max_scale)

    With the defaults (no bounds, ``hysteresis=1``) ``update`` equals
    `update_scale` bit for bit.  Build one with `dynamic_scaler`.

    Leaves: ``state`` (the core `ScaleState`), ``hysteresis_left`` (int32,
    shape of the scale).  Static: ``min_scale``, ``max_scale`` (floats or
    None), ``hysteresis`` (int >= 1), ``drop_overflow_update`` (bool).
    """

    state: ScaleState
    hysteresis_left: jax.Array
    min_scale: float | None = None
    max_scale: float | None = None
    hysteresis: int = 1
    drop_overflow_update: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        # The leaves may be anything a transformation or a test puts there.
        dtype = getattr(getattr(self.state, "scale", None), "dtype", None)
        bounds = (self.min_scale, self.max_scale, self.hysteresis, dtype)
        checked = checked_once(_check_bounds, *bounds)
        for name, value in zip(("min_scale", "max_scale", "hysteresis"), checked, strict=True):
            object.__setattr__(self, name, value)

    def update(
        self, found_inf: Any, *, axis_name: Hashable | None = None, backend: Backend = "auto"
    ) -> DynamicScaler:
        """The scaler after one step; `found_inf` True (nonzero, NaN) is an overflow."""
        found = _found(found_inf, self.state, axis_name)
        new = update_scale(self.state, found, backend)
        scale = new.scale
        old = self.hysteresis_left
        left = jnp.where(
            found, jnp.maximum(old - 1, 0), jnp.full_like(old, self.hysteresis)
        ).astype(jnp.int32)
        if self.hysteresis > 1:  # with 1, left > 0 never holds after an overflow
            scale = jnp.where(found & (left > 0), self.state.scale, scale)
        if self.min_scale is not None or self.max_scale is not None:
            scale = jnp.clip(scale, self.min_scale, self.max_scale)  # bounds in scale's dtype
        return dataclasses.replace(
            self, state=dataclasses.replace(new, scale=scale), hysteresis_left=left
        )


@dataclasses.dataclass(frozen=True)
class StaticScaler(_Common):
    """A fixed scale (MindSpore's ``FixedLossScaleManager``).

    ``update`` validates `found_inf` and returns the scaler unchanged; its
    `ScaleState` has factors 1.0, so even `update_scale` keeps the scale.
    Leaves: ``state``.  Static: ``drop_overflow_update``.
    """

    state: ScaleState
    drop_overflow_update: bool = True


@dataclasses.dataclass(frozen=True)
class NoOpScaler(_Common):
    """No scaling (bfloat16/float32 runs): scale 1, nothing multiplied.

    ``unscale_and_check`` still reports non-finite gradients, so overflow
    steps are skipped unless ``drop_overflow_update=False``.  Leaves:
    ``state`` (scale 1.0).  Static: ``drop_overflow_update``.
    """

    state: ScaleState
    drop_overflow_update: bool = True

    @property
    def is_identity(self) -> bool:
        return True


# AmaxScaler's reason codes (its ``reason`` leaf).
_NO_STEP, _FINITE, _OVERFLOW, _NOT_SCALE = -1, 0, 1, 2
_GROWTH_LOG2 = 1  # at most x2 per step once a step has been measured
_NO_LIMIT = 1 << 20  # "no bound" for an exponent (all-zero gradients)


@dataclasses.dataclass(frozen=True)
class AmaxScaler(_Common):
    """A power-of-two scale set ahead of overflow from the step's amax.

    Build one with `amax_scaler` (the rule, in full, is in its docstring and
    in docs/guide/amax-scaler.md).  ``unscale_and_update`` unscales and checks
    the gradients and measures ``amax``, the largest absolute gradient among the
    finite entries in scaled units, in the same function; ``update(found_inf,
    amax=...)`` applies the rule.

    Leaves: ``state`` (a `ScaleState` whose factors are 1.0: the core
    `update_scale` never moves it), ``amax`` (float32, the last step's),
    ``headroom_used`` (float32, ``amax / largest finite of compute_dtype``),
    ``reason`` (int32: -1 no step yet, 0 finite, 1 overflow: backed off, 2
    non-finite but not attributed to the scale: skipped, scale held),
    ``run`` (int32, non-finite steps in a row), ``finite_steps`` (int32),
    ``leaf_amax`` (float32, one per named leaf; None unless asked).
    Static: ``margin``, ``micro_batches``, ``min_scale``, ``max_scale``,
    ``max_backoffs``, ``compute_dtype`` (a dtype name), ``leaf_paths``,
    ``drop_overflow_update``.
    """

    state: ScaleState
    amax: jax.Array
    headroom_used: jax.Array
    reason: jax.Array
    run: jax.Array
    finite_steps: jax.Array
    leaf_amax: jax.Array | None
    margin: int = 5
    micro_batches: int = 1
    min_scale: float = 2.0**-24
    max_scale: float = 2.0**24
    max_backoffs: int = 4
    compute_dtype: str = "float16"
    leaf_paths: tuple[str, ...] = ()
    drop_overflow_update: bool = True

    REASONS: ClassVar[dict[int, str]] = {
        _NO_STEP: "no step yet",
        _FINITE: "finite",
        _OVERFLOW: "overflow",
        _NOT_SCALE: "non-finite, not the scale",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "leaf_paths", tuple(self.leaf_paths))  # JSON gives a list

    @property
    def largest(self) -> float:
        """The largest finite value of ``compute_dtype`` (65504 for float16)."""
        return float(jnp.finfo(jnp.dtype(self.compute_dtype)).max)

    @property
    def target(self) -> float:
        """The line the amax is kept under, ``largest / 2**(margin + ceil(log2(micro_batches)))``."""
        return self.largest / 2.0 ** (self.margin + _ceil_log2(self.micro_batches))

    def unscale_and_update(
        self,
        grads: PyTree,
        *,
        axis_name: Hashable | None = None,
        backend: Backend = "auto",
        update_backend: Backend | None = None,
    ) -> tuple[PyTree, jax.Array, AmaxScaler]:
        """``(unscaled, found_inf, next scaler)``, the amax measured in the pass."""
        del update_backend  # the rule is pure JAX
        # The amax comes from the pass itself (one read of each gradient on
        # the CPU's native pass); under axis_name, one pmax beside the flag's.
        scale = self.state.scale.reshape(())
        grads, found, per_leaf = gradient_pass.unscale_check_amax(grads, scale, backend)
        if axis_name is not None:  # one all-reduce: the flag (0 or 1) beside the amaxes
            both = jax.lax.pmax(
                jnp.concatenate([found.astype(jnp.float32)[None], per_leaf]), axis_name
            )
            found, per_leaf = both[0] > 0, both[1:]
        amax = jnp.max(per_leaf, initial=0.0)
        return grads, found, self.update(found, amax=amax, leaf_amax=per_leaf)

    def update(
        self,
        found_inf: Any,
        *,
        amax: Any = None,
        leaf_amax: Any = None,
        axis_name: Hashable | None = None,
        backend: Backend = "auto",
    ) -> AmaxScaler:
        """The scaler after one step (see `amax_scaler` for the rule).

        `amax`: the step's amax in scaled units (finite entries only), as
        `unscale_and_update` measures it; None (generic code that passes only
        found_inf): nothing measured, so a finite step keeps the scale.
        """
        del backend
        found = _found(found_inf, self.state, axis_name).reshape(())
        a = jnp.zeros((), jnp.float32) if amax is None else jnp.asarray(amax, jnp.float32)
        a = a.reshape(())
        if axis_name is not None:
            a = jax.lax.pmax(a, axis_name)
        per: jax.Array | None
        if not self.leaf_paths:
            per = None  # not asked for (and no empty array: orbax refuses those)
        elif leaf_amax is None:
            per = self.leaf_amax
        else:
            per = jnp.asarray(leaf_amax, jnp.float32)
            if per.shape[-1:] != (len(self.leaf_paths),):
                raise ValueError(
                    f"amax_scaler(per_leaf=...) named {len(self.leaf_paths)} floating leaves, "
                    f"the gradients have {per.shape[-1]}: pass per_leaf a tree shaped like them"
                )
        e_lo, e_hi = _log2_exact(self.min_scale), _log2_exact(self.max_scale)
        e_s = jnp.frexp(self.state.scale.reshape(()).astype(jnp.float32))[1] - 1  # log2(scale)
        k = self._room(a)  # largest k with a * 2**k <= target
        measured = amax is not None
        # A finite step: the rule, growth at most x2 once a step has been measured.
        grow = jnp.where(self.finite_steps > 0, jnp.minimum(k, _GROWTH_LOG2), k)
        k_fin = grow if measured else jnp.zeros((), jnp.int32)
        # A non-finite step: back off (at least x1/2, more if the finite entries
        # ask for it) when the finite entries had reached the target line, for
        # the first max_backoffs such steps in a row, and then when the run's
        # length is a power of two (a NaN the model makes walks the scale down
        # only logarithmically in its length); else hold.  Before any finite
        # step nothing is known: from above 1, fall to the probe scale 1 at once.
        run = self.run
        explained = a >= jnp.float32(self.target)
        first = self.finite_steps == 0
        above = first & (e_s > 0)
        back = above | explained | (run < self.max_backoffs) | (((run + 1) & run) == 0)
        k_off = jnp.minimum(k, 0) - 1
        k_off = jnp.where(first, jnp.minimum(k_off, jnp.where(e_s > 0, -e_s, 0)), k_off)
        k_bad = jnp.where(back, k_off, 0)
        e_new = jnp.clip(e_s + jnp.where(found, k_bad, k_fin), e_lo, e_hi)
        scale = jnp.ldexp(jnp.float32(1.0), e_new.astype(jnp.int32))
        reason = jnp.where(found, jnp.where(back, _OVERFLOW, _NOT_SCALE), _FINITE)
        return dataclasses.replace(
            self,
            state=dataclasses.replace(
                self.state, scale=scale.reshape(self.state.scale.shape).astype(self.scale.dtype)
            ),
            amax=a,
            headroom_used=a / jnp.float32(self.largest),
            reason=reason.astype(jnp.int32),
            run=jnp.where(found, self.run + 1, 0).astype(jnp.int32),
            finite_steps=(self.finite_steps + (~found).astype(jnp.int32)).astype(jnp.int32),
            leaf_amax=per,
        )

    def _room(self, a: jax.Array) -> jax.Array:
        """int32: the largest k with ``a * 2**k <= target`` (exact; large for a == 0)."""
        m_t, e_t = math.frexp(self.target)
        m_a, e_a = jnp.frexp(a)
        k = e_t - e_a - (m_a > jnp.float32(m_t)).astype(jnp.int32)
        return jnp.where(a > 0, k, _NO_LIMIT).astype(jnp.int32)

    def leaf_report(self) -> dict[str, float]:
        """Host side: ``{keystr path: amax}`` of the last step, per named leaf."""
        if self.leaf_amax is None:
            return {}
        values = np.asarray(jax.device_get(self.leaf_amax), np.float64).reshape(-1)
        return dict(zip(self.leaf_paths, values.tolist(), strict=True))


# Leaves and static fields are declared once, here, and registered for
# jax.export serialization under the same names.
_META = {
    DynamicScaler: ["min_scale", "max_scale", "hysteresis", "drop_overflow_update"],
    StaticScaler: ["drop_overflow_update"],
    NoOpScaler: ["drop_overflow_update"],
    AmaxScaler: [
        "margin",
        "micro_batches",
        "min_scale",
        "max_scale",
        "max_backoffs",
        "compute_dtype",
        "leaf_paths",
        "drop_overflow_update",
    ],
}
for _cls, _meta in _META.items():
    _data = [f.name for f in dataclasses.fields(_cls) if f.name not in _meta]
    jax.tree_util.register_dataclass(_cls, data_fields=_data, meta_fields=_meta)
    serialization.register_dataclass(_cls, _meta)


def _fixed_state(value: float, dtype: Any, shape: tuple[int, ...]) -> ScaleState:
    # Factors 1.0: the core rule keeps this scale fixed whatever happens.
    return init_scale_state(value, 1.0, 1.0, INT32_MAX, dtype=dtype, shape=shape)


def _optional_bound(value: Any, name: str) -> float | None:
    return None if value is None else check_factor(value, name)


def _check_bounds(
    min_scale: Any, max_scale: Any, hysteresis: Any, dtype: Any, init: Any = None
) -> tuple[float | None, float | None, int]:
    """`DynamicScaler`'s static fields, checked (`dtype`: the scale's, or None;
    `init`: the initial scale, which must lie within the bounds)."""
    lo = _optional_bound(min_scale, "min_scale")
    hi = _optional_bound(max_scale, "max_scale")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"min_scale ({lo}) must be <= max_scale ({hi})")
    if init is not None and ((lo is not None and init < lo) or (hi is not None and init > hi)):
        raise ValueError(
            f"init_scale ({float(init)}) must lie within [min_scale, max_scale] = [{lo}, {hi}]"
        )
    if hi is not None and dtype is not None and hi > float(jnp.finfo(dtype).max):
        raise ValueError(f"max_scale={hi} is not finite in {jnp.dtype(dtype)}")
    if isinstance(hysteresis, bool) or not isinstance(hysteresis, numbers.Integral):
        raise TypeError(f"hysteresis must be an int >= 1, got {hysteresis!r}")
    if not 1 <= int(hysteresis) <= INT32_MAX:
        raise ValueError(f"hysteresis must be an int in [1, {INT32_MAX}], got {hysteresis}")
    return lo, hi, int(hysteresis)


def _warn_direction(state: ScaleState, growth_factor: Any, backoff_factor: Any) -> None:
    # Legal for the operator, but a training scale that grows on overflow or
    # shrinks on success is a typo.
    if state.backoff_factor >= 1.0:
        warnings.warn(
            f"dynamic_scaler: backoff_factor={backoff_factor} >= 1 does not reduce the scale "
            "on an overflow; use a value in (0, 1), such as torch's 0.5",
            stacklevel=3,
        )
    if state.growth_factor <= 1.0:
        warnings.warn(
            f"dynamic_scaler: growth_factor={growth_factor} <= 1 does not grow the scale "
            "after growth_interval finite steps; use a value > 1, such as torch's 2.0 "
            "(or static_scaler(x) for a fixed scale)",
            stacklevel=3,
        )


def dynamic_scaler(
    init_scale: float = DEFAULT_INIT_SCALE,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    backoff_factor: float = DEFAULT_BACKOFF_FACTOR,
    growth_interval: int = DEFAULT_GROWTH_INTERVAL,
    *,
    min_scale: float | None = None,
    max_scale: float | None = None,
    hysteresis: int = 1,
    drop_overflow_update: bool = True,
    dtype: Any = jnp.float32,
    shape: tuple[int, ...] = (),
    rule: str = DEFAULT_RULE,
) -> DynamicScaler:
    """A `DynamicScaler`; defaults equal torch's ``GradScaler`` (2**16, 2.0, 0.5, 2000).

    Args:
      init_scale: the scale of the first step (default ``2**16``); finite,
        > 0 and finite in `dtype` (at most 65504 for a float16 scale).
      growth_factor: what the scale is multiplied by after `growth_interval`
        finite steps in a row (default 2.0); > 1 (a value <= 1 warns).
      backoff_factor: what the scale is multiplied by after an overflowing
        step (default 0.5); in (0, 1) (a value >= 1 warns).
      growth_interval: finite steps in a row after which the scale grows
        (default 2000); an int in [1, 2**31 - 1].
      min_scale: an optional floor (finite, > 0, at most `init_scale`): the
        scale never falls below it, however many steps overflow.
      max_scale: an optional ceiling (finite in `dtype`, at least
        `init_scale` and `min_scale`): the scale never grows above it.
      hysteresis: overflows tolerated in a row (int >= 1) before backing off,
        as DeepSpeed/Megatron; every overflow step is still skipped.
      drop_overflow_update: whether `loss_scaled` and `Trainer` skip a step
        whose gradients overflowed (True, torch's behaviour) or apply it.
      dtype: the scale's dtype: ``jnp.float32`` (default), ``jnp.float16``
        or ``jnp.bfloat16``.
      shape: the scale's shape, ``()`` (default) or ``(1,)`` (Ascend's
        operator's).
      rule: the arithmetic of the growth and backoff: ``"torch"`` (default,
        the product in float64 as ``torch._amp_update_scale_``) or
        ``"cann"`` (CANN's float32 kernel); see :doc:`/operator`.

    Returns:
      A `DynamicScaler` holding the `ScaleState` and these settings.
    """
    state = init_scale_state(
        init_scale, growth_factor, backoff_factor, growth_interval, dtype, shape, rule
    )
    _warn_direction(state, growth_factor, backoff_factor)
    lo, hi, h = _check_bounds(min_scale, max_scale, hysteresis, state.scale.dtype, init_scale)
    left = jnp.full(state.scale.shape, h, jnp.int32)
    return DynamicScaler(state, left, lo, hi, h, drop_overflow_update)


def static_scaler(
    scale: float,
    *,
    drop_overflow_update: bool = True,
    dtype: Any = jnp.float32,
    shape: tuple[int, ...] = (),
) -> StaticScaler:
    """A `StaticScaler` of `scale` (finite, > 0, finite in `dtype`)."""
    value = check_factor(scale, "scale")
    dt = check_dtype(dtype)
    with np.errstate(over="ignore"):
        stored = float(np.float32(np.asarray(value, dt)))
    if not math.isfinite(stored):
        raise ValueError(
            f"scale={scale!r} is not finite in {dt.name} (max {float(jnp.finfo(dt).max)})"
        )
    return StaticScaler(_fixed_state(value, dt, shape), drop_overflow_update)


def no_op_scaler(*, drop_overflow_update: bool = True) -> NoOpScaler:
    """A `NoOpScaler`: no scaling; non-finite steps skipped unless told otherwise."""
    return NoOpScaler(_fixed_state(1.0, jnp.float32, ()), drop_overflow_update)


def _ceil_log2(n: int) -> int:
    return (int(n) - 1).bit_length()


def _log2_exact(value: float) -> int:
    _, e = math.frexp(value)
    return e - 1  # value is a checked power of two: m == 0.5


def _int_in(value: Any, name: str, lo: int, hi: int) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or not lo <= int(value) <= hi
    ):
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")
    return int(value)


def _power_of_two(value: Any, name: str) -> float:
    v = check_factor(value, name)
    m, e = math.frexp(v)
    if m != 0.5 or not -126 <= e - 1 <= 127:
        raise ValueError(
            f"{name} must be a power of two in [2**-126, 2**127] (so that unscaling is "
            f"exact), got {value!r}"
        )
    return v


_COMPUTE_DTYPES = ("float16", "bfloat16", "float32")


def amax_scaler(
    margin: int = 5,
    *,
    init_scale: float = 1.0,
    min_scale: float = 2.0**-24,
    max_scale: float = 2.0**24,
    micro_batches: int = 1,
    max_backoffs: int = 4,
    compute_dtype: Any = jnp.float16,
    per_leaf: PyTree = None,
    drop_overflow_update: bool = True,
) -> AmaxScaler:
    """An `AmaxScaler`: a power-of-two scale set from the step's amax, ahead of overflow.

    The rule (``F``: the largest finite value of `compute_dtype`, 65504 for
    float16; ``M = margin + ceil(log2(micro_batches))``; ``T = F / 2**M``;
    ``a``: the step's amax, the largest absolute gradient among the finite entries,
    in scaled units, measured at scale ``s``; ``k(a)``: the largest integer
    with ``a * 2**k <= T``, +inf for ``a == 0``)::

      finite step:      next = s * 2**min(k(a), 1)      (first finite step: s * 2**k(a))
      non-finite step, no finite step yet and s > 1:  next = 1  (the probe scale)
      non-finite step, a >= T or run < max_backoffs or run + 1 a power of two:
                        next = s * 2**(min(k(a), 0) - 1)          (reason 1: overflow)
      other non-finite: next = s        (reason 2: not the scale's doing)
      next = clip(next, min_scale, max_scale)

    so decreases take effect at once, increases are at most x2 per step,
    and the scale stays a power of two (unscaling is exact).  ``run`` is
    the number of non-finite steps in a row before this one: a NaN the
    model makes walks the scale down by ``max_backoffs + log2(length)``
    halvings, not to `min_scale`.  A non-finite step is skipped as with any
    scaler (``drop_overflow_update``).

    Args:
      margin: log2 of the headroom kept below ``F`` (default 5, measured on
        the transformer example: docs/guide/amax-scaler.md); an int in [0, 24].
      init_scale: the first step's scale (default 1.0: no gradient that is
        finite unscaled can overflow at 1; the first finite step then jumps
        straight to the rule's scale); a power of two in [min_scale, max_scale].
      min_scale, max_scale: powers of two bounding the scale (defaults
        2**-24 and 2**24; for bfloat16/float32 compute, whose ``F`` is
        ~3e38, ``max_scale`` is the scale in practice).
      micro_batches: gradients averaged into one step (accumulation window
        times replicas); adds ``ceil(log2(micro_batches))`` to the margin,
        since the amax is read from the average.  An int >= 1.
      max_backoffs: non-finite steps in a row that back off although the
        finite entries stayed below ``T`` (an inf in one place or NaNs
        that may or may not be the scale's); after them only the 8th, 16th,
        32nd, ... in a row do, so a NaN the model makes does not walk the
        scale to `min_scale`, and a real overflow is still left.  Int in [0, 64].
      compute_dtype: the dtype the backward pass runs in: ``float16``
        (default), ``bfloat16`` or ``float32``.
      per_leaf: None (default), or a pytree shaped like the gradients (the
        params): the last step's amax is then kept per floating leaf, named
        by ``jax.tree_util.keystr`` path (`AmaxScaler.leaf_report`).
      drop_overflow_update: skip non-finite steps (default True).
    """
    m = _int_in(margin, "margin", 0, 24)
    k = _int_in(micro_batches, "micro_batches", 1, INT32_MAX)
    nb = _int_in(max_backoffs, "max_backoffs", 0, 64)
    lo = _power_of_two(min_scale, "min_scale")
    hi = _power_of_two(max_scale, "max_scale")
    init = _power_of_two(init_scale, "init_scale")
    if not lo <= init <= hi:
        raise ValueError(
            f"init_scale ({init}) must lie within [min_scale, max_scale] = [{lo}, {hi}]"
        )
    try:
        name = jnp.dtype(compute_dtype).name
    except TypeError:
        name = repr(compute_dtype)
    if name not in _COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {', '.join(_COMPUTE_DTYPES)}; got {name}")
    paths: tuple[str, ...] = ()
    if per_leaf is not None:
        flat, _ = jax.tree_util.tree_flatten_with_path(per_leaf)
        paths = tuple(jax.tree_util.keystr(p) for p, x in flat if is_float_leaf(x))
        if not paths:
            raise ValueError("per_leaf must be a pytree with floating leaves (the params), or None")
    f32 = functools.partial(jnp.zeros, (), jnp.float32)
    i32 = functools.partial(jnp.zeros, (), jnp.int32)
    return AmaxScaler(
        _fixed_state(init, jnp.float32, ()),
        f32(),
        f32(),
        jnp.full((), _NO_STEP, jnp.int32),
        i32(),
        i32(),
        jnp.zeros((len(paths),), jnp.float32) if paths else None,
        m,
        k,
        lo,
        hi,
        nb,
        name,
        paths,
        drop_overflow_update,
    )


def as_scaler(
    value: Any, name: str = "scaler"
) -> DynamicScaler | StaticScaler | NoOpScaler | AmaxScaler:
    """`value` as a scaler: scalers pass through, a `ScaleState` becomes a
    `DynamicScaler` without bounds or hysteresis, None the default dynamic one."""
    if value is None:
        return dynamic_scaler()
    if isinstance(value, DynamicScaler | StaticScaler | NoOpScaler | AmaxScaler):
        return value
    if isinstance(value, ScaleState):
        return DynamicScaler(value, jnp.ones(jnp.shape(value.scale), jnp.int32))
    raise TypeError(
        f"{name} must be a DynamicScaler, StaticScaler, NoOpScaler, AmaxScaler or ScaleState "
        f"(build one with dynamic_scaler(), static_scaler(x), no_op_scaler() or "
        f"amax_scaler()); "
        f"got {type(value).__name__}"
    )
