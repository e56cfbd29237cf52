"""The first-contact defects found by trying the library as a new user
would; each test here failed before its fix."""

from __future__ import annotations

import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale.optax import loss_scaled, optimizer_step


@pytest.mark.parametrize("loss", [1.0, 3, [1.0, jnp.float32(2.0)]])
def test_scale_loss_refuses_a_python_number(loss):
    # torch's GradScaler.scale(1.0) raises; this returned 1.0, unscaled.
    with pytest.raises(TypeError, match=r"must be a JAX array.*jas\.scale_loss"):
        jas.scale_loss(loss, jas.init_scale_state())


def test_scale_loss_names_any_pytree_with_one_scale_state():
    params = {"w": jnp.ones(2)}
    with pytest.raises(TypeError, match=r"any pytree holding exactly one ScaleState.*holding 0"):
        jas.scale_loss(jnp.float32(1.0), optax.adam(1e-3).init(params))
    # ... and such a pytree works: a chain's state with one loss_scaled.
    state = optax.chain(optax.clip(1.0), loss_scaled(optax.sgd(0.1))).init(params)
    assert float(jas.scale_loss(jnp.float32(2.0), state)) == 2.0 * 2.0**16


def _overflow_until_warned(steps: int) -> tuple[int | None, float]:
    params = {"w": jnp.ones(3)}
    tx = loss_scaled(optax.sgd(1e-3))
    state = tx.init(params)
    step = jax.jit(tx.update)
    inf = {"w": jnp.full((3,), jnp.inf)}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for i in range(1, steps + 1):
            _, state = step(inf, state, params)
            jax.block_until_ready(state)
            if any("the scale is 0" in str(w.message) for w in seen):
                return i, float(state.scale)
    return None, float(state.scale)


def test_the_zero_scale_warning_waits_for_a_zero_scale():
    # From 2**16, 143 halvings give 2**-127, a float32 subnormal that XLA
    # flushes in a comparison; the warning fired there.  The scale, ours and
    # torch's alike, is 0 after 166 (2**-149 halved); only then it cannot grow back.
    step, scale = _overflow_until_warned(170)
    assert step == 166
    assert scale == 0.0


def test_troubleshooting_gives_the_exact_count():
    page = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text()
    assert "exactly 166 halvings" in page and "about 150" not in page


def test_no_zero_scale_warning_at_a_subnormal_scale():
    step, scale = _overflow_until_warned(150)
    assert step is None
    assert scale == 2.0**16 * 2.0**-150 and scale > 0  # 2**-134, subnormal


def test_optimizer_step_reads_a_subnormal_flag_as_an_overflow():
    # found_inf is read by its bits everywhere: astype(bool) under jit read a
    # subnormal flag as False (denormals-are-zero) and applied the step.
    params = {"w": jnp.ones(2)}
    tx = optax.sgd(1.0)
    opt_state = tx.init(params)
    run = jax.jit(lambda g, s, p, f: optimizer_step(tx, g, s, p, f))
    tiny = jnp.asarray(np.float32(1e-45))
    new_params, _ = run(params, opt_state, params, tiny)
    np.testing.assert_array_equal(np.asarray(new_params["w"]), [1.0, 1.0])  # skipped
    new_params, _ = run(params, opt_state, params, jnp.float32(0.0))
    np.testing.assert_array_equal(np.asarray(new_params["w"]), [0.0, 0.0])  # applied
