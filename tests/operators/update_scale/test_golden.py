"""Golden cases from the spec's rule: each branch and edge case, each dtype, each backend.

Expected values are written by hand from ../shared/spec/update-scale.md
(section "Semantics"), not computed by any code.  The cases are grouped into
tables by their static attributes; each table runs as one jitted, vmapped
call per backend (one compile per table, not per case), and results are
compared by their bits, so a NaN scale must come back as the same NaN.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_amp_scale as jas

BACKENDS = ["reference", "ffi", "auto"]
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
F16_MAX = 65504.0
BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).smallest_subnormal)
INF, NAN = float("inf"), float("nan")


class Case(NamedTuple):
    what: str
    scale: float
    tracker: int
    found: bool
    want_scale: float
    want_tracker: int


class Table(NamedTuple):
    dtype: type
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    cases: tuple[Case, ...]


def _common(top: float) -> tuple[Case, ...]:
    # The same branches in every dtype (growth_interval 2000, factors 2 / 0.5).
    return (
        Case("found backs off, resets", 1024.0, 5, True, 512.0, 0),
        Case("found wins over growth", 1024.0, 1999, True, 512.0, 0),
        Case("finite step counts", 1024.0, 7, False, 1024.0, 8),
        Case("growth at interval", 1024.0, 1999, False, 2048.0, 0),
        Case("growth overflow keeps scale, resets", top, 1999, False, top, 0),
        Case("growth to -inf is refused too", -top, 1999, False, -top, 0),
        Case("past the interval keeps counting", 8.0, 5000, False, 8.0, 5001),
        Case("tracker wraps in int32", 8.0, INT32_MAX, False, 8.0, INT32_MIN),
        Case("inf: growth refused", INF, 1999, False, INF, 0),
        Case("inf * backoff is inf", INF, 0, True, INF, 0),
        Case("nan: growth refused, same nan", NAN, 1999, False, NAN, 0),
        Case("nan counts on", NAN, 3, False, NAN, 4),
        Case("nan * backoff is the same quiet nan", NAN, 3, True, NAN, 0),
        Case("-inf backs off to -inf", -INF, 3, True, -INF, 0),
        Case("negative scale backs off", -8.0, 3, True, -4.0, 0),
        Case("zero scale grows to zero", 0.0, 1999, False, 0.0, 0),
        Case("negative tracker counts up", 8.0, -5, False, 8.0, -4),
    )


TABLES = {
    "float32": Table(
        np.float32,
        2.0,
        0.5,
        2000,
        (
            *_common(F32_MAX),
            Case("backoff underflows to zero (no floor)", F32_TINY, 0, True, 0.0, 0),
            Case("subnormal grows exactly", F32_TINY, 1999, False, 2 * F32_TINY, 0),
        ),
    ),
    "float16": Table(
        np.float16,
        2.0,
        0.5,
        2000,
        (
            *_common(F16_MAX),
            # 40000 * 2 = 80000 overflows float16 though it fits float32.
            Case("growth past float16 max refused", 40000.0, 1999, False, 40000.0, 0),
            Case("32768 grown is refused", 32768.0, 1999, False, 32768.0, 0),
        ),
    ),
    "bfloat16": Table(ml_dtypes.bfloat16, 2.0, 0.5, 2000, _common(BF16_MAX)),
    "interval 1": Table(
        np.float32,
        2.0,
        0.5,
        1,
        (
            Case("grows every finite step", 4.0, 0, False, 8.0, 0),
            Case("negative tracker never equals 1", 8.0, -5, False, 8.0, -4),
        ),
    ),
    "interval int32 max": Table(
        np.float32,
        2.0,
        0.5,
        INT32_MAX,
        (Case("reachable: INT32_MAX - 1 grows", 8.0, INT32_MAX - 1, False, 16.0, 0),),
    ),
    # 1.0078125 (1 + 2**-7) * 1.5 = 1.51171875, halfway between 1.5078125
    # (1 + 65/128) and 1.515625 (1 + 66/128): rounds to the even 1.515625.
    "bfloat16 rounding": Table(
        ml_dtypes.bfloat16,
        1.5,
        0.5,
        1,
        (Case("product rounds to even", 1.0078125, 0, False, 1.515625, 0),),
    ),
}


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).view(f"uint{8 * np.asarray(x).dtype.itemsize}")


def _run(table: Table, backend: str, shape: tuple[int, ...]):
    n = len(table.cases)
    scale = np.array([c.scale for c in table.cases], dtype=table.dtype).reshape(n, *shape)
    tracker = np.array([c.tracker for c in table.cases], np.int32).reshape(n, *shape)
    found = np.array([c.found for c in table.cases]).reshape(n, *shape)

    @jax.jit
    @jax.vmap
    def step(s, t, f):
        return jas.amp_update_scale(
            s,
            t,
            f,
            growth_factor=table.growth_factor,
            backoff_factor=table.backoff_factor,
            growth_interval=table.growth_interval,
            backend=backend,
        )

    out_s, out_t = step(scale, tracker, found)
    assert out_s.shape == scale.shape and out_s.dtype == scale.dtype
    assert out_t.shape == scale.shape and out_t.dtype == jnp.int32
    return np.asarray(out_s).reshape(n), np.asarray(out_t).reshape(n)


@pytest.mark.parametrize("shape", [(), (1,)], ids=["shape()", "shape(1,)"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(TABLES))
def test_golden_table(name, backend, shape):
    table = TABLES[name]
    out_s, out_t = _run(table, backend, shape)
    want_s = np.array([c.want_scale for c in table.cases], dtype=table.dtype)
    want_t = np.array([c.want_tracker for c in table.cases], np.int32)
    wrong = [
        (c.what, float(s), int(t))
        for c, s, t, ok_s, ok_t in zip(
            table.cases, out_s, out_t, _bits(out_s) == _bits(want_s), out_t == want_t, strict=True
        )
        if not (ok_s and ok_t)
    ]
    assert not wrong, wrong


def test_sequence_of_steps_matches_spec_trace():
    # A hand-computed trajectory: interval 3, factors 2 / 0.5.
    found = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1]
    expect_scale = [8, 8, 16, 8, 8, 8, 16, 16, 8, 4]
    expect_tracker = [1, 2, 0, 0, 1, 2, 0, 1, 0, 0]
    for backend in BACKENDS:
        st = jas.init_scale_state(8.0, growth_interval=3)
        for f, es, et in zip(found, expect_scale, expect_tracker, strict=True):
            st = jas.update_scale(st, f, backend=backend)
            assert float(st.scale) == es and int(st.growth_tracker) == et


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("dtype", "signaling", "quiet_bit"),
    [(np.float32, 0x7F800001, 0x00400000), (np.float16, 0x7C01, 0x0200)],
    ids=["float32", "float16"],
)
def test_signaling_nan_scale(backend, dtype, signaling, quiet_bit):
    # Growth of a NaN is refused: the scale keeps its exact bits (a product
    # would quiet it).  Backoff multiplies: the NaN comes back quieted.
    uint = np.uint32 if dtype == np.float32 else np.uint16
    scale = np.array([signaling, signaling], uint).view(dtype)

    @jax.jit
    @jax.vmap
    def step(s, t, f):
        return jas.amp_update_scale(
            s, t, f, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, backend=backend
        )

    out, _ = step(scale, np.array([1999, 0], np.int32), np.array([False, True]))
    assert _bits(np.asarray(out)).tolist() == [signaling, signaling | quiet_bit]
