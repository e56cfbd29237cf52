"""CANN's published ``aclnnAmpUpdateScale`` kernel, restated in NumPy for tests.

Written from the kernel source, not from this library: hicann/ops-math at
commit c41933244, files

- ``math/amp_update_scale/op_host/amp_update_scale_def.cpp:47-49``: the
  factors are ``Float`` attributes, the interval ``Int``;
- ``math/amp_update_scale/op_host/amp_update_scale_tiling.cpp:63-66``: the
  tiling reads the factors as ``float`` (the API's ``double`` is rounded to
  float32 on the way; round-to-nearest-even assumed), ``:75`` checks the
  interval is in [1, INT32_MAX];
- ``math/amp_update_scale/op_kernel/amp_update_scale.h``: the scale and
  found_inf are widened to float32 (``:120``; bfloat16 through ``Cast``),
  ``:140`` tests ``if (foundInf_)`` (float to bool: nonzero, subnormal and
  NaN are true, -0.0 false), ``:141`` backs off with a float32 product and
  no finiteness test, ``:144`` adds one to the int32 tracker, ``:146-147``
  grows with a float32 product whose finiteness ``IsFinite`` (``:86-93``)
  tests on the float32 exponent bits, and ``:165`` / ``:171`` cast the
  result to the scale's dtype at the store (float16 by ``static_cast``,
  bfloat16 by ``CAST_RINT``), after the test.

NumPy float32 arithmetic is IEEE (round to nearest even, subnormals kept),
which is what the model needs; `cann_kernel` is the kernel as published,
`cann_guarded` the same with growth also refused when the stored value
would be infinite (the library never hands out an infinite scale from
growth, README "Ascend").
"""

from __future__ import annotations

import numpy as np

INT32_MAX = 2**31 - 1


def _wrap_int32(x: int) -> int:
    return (x + 2**31) % 2**32 - 2**31


def _step(scale, tracker: int, found_inf, growth_factor, backoff_factor, growth_interval, guard):
    dtype = np.asarray(scale).dtype
    gf, bf = np.float32(growth_factor), np.float32(backoff_factor)
    s = np.float32(scale)  # exact widening
    f = np.float32(found_inf)
    with np.errstate(all="ignore"):
        if f != 0 or f != f:  # float -> bool: nonzero or NaN
            return np.asarray(s * bf).astype(dtype)[()], 0
        successful = _wrap_int32(tracker + 1)
        if successful != growth_interval:
            return np.asarray(s).astype(dtype)[()], successful
        grown = np.float32(s * gf)
        stored = np.asarray(grown).astype(dtype)[()]
        finite = np.isfinite(grown) and (not guard or np.isfinite(np.float32(stored)))
        return (stored if finite else np.asarray(s).astype(dtype)[()]), 0


def cann_kernel(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """(new_scale, new_tracker) as the published kernel computes them."""
    return _step(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval, False)


def cann_guarded(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """`cann_kernel`, but growth is refused when the stored value is not finite."""
    return _step(scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval, True)
