"""A check by value for saturation mode, where the hardware's flag cannot be
read (operators/float_status.py reads it where it can): a heuristic, opt in,
with known misses (docs/ascend.md).  On an Ascend device in saturation mode a
float16 overflow stores +-65504 and NaN stores 0 (hiascend Pytorch/600
Envvariables Envir_004), so the gradients hold no inf/NaN.  A function of the
gradients, not an option of the checks, so it composes with any of them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

# float16's largest finite value: where a saturated overflow lands.
FLOAT16_MAX = 65504.0


def saturated_as_overflow(tree: Any) -> Any:
    """Every float16 entry of `tree` at +-65504 becomes +-inf; the rest is
    returned as it is.

    Call it on the gradients of the scaled loss, before `update` (or
    `unscale_and_check`), on a device that saturates and whose overflow flag
    cannot be read.  What it cannot see: a NaN that saturation turned into 0;
    an overflow in an intermediate value that later operations scaled down
    or normalised (only one that lands in a final gradient entry shows);
    anything in float32 or bfloat16 leaves.  A gradient that is genuinely
    65504 counts as an overflow (a false positive, and a halved scale).

    Args:
      tree: any pytree; non-float16 leaves pass unchanged.
    """

    def one(x: Any) -> Any:
        if getattr(x, "dtype", None) != jnp.float16:
            return x
        return jnp.where(jnp.abs(x) == FLOAT16_MAX, x * jnp.float16(jnp.inf), x)

    return jax.tree_util.tree_map(one, tree)
