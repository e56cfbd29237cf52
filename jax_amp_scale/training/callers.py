"""Who called a transformation's ``init``: the one place that reads a caller.

`optax.MultiSteps` and `optax.apply_if_finite` around `loss_scaled` break it
(`WRAPPER_ERRORS` in training/optax.py says why) without a sign in their state;
only the caller tells them apart: their ``init`` calls the wrapped one, in
every optax from 0.2.4 (the oldest supported) to 0.2.8
(tests/test_accumulate_and_guards.py checks both against the installed optax).
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
