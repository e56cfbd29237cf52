"""Input checks run once, at the public boundary, at trace time.

Each check names the argument and the values it allows.  Checks return the
value in the form the layers below expect (an array of the right shape, a
Python number), so nothing below validates again.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Callable, Collection
from typing import Any, Literal, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

# The scale dtypes (the Ascend operator's), the int32 range of the tracker
# and interval, and the published kernels a state can follow (ScaleState).
SCALE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
INT32_MAX = 2**31 - 1
RULES: tuple[str, ...] = ("torch", "cann")

Backend = Literal["auto", "reference", "ffi"]
BACKENDS: tuple[str, ...] = ("auto", "reference", "ffi")
SHAPES: tuple[tuple[int, ...], ...] = ((), (1,))
T = TypeVar("T")

# Bit masks of everything but the sign, per float width: a float is "found"
# when any of these bits is set (nonzero, subnormal, inf or NaN).  Comparing
# with `!= 0` instead would let XLA:CPU's denormals-are-zero read a subnormal
# found_inf as zero under jit, and as nonzero eagerly.
_MAGNITUDE_BITS = {
    2: (np.uint16, 0x7FFF),
    4: (np.uint32, 0x7FFFFFFF),
    8: (np.uint64, (1 << 63) - 1),
}


def check_backend(backend: Any) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return str(backend)


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_scale(x: Any, name: str) -> jax.Array:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        raise TypeError(
            f"{name} must be a float32/float16/bfloat16 array of shape () or (1,), "
            f"got {type(x).__name__}"
        )
    if jnp.dtype(dtype) not in SCALE_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {jnp.dtype(dtype).name}")
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


def nonzero_bits(x: jax.Array) -> jax.Array:
    """`x != 0` read from the bits: subnormals and NaN count, -0.0 does not.

    Exact under jit on every backend (no float comparison, so no
    flush-to-zero); bool and integer arrays compare as usual.
    """
    dtype = jnp.dtype(x.dtype)
    if dtype == jnp.bool_:
        return x
    if not jnp.issubdtype(dtype, jnp.floating):
        return x != 0
    uint, mask = _MAGNITUDE_BITS[dtype.itemsize]
    bits = jax.lax.bitcast_convert_type(x, uint)
    return (bits & jnp.asarray(mask, uint)) != 0


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
    return nonzero_bits(jnp.asarray(found_inf)).reshape(shape)


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


def check_growth_interval(value: Any, name: str = "growth_interval") -> int:
    """`value` as a Python int in [1, 2**31 - 1]."""
    allowed = f"an integer in [1, {INT32_MAX}]"
    out = int(_static(value, name, numbers.Integral, "int", allowed))
    if not 1 <= out <= INT32_MAX:
        raise ValueError(f"{name} must lie in [1, {INT32_MAX}], got {out}")
    return out


def check_rule(value: Any, name: str = "rule") -> str:
    """Returns `value` if it is one of `RULES`, or raises naming `name`."""
    if not isinstance(value, str) or value not in RULES:
        raise ValueError(f"{name} must be one of {RULES}, got {value!r}")
    return value


def check_rule_factor(value: float, rule: str, name: str) -> float:
    """`value` (a checked factor) if `rule` can use it: under ``"cann"`` it
    is rounded to float32, which must stay finite and nonzero."""
    if rule == "cann":
        with np.errstate(over="ignore", under="ignore"):
            f32 = np.float32(value)
        if not (np.isfinite(f32) and f32 > 0):
            raise ValueError(
                f"{name}={value!r} is {float(f32)} in float32; rule='cann' multiplies "
                "by float32 factors, which must be finite and nonzero"
            )
    return value


def check_dtype(
    dtype: Any,
    name: str = "dtype",
    allowed: Collection[Any] = SCALE_DTYPES,
    words: str = "float32, float16 or bfloat16",
) -> np.dtype:
    """`dtype` as a NumPy dtype if it is one of `allowed` (named by `words`)."""
    try:
        dt = jnp.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"{name} must be {words}, got {dtype!r}") from e
    if dt not in allowed:
        raise TypeError(f"{name} must be {words}, got {dt.name}")
    return dt


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
