"""Scale kinds: dynamic, static and no-op loss scales behind one interface.

Every kind is an immutable pytree (``jax.tree_util.register_dataclass``: the
leaves and the static fields are declared once, below each class) holding
exactly one core `ScaleState`, and offers:

- ``loss_scale``: the current scale (float array, shape of the state);
- ``scale(tree)`` / ``unscale(tree)`` / ``unscale_and_check(tree)``;
- ``adjust(found_inf, *, axis_name=None, backend="auto")``: the next kind;
- ``drop_overflow_update``: whether optimizers should skip overflow steps.
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings
from collections.abc import Hashable
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from jax_amp_scale.ops.update_scale import or_across, update_scale
from jax_amp_scale.state.scale_state import (
    DEFAULT_BACKOFF_FACTOR,
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_GROWTH_INTERVAL,
    DEFAULT_INIT_SCALE,
    DEFAULT_RULE,
    INT32_MAX,
    ScaleState,
    check_factor,
    init_scale_state,
)
from jax_amp_scale.state.validation import Backend, check_bool, found_to_bool
from jax_amp_scale.training import helpers

PyTree = Any


@runtime_checkable
class LossScale(Protocol):
    """The interface shared by `DynamicScale`, `StaticScale` and `NoOpScale`."""

    @property
    def loss_scale(self) -> jax.Array: ...

    @property
    def scale_state(self) -> ScaleState: ...

    @property
    def drop_overflow_update(self) -> bool: ...

    @property
    def is_identity(self) -> bool: ...

    def scale(self, tree: PyTree) -> PyTree: ...

    def unscale(self, tree: PyTree) -> PyTree: ...

    def unscale_and_check(
        self, tree: PyTree, *, backend: Backend = "auto"
    ) -> tuple[PyTree, jax.Array]: ...

    def adjust(
        self,
        found_inf: Any,
        *,
        axis_name: Hashable | None = None,
        backend: Backend = "auto",
    ) -> LossScale: ...


class _Common:
    """Methods every kind shares; subclasses define ``state``."""

    state: ScaleState

    @property
    def is_identity(self) -> bool:
        return False

    @property
    def loss_scale(self) -> jax.Array:
        return self.state.scale

    @property
    def scale_state(self) -> ScaleState:
        return self.state

    def scale(self, tree: PyTree) -> PyTree:
        return helpers.scale_loss(tree, self)

    def unscale(self, tree: PyTree) -> PyTree:
        return helpers.unscale(tree, self)

    def unscale_and_check(
        self, tree: PyTree, *, backend: Backend = "auto"
    ) -> tuple[PyTree, jax.Array]:
        return helpers.unscale_and_check(tree, self, backend=backend)


def _found(found_inf: Any, state: ScaleState, axis_name: Hashable | None) -> jax.Array:
    found = found_to_bool(found_inf, tuple(state.scale.shape))
    return or_across(found, axis_name)


def _optional_bound(value: Any, name: str) -> float | None:
    if value is None:
        return None
    return check_factor(value, name)


@dataclasses.dataclass(frozen=True)
class DynamicScale(_Common):
    """Dynamic loss scale: the core rule, optionally bounded and with hysteresis.

    ``adjust`` runs the core `update_scale` (the Ascend/torch rule) and then,
    only where configured, corrects its result::

      found = found_inf (OR-reduced over axis_name)
      left  = hysteresis if not found else max(left - 1, 0)
      new   = update_scale(state, found)             # the core rule, untouched
      if found and left > 0:                          # a tolerated overflow
          new.scale = state.scale                     # (tracker still resets)
      new.scale = clip(new.scale, min_scale, max_scale)

    With the defaults (no bounds, ``hysteresis=1``) ``adjust`` equals
    `update_scale` bit for bit.  Build one with `dynamic_scale`.

    Leaves: ``state`` (the core `ScaleState`), ``hysteresis_left`` (int32,
    shape of the scale: overflows still tolerated).  Static: ``min_scale``,
    ``max_scale`` (floats or None), ``hysteresis`` (int >= 1).
    """

    state: ScaleState
    hysteresis_left: jax.Array
    min_scale: float | None = None
    max_scale: float | None = None
    hysteresis: int = 1

    @property
    def drop_overflow_update(self) -> bool:
        return True

    def adjust(
        self,
        found_inf: Any,
        *,
        axis_name: Hashable | None = None,
        backend: Backend = "auto",
    ) -> DynamicScale:
        """The kind after one step with `found_inf` (nonzero or NaN: overflow)."""
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
            dt = scale.dtype
            lo = None if self.min_scale is None else jnp.asarray(self.min_scale, dt)
            hi = None if self.max_scale is None else jnp.asarray(self.max_scale, dt)
            scale = jnp.clip(scale, lo, hi)
        return dataclasses.replace(
            self, state=dataclasses.replace(new, scale=scale), hysteresis_left=left
        )


jax.tree_util.register_dataclass(
    DynamicScale,
    data_fields=["state", "hysteresis_left"],
    meta_fields=["min_scale", "max_scale", "hysteresis"],
)


@dataclasses.dataclass(frozen=True)
class StaticScale(_Common):
    """A fixed loss scale, like MindSpore's ``FixedLossScaleManager``.

    ``adjust`` returns the kind unchanged (after validating found_inf).
    ``drop_overflow_update`` tells `loss_scaled` and `Trainer` whether to skip
    overflow steps (MindSpore's default: True).  The `ScaleState` it holds has
    factors 1.0, so even `update_scale` leaves its scale where it is.

    Leaves: ``state``.  Static: ``drop_overflow_update``.
    """

    state: ScaleState
    drop_overflow_update: bool = True  # type: ignore[misc]

    def adjust(
        self,
        found_inf: Any,
        *,
        axis_name: Hashable | None = None,
        backend: Backend = "auto",
    ) -> StaticScale:
        _found(found_inf, self.state, None)  # validates; the decision is unused
        return self


jax.tree_util.register_dataclass(
    StaticScale, data_fields=["state"], meta_fields=["drop_overflow_update"]
)


@dataclasses.dataclass(frozen=True)
class NoOpScale(_Common):
    """No loss scaling (bfloat16/float32 runs): scale 1, nothing multiplied.

    ``unscale_and_check`` still reports non-finite gradients, so optimizers
    can skip such steps when ``drop_overflow_update`` is True.

    Leaves: ``state`` (scale 1.0).  Static: ``drop_overflow_update``.
    """

    state: ScaleState
    drop_overflow_update: bool = True  # type: ignore[misc]

    @property
    def is_identity(self) -> bool:
        return True

    def adjust(
        self,
        found_inf: Any,
        *,
        axis_name: Hashable | None = None,
        backend: Backend = "auto",
    ) -> NoOpScale:
        _found(found_inf, self.state, None)
        return self


jax.tree_util.register_dataclass(
    NoOpScale, data_fields=["state"], meta_fields=["drop_overflow_update"]
)


def _fixed_state(value: float, dtype: Any, shape: tuple[int, ...]) -> ScaleState:
    # Factors 1.0: the core rule keeps this scale fixed whatever happens.
    return init_scale_state(value, 1.0, 1.0, INT32_MAX, dtype=dtype, shape=shape)


def dynamic_scale(
    init_scale: float = DEFAULT_INIT_SCALE,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    backoff_factor: float = DEFAULT_BACKOFF_FACTOR,
    growth_interval: int = DEFAULT_GROWTH_INTERVAL,
    *,
    min_scale: float | None = None,
    max_scale: float | None = None,
    hysteresis: int = 1,
    dtype: Any = jnp.float32,
    shape: tuple[int, ...] = (),
    rule: str = DEFAULT_RULE,
) -> DynamicScale:
    """A `DynamicScale`; defaults equal torch's ``GradScaler`` (2**16, 2.0, 0.5, 2000).

    Args:
      init_scale, growth_factor, backoff_factor, growth_interval, dtype, shape,
        rule: as in `init_scale_state` (``rule="cann"``: CANN's arithmetic).
      min_scale, max_scale: optional bounds (finite, > 0, ``min <= init <=
        max``): the scale never leaves ``[min_scale, max_scale]``.
      hysteresis: overflows tolerated in a row (int >= 1) before backing off,
        as DeepSpeed/Megatron; every overflow step is still skipped.
    """
    state = init_scale_state(
        init_scale,
        growth_factor,
        backoff_factor,
        growth_interval,
        dtype=dtype,
        shape=shape,
        rule=rule,
    )
    # Legal for the operator (the spec allows any positive factor), but a
    # training scale that grows on overflow or shrinks on success is a typo.
    if state.backoff_factor >= 1.0:
        warnings.warn(
            f"dynamic_scale: backoff_factor={backoff_factor} >= 1 does not reduce the scale "
            "on an overflow; use a value in (0, 1), such as torch's 0.5",
            UserWarning,
            stacklevel=2,
        )
    if state.growth_factor <= 1.0:
        warnings.warn(
            f"dynamic_scale: growth_factor={growth_factor} <= 1 does not grow the scale "
            "after growth_interval finite steps; use a value > 1, such as torch's 2.0 "
            "(or static_scale(x) for a fixed scale)",
            UserWarning,
            stacklevel=2,
        )
    lo = _optional_bound(min_scale, "min_scale")
    hi = _optional_bound(max_scale, "max_scale")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"min_scale ({lo}) must be <= max_scale ({hi})")
    init = float(init_scale)
    if (lo is not None and init < lo) or (hi is not None and init > hi):
        raise ValueError(
            f"init_scale ({init}) must lie within [min_scale, max_scale] = [{lo}, {hi}]"
        )
    if hi is not None and hi > float(jnp.finfo(state.scale.dtype).max):
        raise ValueError(f"max_scale={hi} is not finite in {state.scale.dtype}")
    if isinstance(hysteresis, bool) or not isinstance(hysteresis, numbers.Integral):
        raise TypeError(f"hysteresis must be an int >= 1, got {hysteresis!r}")
    if not 1 <= int(hysteresis) <= INT32_MAX:
        raise ValueError(f"hysteresis must be an int in [1, {INT32_MAX}], got {hysteresis}")
    return DynamicScale(
        state=state,
        hysteresis_left=jnp.full(state.scale.shape, int(hysteresis), jnp.int32),
        min_scale=lo,
        max_scale=hi,
        hysteresis=int(hysteresis),
    )


def static_scale(
    loss_scale: float,
    *,
    drop_overflow_update: bool = True,
    dtype: Any = jnp.float32,
    shape: tuple[int, ...] = (),
) -> StaticScale:
    """A `StaticScale` of `loss_scale` (finite, > 0, finite in `dtype`)."""
    return StaticScale(
        state=_fixed_state(loss_scale, dtype, shape),
        drop_overflow_update=check_bool(drop_overflow_update, "drop_overflow_update"),
    )


def no_op_scale(*, drop_overflow_update: bool = True) -> NoOpScale:
    """A `NoOpScale`: no scaling; non-finite steps skipped unless told otherwise."""
    return NoOpScale(
        state=_fixed_state(1.0, jnp.float32, ()),
        drop_overflow_update=check_bool(drop_overflow_update, "drop_overflow_update"),
    )


KINDS = (DynamicScale, StaticScale, NoOpScale)


def as_loss_scale(value: Any, name: str = "scale") -> DynamicScale | StaticScale | NoOpScale:
    """`value` as a scale kind: kinds pass through, a `ScaleState` becomes a
    `DynamicScale` without bounds or hysteresis, None the default dynamic one."""
    if value is None:
        return dynamic_scale()
    if isinstance(value, KINDS):
        return value
    if isinstance(value, ScaleState):
        return DynamicScale(
            state=value, hysteresis_left=jnp.ones(jnp.shape(value.scale), jnp.int32)
        )
    raise TypeError(
        f"{name} must be a DynamicScale, StaticScale, NoOpScale or ScaleState "
        f"(build one with dynamic_scale(), static_scale(x) or no_op_scale()); "
        f"got {type(value).__name__}"
    )
