"""An independent, plain-Python statement of the spec's rule, for tests.

Written from the spec's pseudo-code with Python's exact rationals (no JAX, no
shared code): the product is rounded to float64 (Python float), then to the
scale dtype by NumPy/ml_dtypes, which is what torch does for float32.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

INT32_MAX = 2**31 - 1


def product(scale, factor: float):
    """scale * factor rounded to float64 then to scale's dtype."""
    dtype = scale.dtype
    x = float(np.float32(scale))  # exact widening
    if not np.isfinite(x) or x == 0.0:
        with np.errstate(all="ignore"):
            return np.asarray(np.float64(x) * factor).astype(dtype)[()]
    exact = Fraction(x) * Fraction(factor)
    try:
        as_double = float(exact)  # correctly rounded to float64
    except OverflowError:
        as_double = float("inf") if exact > 0 else float("-inf")
    with np.errstate(all="ignore"):
        return np.asarray(as_double).astype(dtype)[()]


def rule(scale, tracker: int, found_inf, growth_factor, backoff_factor, growth_interval):
    """Returns (new_scale, new_tracker); scale is a NumPy scalar of its dtype."""
    if found_inf != 0 or found_inf != found_inf:  # nonzero or NaN
        return product(scale, backoff_factor), 0
    successful = tracker + 1
    if successful > INT32_MAX:
        successful -= 2**32  # int32 wrap
    if successful == growth_interval:
        grown = product(scale, growth_factor)
        return (grown if np.isfinite(np.float32(grown)) else scale), 0
    return scale, successful


def dynamic_kind_rule(seq, *, init, gf, bf, gi, lo, hi, hyst):
    """The DynamicScaler docstring's pseudo-code in Python floats.

    With factors 2.0/0.5 and power-of-two scales every product is exact, so
    Python's float64 arithmetic is the float32 rule's oracle here.
    """
    scale, tracker, left = init, 0, hyst
    out = []
    for found in seq:
        left = max(left - 1, 0) if found else hyst
        if found:
            new, tracker = scale * bf, 0
        elif tracker + 1 == gi:
            new, tracker = scale * gf, 0
        else:
            new, tracker = scale, tracker + 1
        if found and left > 0:
            new = scale
        if lo is not None:
            new = max(new, lo)
        if hi is not None:
            new = min(new, hi)
        scale = new
        out.append((scale, tracker, left))
    return out
