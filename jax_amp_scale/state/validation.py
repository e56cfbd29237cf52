"""Input checks run once, at the public boundary, at trace time.

Each check names the argument and the values it allows.  Checks return the
value in the form the layers below expect (an array of the right shape, a
Python number), so nothing below validates again.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# The scale dtypes (the Ascend operator's), the int32 range of the tracker
# and interval, and the published kernels a state can follow (ScaleState).
SCALE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
INT32_MAX = 2**31 - 1
RULES: tuple[str, ...] = ("torch", "cann")
SHAPES: tuple[tuple[int, ...], ...] = ((), (1,))


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


def check_static(
    growth_factor: Any, backoff_factor: Any, growth_interval: Any, rule: Any
) -> tuple[float, float, int, str]:
    """A state's static fields, checked, in the form the layers below take."""
    rule = check_rule(rule)
    return (
        check_rule_factor(check_factor(growth_factor, "growth_factor"), rule, "growth_factor"),
        check_rule_factor(check_factor(backoff_factor, "backoff_factor"), rule, "backoff_factor"),
        check_growth_interval(growth_interval),
        rule,
    )
