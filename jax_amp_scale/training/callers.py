"""Who called a transformation's ``init``: the one place that reads a caller.

Two optax wrappers break `loss_scaled` from outside, without a sign in
their state or their calls:

- `optax.MultiSteps` resets its gradient accumulator as ``(1 - emit) * acc``,
  so one overflowing micro-batch leaves a NaN there for good, and every later
  step is skipped without a word.
- `optax.apply_if_finite` drops a step with non-finite (scaled) gradients
  before `loss_scaled` sees it, so the scale never backs off and the same
  overflow repeats until ``max_consecutive_errors`` runs out.

Only the caller tells them apart: `MultiSteps.init` (a method) and
`apply_if_finite`'s ``init`` (a closure in the module that defines
`optax.apply_if_finite`) call the wrapped transformation's ``init``
themselves, in every optax from 0.2.4 (the oldest supported) to 0.2.8.
tests/test_accumulate_and_guards.py checks both against the installed
optax; CI runs it with the newest optax and with 0.2.4.
"""

from __future__ import annotations

import sys
from types import FrameType

import optax

# The init that asks <- a chain's init <- the wrapper's init: a few frames.
_FRAMES = 4


def _wrapper(frame: FrameType) -> str | None:
    code = frame.f_code
    if code.co_name != "init":
        return None
    if isinstance(frame.f_locals.get("self"), optax.MultiSteps):
        return "optax.MultiSteps"
    if code.co_filename == optax.apply_if_finite.__code__.co_filename:
        return "optax.apply_if_finite"
    return None


def refusing_wrapper() -> str | None:
    """``"optax.MultiSteps"`` or ``"optax.apply_if_finite"`` when one of them
    called (a few frames up) the ``init`` that calls this; None otherwise."""
    frame: FrameType | None = sys._getframe(2)  # the caller of the init that asks
    for _ in range(_FRAMES):
        if frame is None:
            return None
        found = _wrapper(frame)
        if found is not None:
            return found
        frame = frame.f_back
    return None
