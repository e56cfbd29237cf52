"""The loss-scale state (`ScaleState`, `init_scale_state`) and the argument
checks the operators and the training layer share: each names the argument
and the values it allows, and returns the value in the form the code below
takes, so nothing below validates again.  Checked once at the public
boundary, at trace time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import numbers
from collections.abc import Callable, Collection, Hashable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import export  # jax 0.6: not an attribute of jax until imported

from jax_amp_scale.mechanisms import floats

# Torch GradScaler's defaults, which are also jmp's and MindSpore's choices
# for growth and backoff.
DEFAULT_INIT_SCALE = 2.0**16
DEFAULT_GROWTH_FACTOR = 2.0
DEFAULT_BACKOFF_FACTOR = 0.5
DEFAULT_GROWTH_INTERVAL = 2000

# Which published kernel's arithmetic a state follows (docs/operator.md):
# torch's _amp_update_scale_ (float64 product, the default: a torch port
# gets torch's bits) or CANN's aclnnAmpUpdateScale (float32 factors and
# product, finiteness tested on the float32 product; plus the library's
# guard against an infinite stored scale).
RULES: tuple[str, ...] = ("torch", "cann")
DEFAULT_RULE = "torch"
INT32_MAX = 2**31 - 1
SHAPES: tuple[tuple[int, ...], ...] = ((), (1,))


# ---- argument checks ---------------------------------------------------------


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _static(value: Any, name: str, kind: type, what: str, allowed: str) -> Any:
    """`value` (Python or NumPy) if it is a `kind` number, or a TypeError."""
    if isinstance(value, jax.Array):  # tracers are jax.Arrays too
        raise TypeError(
            f"{name} must be a Python {what} (it is a static attribute of the "
            f"operator), not a JAX array or traced value; got {type(value).__name__}"
        )
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    return value


def check_factor(value: Any, name: str) -> float:
    """`value` as a Python float: a static real number, finite, > 0."""
    out = float(_static(value, name, numbers.Real, "number", "a real number"))
    if not (math.isfinite(out) and out > 0.0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return out


def check_int(value: Any, name: str, lo: int = 1, hi: int | None = INT32_MAX,
              allowed: str = "") -> int:  # fmt: skip
    """`value` as a Python int in [lo, hi] (hi None: no bound): a TypeError for
    what is not a static integer, a ValueError for one out of range."""
    allowed = allowed or (f"an int in [{lo}, {hi}]" if hi is not None else f"an int >= {lo}")
    out = int(_static(value, name, numbers.Integral, "int", allowed))
    if not lo <= out <= (out if hi is None else hi):
        raise ValueError(f"{name} must be {allowed}, got {out}")
    return out


def check_rule(value: Any, name: str = "rule") -> str:
    """Returns `value` if it is one of `RULES`, or raises naming `name`."""
    if not isinstance(value, str) or value not in RULES:
        raise ValueError(f"{name} must be one of {RULES}, got {value!r}")
    return value


def check_dtype(
    dtype: Any,
    name: str = "dtype",
    allowed: Collection[Any] = floats.SCALE_DTYPES,
    words: str = "float32, float16 or bfloat16",
    error: type[Exception] = TypeError,
) -> np.dtype:
    """`dtype` as a NumPy dtype if it is one of `allowed` (named by `words`)."""
    try:
        dt = jnp.dtype(dtype)
    except TypeError as e:
        raise error(f"{name} must be {words}, got {dtype!r}") from e
    if dt not in allowed:
        raise error(f"{name} must be {words}, got {dt.name}")
    return dt


def check_static(
    growth_factor: Any, backoff_factor: Any, growth_interval: Any, rule: Any
) -> tuple[float, float, int, str]:
    """A state's static fields, checked, in the form the layers below take."""
    rule = check_rule(rule)
    gf = check_factor(growth_factor, "growth_factor")
    bf = check_factor(backoff_factor, "backoff_factor")
    if rule == "cann":
        gf = floats.check_factor_in_float32(gf, "growth_factor")
        bf = floats.check_factor_in_float32(bf, "backoff_factor")
    return gf, bf, check_int(growth_interval, "growth_interval"), rule


def check_scale(x: Any, name: str) -> jax.Array:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        raise TypeError(
            f"{name} must be a float32/float16/bfloat16 array of shape () or (1,), "
            f"got {type(x).__name__}"
        )
    check_dtype(dtype, name)
    if tuple(x.shape) not in SHAPES:
        raise ValueError(f"{name} must have shape () or (1,), got {tuple(x.shape)}")
    return jnp.asarray(x)


def check_tracker(x: Any, shape: tuple[int, ...], name: str) -> jax.Array:
    dtype = getattr(x, "dtype", None)
    if dtype is None or jnp.dtype(dtype) != jnp.int32:
        got = jnp.dtype(dtype).name if dtype is not None else type(x).__name__
        raise TypeError(f"{name} must be an int32 array, got {got}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have the shape of the scale {shape}, got {tuple(x.shape)}")
    return jnp.asarray(x)


def found_to_bool(found_inf: Any, shape: tuple[int, ...]) -> jax.Array:
    """found_inf (any bool/int/float scalar) -> bool array of `shape`.

    Nonzero, subnormal and NaN mean overflow; +0.0 and -0.0 do not, read
    from the bits in every path (eager, jit, vmap).
    """
    if isinstance(found_inf, bool | numbers.Number) and not isinstance(found_inf, complex):
        return jnp.full(shape, bool(found_inf != 0))  # Python arithmetic: exact
    dtype = getattr(found_inf, "dtype", None)
    if dtype is None:
        raise TypeError(
            f"found_inf must be a bool, int or float scalar, got {type(found_inf).__name__}"
        )
    dtype = jnp.dtype(dtype)
    if not (
        dtype == jnp.bool_
        or jnp.issubdtype(dtype, jnp.integer)
        or jnp.issubdtype(dtype, jnp.floating)
    ):
        raise TypeError(f"found_inf must have a bool, integer or float dtype, got {dtype.name}")
    if tuple(found_inf.shape) not in SHAPES:
        raise ValueError(
            f"found_inf must be a scalar (shape () or (1,)), got shape {tuple(found_inf.shape)}"
        )
    if isinstance(found_inf, np.ndarray | np.generic):  # host value: NumPy is exact
        return jnp.full(shape, bool(np.asarray(found_inf).reshape(()) != 0))
    return floats.nonzero_bits(jnp.asarray(found_inf)).reshape(shape)


def or_across(found: jax.Array, axis_name: Hashable | None) -> jax.Array:
    """`found` OR-reduced over the mapped axis (or tuple of axes) `axis_name`."""
    if axis_name is None:
        return found
    return jax.lax.pmax(found.astype(jnp.int32), axis_name) > 0


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


# ---- the state ---------------------------------------------------------------


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
        ``scale * factor`` follows: ``torch._amp_update_scale_``'s float64
        product, or ``aclnnAmpUpdateScale``'s float32 one plus a guard
        against an infinite stored scale (docs/operator.md).  Both give the
        same bits for power-of-two factors (the defaults 2.0 and 0.5).

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
