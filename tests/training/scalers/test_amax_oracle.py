"""amax_scaler against the brute force of tests/_amax_oracle.py: random
configurations and random (found_inf, amax) sequences, every step's scale
and reason compared."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jax_amp_scale as jas
from tests import _amax_oracle as oracle
from tests._budget import examples

# A few configurations (each compiles the step once); the initial scale,
# which is a leaf, is drawn freely within each one's bounds.
CONFIGS = [
    oracle.Config(),
    oracle.Config(
        margin=0,
        micro_batches=3,
        growth_interval=1,
        min_scale=2.0,
        max_scale=2.0**30,
        init_scale=2.0,
    ),
    oracle.Config(
        margin=24, micro_batches=8, min_scale=2.0**-126, max_scale=2.0**6, growth_interval=3
    ),
    oracle.Config(
        margin=2,
        compute_dtype="bfloat16",
        min_scale=4.0,
        max_scale=2.0**127,
        growth_interval=5,
        init_scale=4.0,
    ),
]


def build(config: oracle.Config) -> jas.AmaxScaler:
    return jas.amax_scaler(config.margin, **config.kwargs())


STEPS = 40  # every run is padded to this many steps: one compile per configuration


@functools.cache
def _scan():
    """Steps a scaler through (found, amax, measured) arrays in one call;
    ``measured`` False calls ``update(found)`` without an amax."""

    def step(k, x):
        found, a, measured = x
        k = jax.lax.cond(measured, lambda k: k.update(found, amax=a), lambda k: k.update(found), k)
        return k, (k.scale, k.reason, k.ceiling, k.finite_steps)

    return jax.jit(lambda k, xs: jax.lax.scan(step, k, xs)[1])


def drive(config: oracle.Config, steps: list[tuple[bool, float | None]]):
    """The real scaler's scale, reason, ceiling and finite_steps after each step."""
    pad = [(False, 0.0)] * (STEPS - len(steps))  # later steps change no earlier one
    found = np.array([f for f, _ in steps + pad])
    amax = np.array([0.0 if a is None else a for _, a in steps + pad], np.float32)
    measured = np.array([a is not None for _, a in steps + pad])
    out = jax.device_get(_scan()(build(config), (found, amax, measured)))
    return [[x.item() for x in column[: len(steps)]] for column in out]


def float32(x: float) -> float:
    """x rounded to float32, saturating at its largest finite (an amax is finite)."""
    with np.errstate(over="ignore"):
        y = np.float32(x)
    return float(np.finfo(np.float32).max if np.isinf(y) else y)


def neighbour(x: float, direction: int) -> float:
    """The float32 next to x, toward +inf (direction 1) or 0 (-1)."""
    with np.errstate(over="ignore"):
        return float32(np.nextafter(np.float32(x), np.float32(direction * np.inf)))


def amaxes(config: oracle.Config):
    """Amaxes in scaled units: 0, the target and the float32 below it, the
    target times a power of two (the boundary a * 2**k == T) and its float32
    neighbours, anything, and None (nothing measured)."""
    t = float(config.target)
    on_the_line = st.integers(-60, 60).map(lambda j: float32(t * 2.0**j))
    beside = st.tuples(on_the_line, st.sampled_from([-1, 1])).map(lambda p: neighbour(*p))
    anything = st.floats(0.0, float(np.finfo(np.float32).max), width=32)
    at_target = st.sampled_from([t, neighbour(t, -1)])  # a >= T: the explained overflow
    return st.one_of(st.just(0.0), at_target, on_the_line, beside, anything, st.none())


@st.composite
def runs(draw):
    base = draw(st.sampled_from(CONFIGS))
    lo, hi = (int(np.log2(x)) for x in (base.min_scale, base.max_scale))
    init = 2.0 ** draw(st.integers(lo, hi))
    config = dataclasses.replace(base, init_scale=init)
    # Overflows in bursts as well as alone, finite runs long enough to raise
    # the ceiling.
    step = st.tuples(st.booleans(), amaxes(config))
    burst = st.tuples(st.integers(1, 20), amaxes(config)).map(lambda p: [(True, p[1])] * p[0])
    parts = draw(st.lists(st.one_of(step.map(lambda s: [s]), burst), min_size=1, max_size=12))
    return config, [s for part in parts for s in part][:STEPS]


@settings(max_examples=examples(40), deadline=None)
@given(run=runs())
def test_every_step_matches_the_brute_force(run):
    config, steps = run
    scales, reasons, ceilings, finite_steps = drive(config, steps)
    brute = oracle.Oracle(config)
    for i, (found, a) in enumerate(steps):
        want = brute.step(found, a)
        assert (scales[i], reasons[i]) == want, (i, steps[: i + 1], config)
        assert (ceilings[i], finite_steps[i]) == (brute.ceiling, brute.finite_steps), i


def test_the_brute_force_on_worked_examples():
    # The oracle pinned by hand, so that it cannot drift with the code: the
    # probe start, the x2 bound, the ceiling (its fall and its growth), the
    # back-off, the two clips.
    at_1024 = oracle.Config(margin=4, init_scale=2.0**10)  # T = 4094, the ceiling 2**10
    # At the probe 1, a = 4 asks 2**9; then 1 / 512 asks 2**21: x2 only.
    assert oracle.scales(at_1024, [(False, 4.0), (False, 1.0)]) == [2.0**9, 2.0**10]
    # A tiny amax asks 2**22 at once, but the ceiling (2**10) holds the scale.
    assert oracle.scales(at_1024, [(False, 2.0**-12)]) == [2.0**10]
    assert oracle.scales(oracle.Config(init_scale=2.0**-3), [(False, 0.0)]) == [2.0**-3]
    # T = 2047; at the probe 1 the finite amax 4094 fits 2**-1, halved 2**-2.
    assert oracle.scales(oracle.Config(), [(True, 4094.0)]) == [0.25]
    # An overflow the amax did not see at 2**6: halved, and 2**5 is the ceiling
    # until growth_interval (3) finite steps in a row raise it to 2**6.
    brute = oracle.Oracle(oracle.Config(growth_interval=3))
    assert brute.step(False, 2.0**-20) == (2.0**16, oracle.FINITE)
    brute.scale = 2.0**6
    assert brute.step(True, 1.0) == (2.0**5, oracle.UNSEEN) and brute.ceiling == 2.0**5
    got = [brute.step(False, 1.0)[0] for _ in range(4)]
    assert got == [2.0**5, 2.0**5, 2.0**6, 2.0**6] and brute.ceiling == 2.0**6
    assert brute.step(True, 2047.0) == (2.0**5, oracle.OVERFLOW)  # a == T: seen
    big = oracle.Config(init_scale=2.0**24)
    assert oracle.scales(big, [(False, 0.0)]) == [2.0**24]  # clipped at the ceiling
    assert oracle.scales(oracle.Config(), [(False, 3.0e38)]) == [2.0**-24]  # at min_scale


@pytest.mark.parametrize(
    "config",
    [*CONFIGS, oracle.Config(compute_dtype="float32", micro_batches=5)],
    ids=lambda c: f"{c.compute_dtype}-m{c.margin}-k{c.micro_batches}",
)
def test_targets_agree(config):
    assert build(config).target == config.target
