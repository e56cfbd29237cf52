"""Who called a transformation's ``init``: the one place that reads a caller.

`optax.MultiSteps` resets its gradient accumulator as ``(1 - emit) * acc``,
so one overflowing micro-batch leaves a NaN there for good, and a
`loss_scaled` inside it skips every later step without a word.  Its state
and its calls look like any optimizer's; only the caller tells it apart:
`MultiSteps.init` (a method, from optax 0.2.4, the oldest supported, to
0.2.8) calls the wrapped transformation's ``init`` itself.
tests/test_accumulate_and_guards.py checks it against the installed optax;
CI runs it with the newest optax and with 0.2.4.
"""

from __future__ import annotations

import sys
from types import FrameType

import optax

# init_fn <- MultiSteps.init (direct), or through optax.with_extra_args_support
# and gradient_transformation() wrappers: a few frames at most.
_FRAMES = 4


def inside_multisteps() -> bool:
    """Whether the ``init`` that calls this was called by `optax.MultiSteps.init`."""
    frame: FrameType | None = sys._getframe(2)  # the caller of the init that asks
    for _ in range(_FRAMES):
        if frame is None:
            return False
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name == "init" and isinstance(owner, optax.MultiSteps):
            return True
        frame = frame.f_back
    return False
