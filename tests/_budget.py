"""Example budgets for property tests.

The sanitizer job of .ci/run re-runs the native tests with every allocation
of the process going through ASan's allocator, which makes XLA compiles
several times slower; it sets JAS_EXAMPLES_DIVISOR to keep the same tests at
a fraction of the examples.
"""

import os

import pytest


def examples(n: int) -> int:
    return max(3, n // int(os.environ.get("JAS_EXAMPLES_DIVISOR", "1")))


def tiered(values: list, keep: list) -> list:
    """Values for ``pytest.mark.parametrize``: those in `keep` run in the
    default tier, the others carry the ``slow`` and ``trimmed`` markers, so
    that README's test command keeps a few cases of a long grid (CI runs the
    rest in the slow tier, and selects ``trimmed`` where it runs a fixed set
    of files: the oldest jax, the sanitizers)."""
    missing = [k for k in keep if k not in values]
    assert not missing, f"tiered: {missing} are not among the values"
    marks = (pytest.mark.slow, pytest.mark.trimmed)
    return [
        v if v in keep else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=marks)
        for v in values
    ]
