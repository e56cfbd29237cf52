"""Scalers: immutable pytrees holding one `ScaleState` and the policy that
adjusts it (`DynamicScaler`, `StaticScaler`, `NoOpScaler`; interface `Scaler`;
`AmaxScaler` in its own module, on the same base).

``update(found_inf)`` takes torch's flag (True: an overflow); jmp's
``adjust(grads_finite)`` takes the opposite, so ``adjust`` raises a TypeError
that shows the fix instead of silently inverting it.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Hashable
from typing import Any, NoReturn, Protocol, TypeVar, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.mechanisms.handlers import Backend
from jax_amp_scale.operators import unscale_and_check as gradient_pass
from jax_amp_scale.operators.scale_state import (
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
    check_int,
    checked_once,
    found_to_bool,
    init_scale_state,
    or_across,
)
from jax_amp_scale.operators.unscale_and_check import PyTree
from jax_amp_scale.operators.update_scale import update_scale
from jax_amp_scale.training import scaling, serialization

_Fixed = TypeVar("_Fixed", bound="ScalerBase")  # typing.Self is 3.11+
_Class = TypeVar("_Class", bound=type)

ADJUST_ERROR = (
    "{cls}.adjust does not exist here: jmp's adjust(grads_finite) takes True for a GOOD "
    "step, and this library's flag is torch's found_inf (True for an overflow). Write "
    "scaler = scaler.update(found_inf), or from jmp code scaler = scaler.update(~grads_finite)."
)


@runtime_checkable
class Scaler(Protocol):
    """The interface of `DynamicScaler`, `StaticScaler`, `NoOpScaler` and `AmaxScaler`."""

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


class ScalerBase:
    """What every scaler shares (`DynamicScaler`, `StaticScaler`, `NoOpScaler`
    and `AmaxScaler` derive from it); subclasses define ``state`` and ``update``."""

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
        found_flag(found_inf, self.state, None)  # validates; the decision is unused
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


def register_scaler(cls: _Class) -> _Class:
    """Registers a scaler dataclass as a pytree and for jax.export serialization:
    the fields with a default are static, the others leaves."""
    fields = dataclasses.fields(cls)
    meta = [f.name for f in fields if f.default is not dataclasses.MISSING]
    data = [f.name for f in fields if f.default is dataclasses.MISSING]
    jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=meta)
    serialization.register_dataclass(cls, meta)
    return cls


def found_flag(found_inf: Any, state: ScaleState, axis_name: Hashable | None) -> jax.Array:
    return or_across(found_to_bool(found_inf, tuple(state.scale.shape)), axis_name)


@register_scaler
@dataclasses.dataclass(frozen=True)
class DynamicScaler(ScalerBase):
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
        """The scaler after one step (see the class for the rule).

        Args:
          found_inf: whether this step's gradients overflowed: a bool, int or
            float scalar (Python, NumPy or JAX; shape ``()`` or ``(1,)``),
            read by its bits: nonzero, subnormal and NaN mean overflow.
          axis_name: optional mapped axis name, or tuple of names, to OR-reduce
            ``found_inf`` across, so every replica takes the same decision.
          backend: the `update_scale` backend: ``"auto"`` (default),
            ``"reference"`` or ``"ffi"``; another value is a ``ValueError``.
        """
        found = found_flag(found_inf, self.state, axis_name)
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


@register_scaler
@dataclasses.dataclass(frozen=True)
class StaticScaler(ScalerBase):
    """A fixed scale (MindSpore's ``FixedLossScaleManager``).

    ``update`` validates `found_inf` and returns the scaler unchanged; its
    `ScaleState` has factors 1.0, so even `update_scale` keeps the scale.
    Leaves: ``state``.  Static: ``drop_overflow_update``.
    """

    state: ScaleState
    drop_overflow_update: bool = True


@register_scaler
@dataclasses.dataclass(frozen=True)
class NoOpScaler(ScalerBase):
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


def fixed_state(value: float, dtype: Any, shape: tuple[int, ...]) -> ScaleState:
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
    return lo, hi, check_int(hysteresis, "hysteresis")


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
      init_scale: the scale of the first step (default ``2**16``); finite
        and > 0; stored rounded to `dtype` (to nearest even), and a
        ``ValueError`` unless finite once rounded: for a float16 scale,
        values below 65520 are accepted and those above 65504 become 65504
        (``2**16`` rounds to ``inf``).
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
    """A `StaticScaler`: a fixed scale, which ``update`` never changes.

    Args:
      scale: the loss scale, a Python or NumPy real number (not a JAX
        array): finite, > 0 and still finite once rounded to `dtype`.
      drop_overflow_update, dtype, shape: as in `dynamic_scaler`.
    """
    value = check_factor(scale, "scale")
    dt = check_dtype(dtype)
    with np.errstate(over="ignore"):
        stored = float(np.float32(np.asarray(value, dt)))
    if not math.isfinite(stored):
        raise ValueError(
            f"scale={scale!r} is not finite in {dt.name} (max {float(jnp.finfo(dt).max)})"
        )
    return StaticScaler(fixed_state(value, dt, shape), drop_overflow_update)


def no_op_scaler(*, drop_overflow_update: bool = True) -> NoOpScaler:
    """A `NoOpScaler`: no scaling (scale 1.0, nothing multiplied).

    Args:
      drop_overflow_update: whether `loss_scaled` and `Trainer` skip a step
        whose gradients are not finite (True, default) or apply it.
    """
    return NoOpScaler(fixed_state(1.0, jnp.float32, ()), drop_overflow_update)


def as_scaler(value: Any, name: str = "scaler") -> ScalerBase:
    """`value` as a scaler: scalers pass through, a `ScaleState` becomes a
    `DynamicScaler` without bounds or hysteresis, None the default dynamic one."""
    if value is None:
        return dynamic_scaler()
    if isinstance(value, ScalerBase):
        return value
    if isinstance(value, ScaleState):
        return DynamicScaler(value, jnp.ones(jnp.shape(value.scale), jnp.int32))
    raise TypeError(
        f"{name} must be a DynamicScaler, StaticScaler, NoOpScaler, AmaxScaler or ScaleState "
        "(build one with dynamic_scaler(), static_scaler(x), no_op_scaler() or "
        f"amax_scaler()); got {type(value).__name__}"
    )
