"""The host side of `loss_scaled`'s reports: warnings and the runaway error,
each run from inside a jitted step (`jax_amp_scale.operators.host_report`) with NumPy
arrays (every member's value under ``vmap`` or on several devices)."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np

from jax_amp_scale.mechanisms.floats import from_float32_bits

# Skips in a row (finite gradients, non-finite update) after which the
# non-finite-update skip warns, once.
NONFINITE_RUN_WARNING = 10
# Overflowing steps in a row after which a run is called a runaway (one
# warning per run).  From torch's default 2**16, 50 halvings leave a scale
# below 1e-10: no real gradient needs that, so the cause is elsewhere.
RUNAWAY_WARNING = 50

RUNAWAY_CAUSES = (
    "the likely causes: a NaN or inf in the loss, the data or the parameters "
    "(jas.nonfinite_paths(jas.nonfinite_leaves(grads)) names the leaves); "
    "a loss that is not multiplied by this state's scale (jas.scale_loss(loss, opt_state)); "
    "a loss that overflows float16 at any scale (compute it, or its last reduction, in float32)"
)


class OverflowReport:
    """Overflowing steps: the runaway warning, the scale's floor, and the
    ``max_consecutive_overflows`` error (`limit`; `floor` is ``min_scale``;
    only a `dynamic` scale backs off to 0 or a floor)."""

    def __init__(self, *, limit: int | None, floor: float | None, dynamic: bool) -> None:
        self.limit = limit
        self.floor = floor
        self.dynamic = dynamic
        self.floor_said = False  # the floor's warning is said once, not on every step there

    def __call__(self, found: Any, scale_bits: Any, count: Any, previous_bits: Any) -> None:
        if not np.asarray(found).any():
            return
        # The scales' float32 bits (the step's new scale, the one it ran at):
        # a subnormal scale is still > 0 here.
        scale = from_float32_bits(scale_bits)
        count = np.asarray(count)
        if self.limit is not None and (count >= self.limit).any():
            message = (
                f"loss_scaled: {int(count.max())} overflowing steps in a row reached "
                f"max_consecutive_overflows={self.limit} (scale now {float(scale.min()):g}); "
                f"{RUNAWAY_CAUSES}; or raise max_consecutive_overflows"
            )
            # JAX wraps what a report raises into its own runtime error, whose
            # message may be long (a callback's traceback): say it first.
            sys.stderr.write(f"\nFloatingPointError: {message}\n")
            sys.stderr.flush()
            raise FloatingPointError(message)
        if (count == RUNAWAY_WARNING).any():
            warn(
                f"loss_scaled: {RUNAWAY_WARNING} overflowing steps in a row, every one skipped "
                f"(scale now {float(scale.min()):g}); {RUNAWAY_CAUSES}. "
                "max_consecutive_overflows=n in loss_scaled stops the run with an error"
            )
        if not self.dynamic:
            return
        if (scale == 0).any():
            # A zero scale stays 0 and every later step overflows too: said on
            # the step it becomes 0 (for each member of a population), not on
            # each later one, whose new count would get past Python's filter.
            if not ((scale == 0) & (from_float32_bits(previous_bits) != 0)).any():
                return
            warn(
                f"loss_scaled: the scale is 0 after {int(count.max())} overflowing steps in a "
                "row and cannot grow back: a zero scale makes every gradient 0, which "
                "unscales to NaN, so every later step overflows too; set min_scale= in "
                "dynamic_scaler() or max_consecutive_overflows= in loss_scaled to stop earlier"
            )
        elif self.floor is not None and not self.floor_said and (scale <= self.floor).any():
            self.floor_said = True
            warn(
                f"loss_scaled: the scale reached its floor min_scale={self.floor:g} and the "
                "step still overflowed; the gradients may be non-finite whatever the scale"
            )


class NonfiniteUpdateReport:
    """Finite gradients, non-finite update: one warning after a run of skips
    (called with each such step's number; a run is consecutive numbers)."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.run = 0
        self.warned = False

    def __call__(self, bad: Any, step: Any) -> None:
        if self.warned or not np.asarray(bad).any():
            return
        n = int(np.asarray(step).max())
        if n == self.last:  # the same step reported by another device
            return
        self.run = self.run + 1 if self.last is not None and n == self.last + 1 else 1
        self.last = n
        if self.run >= NONFINITE_RUN_WARNING:
            self.warned = True
            warn(
                f"loss_scaled: {self.run} optimizer steps in a row were skipped because the "
                "update (or the new parameters) held inf/NaN although the gradients were "
                "finite. The likely cause is 16-bit parameters with an optimizer epsilon "
                "that is 0 in float16 (optax.adam's eps=1e-8): a moment that underflows "
                "divides by zero. Keep float32 master weights (get_policy('O2')) or use "
                "eps >= 1e-4 in float16 (optax.adam(lr, eps=1e-4))."
            )


def warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)
