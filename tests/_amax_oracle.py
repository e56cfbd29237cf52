"""An independent brute force for `amax_scaler`'s rule, for tests.

Written from the rule in `amax_scaler`'s docstring in plain Python, sharing
nothing with the library (no JAX, no frexp, none of its helpers).  For each
step it tries every power of two ``2**e`` between ``min_scale`` and
``max_scale`` as the next scale ``S`` and keeps the largest
that holds the step's amax under the target: the amax ``a`` is in scaled
units, measured at the scale ``s`` the step ran at, so the unscaled amax is
``a / s`` and ``S`` must satisfy ``(a / s) * S <= T``.  Then the documented
limits: the first step at the probe scale 1, growth at most x2 per step
after the first finite step and never past the ceiling, the ceiling's own
moves (the overflowed scale halved; doubled after growth_interval finite
steps in a row), the back-off on a non-finite step, and the clips to
``[min_scale, max_scale]``.

Python floats are exact here: every value is a float32 (the amax), a power
of two or the target (a float16/bfloat16/float32 largest finite over a power
of two), and their quotients and products by powers of two stay well inside
float64's exponent range; the targets are checked against exact rationals.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

# The largest finite value of each compute dtype, (2 - 2**-mantissa_bits) * 2**emax.
LARGEST = {
    "float16": (2 - Fraction(1, 2**10)) * 2**15,  # 65504
    "bfloat16": (2 - Fraction(1, 2**7)) * 2**127,
    "float32": (2 - Fraction(1, 2**23)) * 2**127,
}

FINITE, OVERFLOW, UNSEEN = 0, 1, 2  # the scaler's reason codes


def _exponent_of(power: float) -> int:
    """e with 2**e == power, found by trying every float32 normal exponent."""
    for e in range(-126, 128):
        if 2.0**e == power:
            return e
    raise ValueError(f"{power} is not a power of two in [2**-126, 2**127]")


def _ceil_log2(n: int) -> int:
    """The smallest c with 2**c >= n, by counting."""
    c = 0
    while 2**c < n:
        c += 1
    return c


@dataclasses.dataclass(frozen=True)
class Config:
    """`amax_scaler`'s arguments (its defaults)."""

    margin: int = 5
    micro_batches: int = 1
    min_scale: float = 2.0**-24
    max_scale: float = 2.0**24
    growth_interval: int = 2000
    compute_dtype: str = "float16"
    init_scale: float | None = None  # the ceiling's start; None: 2**16 clipped into the bounds

    @property
    def target(self) -> float:
        """T = F / 2**(margin + ceil(log2(micro_batches)))."""
        exact = LARGEST[self.compute_dtype] / 2 ** (self.margin + _ceil_log2(self.micro_batches))
        assert Fraction(float(exact)) == exact  # a float holds it
        return float(exact)

    def kwargs(self) -> dict:
        """The arguments as `amax_scaler` takes them (margin first, positionally)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "margin"}


class Oracle:
    """The scale sequence of one run: `step` per optimizer step."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.target = config.target
        self.lo, self.hi = config.min_scale, config.max_scale
        lo_e, hi_e = _exponent_of(self.lo), _exponent_of(self.hi)
        self.candidates = [2.0**e for e in range(hi_e, lo_e - 1, -1)]  # the largest first
        ceiling = config.init_scale
        if ceiling is None:
            ceiling = min(max(2.0**16, self.lo), self.hi)
        self.ceiling = ceiling
        self.scale = min(max(1.0, self.lo), ceiling)  # the probe, under the ceiling
        self.tracker = 0  # finite steps in a row since the ceiling last moved
        self.finite_steps = 0

    def best(self, a: float) -> float | None:
        """The largest candidate S with (a / s) * S <= T; None when none does."""
        unscaled = a / self.scale
        for S in self.candidates:  # from the largest: the first that fits
            if unscaled * S <= self.target:
                return S
        return None

    def clip(self, x: float) -> float:
        return min(max(x, self.lo), self.hi)

    def step(self, found: bool, amax: float | None) -> tuple[float, int]:
        """(the next scale, the reason) after a step that ran at `self.scale`.

        `amax` is the step's amax in scaled units (a float32 value); None:
        nothing measured (a finite step keeps the scale; a non-finite one
        reads it as 0).
        """
        s = self.scale
        a = 0.0 if amax is None else float(amax)
        # The largest power of two that fits; below min_scale when none does.
        fitting = self.best(a)
        fitting = self.lo / 2 if fitting is None else fitting
        if not found:
            reason = FINITE
            self.tracker += 1
            if self.tracker == self.config.growth_interval:
                self.ceiling, self.tracker = self.clip(2 * self.ceiling), 0
            nxt = s if amax is None else fitting
            if amax is not None and self.finite_steps > 0:
                nxt = min(nxt, 2 * s)  # at most x2 after the first finite step
            nxt = min(nxt, self.ceiling)
            self.finite_steps += 1
        else:
            reason = OVERFLOW if a >= self.target else UNSEEN
            # s * 2**(min(k(a), 0) - 1): half the lower of s and what fits.
            nxt = min(fitting, s) / 2
            self.ceiling = self.clip(min(self.ceiling, s / 2))
            self.tracker = 0
        self.scale = self.clip(nxt)
        return self.scale, reason


def scales(config: Config, steps: list[tuple[bool, float | None]]) -> list[float]:
    """The scale after each (found_inf, amax) step."""
    oracle = Oracle(config)
    return [oracle.step(found, a)[0] for found, a in steps]
