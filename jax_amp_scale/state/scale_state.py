"""`ScaleState`: the dynamic loss-scale state as an immutable pytree."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import export  # jax 0.6: not an attribute of jax until imported

from jax_amp_scale.state.validation import (
    SHAPES,
    check_dtype,
    check_factor,
    check_rule,
    check_static,
)

# Torch GradScaler's defaults, which are also jmp's and MindSpore's choices
# for growth and backoff.
DEFAULT_INIT_SCALE = 2.0**16
DEFAULT_GROWTH_FACTOR = 2.0
DEFAULT_BACKOFF_FACTOR = 0.5
DEFAULT_GROWTH_INTERVAL = 2000

# Which published kernel's arithmetic a state follows (docs/operator.md):
# torch's _amp_update_scale_ (float64 product, the default:
# a torch port gets torch's bits) or CANN's aclnnAmpUpdateScale (float32
# factors and product, finiteness tested on the float32 product; plus the
# library's guard against an infinite stored scale).
DEFAULT_RULE = "torch"  # one of validation.RULES


@dataclasses.dataclass(frozen=True)
class ScaleState:
    """Dynamic loss-scale state, one step of which is `update_scale`.

    Leaves (arrays, change every step):
      scale: the loss scale, float32/float16/bfloat16, shape ``()`` or ``(1,)``.
      growth_tracker: int32 count of consecutive finite steps, same shape.

    Static metadata (Python numbers; part of the treedef, so they become
    compile-time constants and FFI attributes):
      growth_factor: multiplier applied every ``growth_interval`` finite steps.
      backoff_factor: multiplier applied on a step with non-finite gradients.
      growth_interval: finite steps between growths, in [1, 2**31 - 1].
      rule: ``"torch"`` (default) or ``"cann"``: whose arithmetic
        ``scale * factor`` follows.  ``"torch"``: the exact product rounded
        to float64, then to the scale's dtype (``torch._amp_update_scale_``).
        ``"cann"``: factors rounded to float32, the scale widened to float32,
        a float32 product, growth refused when it is not finite or when the
        value stored in the scale's dtype is infinite (CANN's
        ``aclnnAmpUpdateScale`` plus that guard).  Both give the same bits
        for power-of-two factors (the defaults 2.0 and 0.5).

    The rule, per step (``found_inf`` nonzero or NaN means overflow)::

      if found_inf:
          scale, tracker = scale * backoff_factor, 0
      elif tracker + 1 == growth_interval:       # int32, wrapping
          grown = scale * growth_factor
          scale = grown if isfinite(grown) else scale
          tracker = 0
      else:
          tracker = tracker + 1

    Build one with `init_scale_state`.  The static fields are checked when
    a state is built, so a `ScaleState` that exists has valid ones; the
    leaves are checked where they are used (transformations rebuild a state
    with batched or tangent leaves).
    """

    scale: jax.Array
    growth_tracker: jax.Array
    growth_factor: float = DEFAULT_GROWTH_FACTOR
    backoff_factor: float = DEFAULT_BACKOFF_FACTOR
    growth_interval: int = DEFAULT_GROWTH_INTERVAL
    rule: str = DEFAULT_RULE

    def __post_init__(self) -> None:
        static = (self.growth_factor, self.backoff_factor, self.growth_interval, self.rule)
        for name, value in zip(STATIC_FIELDS, checked_once(check_static, *static), strict=True):
            object.__setattr__(self, name, value)


STATIC_FIELDS = ("growth_factor", "backoff_factor", "growth_interval", "rule")


# Leaves and static fields are declared once, here; jmp's hand-written
# flatten once dropped a field this way, so every field is tested under jit.
jax.tree_util.register_dataclass(
    ScaleState,
    data_fields=["scale", "growth_tracker"],
    meta_fields=list(STATIC_FIELDS),
)


def _serialize_auxdata(aux: tuple[Any, ...]) -> bytes:
    # JSON keeps a float's repr, which reads back to the same double.
    return json.dumps(list(aux)).encode()


def _deserialize_auxdata(data: bytes) -> tuple[Any, ...]:
    return tuple(json.loads(data.decode()))


# For jax.export: a step whose arguments or results hold a ScaleState can be
# serialized (jax_amp_scale.export).  The name is part of every artifact:
# never change it.
export.register_pytree_node_serialization(
    ScaleState,
    serialized_name="jax_amp_scale.ScaleState",
    serialize_auxdata=_serialize_auxdata,
    deserialize_auxdata=_deserialize_auxdata,
)


def init_scale_state(
    init_scale: float = DEFAULT_INIT_SCALE,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    backoff_factor: float = DEFAULT_BACKOFF_FACTOR,
    growth_interval: int = DEFAULT_GROWTH_INTERVAL,
    dtype: Any = jnp.float32,
    shape: tuple[int, ...] = (),
    rule: str = DEFAULT_RULE,
) -> ScaleState:
    """Creates a `ScaleState` with tracker 0.

    Args:
      init_scale: starting loss scale (default ``2**16``); finite, > 0 and
        finite in ``dtype`` (``2**16`` overflows float16: use at most 65504
        there).
      growth_factor: the factor the scale grows by after `growth_interval`
        finite steps (default 2.0); a finite number > 0.
      backoff_factor: the factor the scale shrinks by after an overflow
        (default 0.5); a finite number > 0.
      growth_interval: finite steps in a row before the scale grows
        (default 2000); an integer in [1, 2**31 - 1].
      dtype: the scale's dtype: ``jnp.float32`` (default), ``jnp.float16``
        or ``jnp.bfloat16`` (the Ascend operator's dtypes).
      shape: ``()`` (default) or ``(1,)`` (the Ascend operator uses ``(1,)``).
      rule: ``"torch"`` (default) or ``"cann"``; see `ScaleState`.

    Defaults equal torch's ``GradScaler`` (2**16, 2.0, 0.5, 2000).
    """
    dt = check_dtype(dtype)
    check_rule(rule)
    init = check_factor(init_scale, "init_scale")
    shape = tuple(shape)
    if shape not in SHAPES:
        raise ValueError(f"shape must be () or (1,), got {shape}")
    with np.errstate(over="ignore"):
        scale = np.asarray(init, dtype=dt)
    if not np.isfinite(scale.astype(np.float32)):
        raise ValueError(
            f"init_scale={init_scale!r} is not finite in {dt.name} (max {float(jnp.finfo(dt).max)})"
        )
    return ScaleState(
        scale=jnp.full(shape, init, dtype=dt),
        growth_tracker=jnp.zeros(shape, dtype=jnp.int32),
        growth_factor=growth_factor,
        backoff_factor=backoff_factor,
        growth_interval=growth_interval,
        rule=rule,
    )


T = TypeVar("T")
# Results of `checked_once`, by check and by its arguments' types and values.
_CHECKED: dict[tuple[Any, ...], Any] = {}


def checked_once(check: Callable[..., T], *args: Any) -> T:
    """``check(*args)``, run once per distinct (hashable) arguments.

    States and scalers are rebuilt on every step and every unflatten with
    the static fields they were built with; those were checked then.
    """
    key = (check, args, tuple(map(type, args)))
    with contextlib.suppress(KeyError, TypeError):  # TypeError: unhashable
        return _CHECKED[key]  # type: ignore[no-any-return]
    out = check(*args)
    with contextlib.suppress(TypeError):
        _CHECKED[key] = out
    return out
