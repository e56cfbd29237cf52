"""bench/_harness.py's measurement order and paired ratios (no optional package needed)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _harness


def test_harness_ratios_are_paired():
    ticks = iter(range(1000))
    seen: list[str] = []

    def cand(name):
        def run():
            seen.append(name)
            next(ticks)

        return run

    rows = _harness.measure(
        {"a": cand("a"), "b": cand("b"), "c": cand("c")}, baseline="a", reps=4, warmup=1
    )
    # warm-up once each in order, then the order rotates every repetition
    assert seen[:3] == ["a", "b", "c"]
    assert seen[3:6] == ["a", "b", "c"] and seen[6:9] == ["b", "c", "a"]
    assert seen[9:12] == ["c", "a", "b"]
    for r in rows:
        assert len(r.times) == 4
        assert r.ratios == [x / y for x, y in zip(r.times, rows[0].times, strict=True)]
    with pytest.raises(ValueError, match="baseline"):
        _harness.measure({"a": cand("a")}, baseline="z", reps=1)
    with pytest.raises(ValueError, match="reps"):
        _harness.measure({"a": cand("a")}, baseline=None, reps=0)
