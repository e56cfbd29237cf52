"""The one place the check is not torch's: at a scale below 1.

torch's ``_amp_foreach_non_finite_check_and_unscale_`` tests each *scaled*
input and then multiplies; the library tests the *unscaled* output.  They
differ only where a finite gradient overflows once unscaled, which needs an
inverse scale above 1 (a scale below 1).  torch then steps with an inf
gradient and ``found_inf == 0``; the library skips the step and backs off.
docs/operator.md says why that is kept; these tests pin both sides, torch's
with torch itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale.optax import loss_scaled

torch = pytest.importorskip("torch")

# 40000 is finite in float16; unscaled by 1/0.5 it is 80000, above 65504.
GRAD, SCALE = 40000.0, 0.5


def test_torch_checks_the_scaled_input_and_steps_with_inf():
    t = torch.tensor([GRAD], dtype=torch.float16)
    found = torch.zeros(1)
    torch._amp_foreach_non_finite_check_and_unscale_([t], found, torch.tensor([1.0 / SCALE]))
    assert found.item() == 0.0
    assert torch.isinf(t).all()


@pytest.mark.parametrize("backend", ["reference", "ffi"])
def test_the_library_checks_the_unscaled_output_and_flags_it(backend):
    grads = {"w": jnp.full((4,), GRAD, jnp.float16)}
    out, found = jas.unscale_and_check(grads, jas.init_scale_state(SCALE), backend=backend)
    assert bool(found)
    assert np.isinf(np.asarray(out["w"], np.float32)).all()


def test_loss_scaled_skips_that_step_and_backs_off():
    params = {"w": jnp.ones((4,), jnp.float32)}
    tx = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(SCALE))
    state = tx.init(params)
    # A float16 gradient leaf, as a float16 model returns it.
    grads = {"w": jnp.full((4,), GRAD, jnp.float16)}
    updates, state = jax.jit(tx.update)(grads, state, params)
    assert not np.asarray(updates["w"]).any()  # skipped: zero updates
    assert float(state.scale) == SCALE / 2
    assert int(state.skipped_steps) == 1


def test_no_difference_at_scales_of_1_and_above():
    # With an inverse scale <= 1 a finite input stays finite: the two checks agree.
    grads = {"w": jnp.asarray([65504.0, -65504.0, 1.0], jnp.float16)}
    for scale in (1.0, 2.0, 65536.0):
        t = torch.tensor(np.asarray(grads["w"], np.float32), dtype=torch.float16)
        found = torch.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_([t], found, torch.tensor([1.0 / scale]))
        _, ours = jas.unscale_and_check(grads, jas.init_scale_state(scale))
        assert bool(ours) == bool(found.item())
