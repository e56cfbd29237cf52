"""Example budgets for property tests.

The sanitizer job of .ci/run re-runs the native tests with every allocation
of the process going through ASan's allocator, which makes XLA compiles
several times slower; it sets JAS_EXAMPLES_DIVISOR to keep the same tests at
a fraction of the examples.
"""

import os


def examples(n: int) -> int:
    return max(3, n // int(os.environ.get("JAS_EXAMPLES_DIVISOR", "1")))
