"""The gradient pass operator: unscale floating leaves and report inf/NaN.

Takes the float32 inverse scale and the floating leaves already picked out
of a gradient tree (the training layer does that), and runs the plan
`dispatch` gives: the pure-JAX pass, or the fused native pass.
"""

from __future__ import annotations

import jax

from jax_amp_scale.lowering.gradient_pass import unscale_and_check_native
from jax_amp_scale.ops import dispatch
from jax_amp_scale.reference.gradient_pass import reference_pass


def unscale_and_check_leaves(
    inv: jax.Array, leaves: list[jax.Array], backend: str
) -> tuple[jax.Array, list[jax.Array]]:
    """``(found_inf, unscaled)`` for nonempty floating `leaves`; `backend` checked."""
    plan = dispatch.plan(dispatch.UNSCALE_AND_CHECK, backend, leaves)
    if plan.mode == "reference":
        return reference_pass(inv, leaves)
    return unscale_and_check_native(
        inv,
        leaves,
        target=plan.target,
        native_on=plan.platforms,
        reference=reference_pass,
        strict=plan.mode == "strict",
        cann_platforms=plan.cann_platforms,
    )
