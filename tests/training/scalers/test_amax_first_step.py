"""amax_scaler's first step: at the probe scale 1, never lost to the scale.

The first step runs at 1, where no gradient that is finite unscaled can
overflow, whatever `init_scale` says; `init_scale` (GradScaler's 2**16 by
default) is the ceiling the first finite step's jump stops at.  torch's
GradScaler (the real one, below) instead skips once per halving from its
first scale down to one that fits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale.optax import get_loss_scaled_state, loss_scaled

torch = pytest.importorskip("torch")

TARGET = 65504.0 / 2**5  # the default margin's line


def test_the_default_ceiling_is_torchs_first_scale():
    k = jas.amax_scaler()
    assert float(k.ceiling) == torch.amp.GradScaler("cpu").get_scale() == 2.0**16
    assert float(k.scale) == 1.0  # the probe


@pytest.mark.parametrize(
    ("bounds", "probe", "ceiling"),
    [
        ({"max_scale": 64.0}, 1.0, 64.0),
        ({"min_scale": 2.0**20}, 2.0**20, 2.0**20),
        ({"max_scale": 2.0**16}, 1.0, 2.0**16),
        ({"init_scale": 2.0**-3}, 2.0**-3, 2.0**-3),
    ],
)
def test_the_start_is_clipped_into_the_bounds_given(bounds, probe, ceiling):
    # Bounds that leave 2**16 out move the default ceiling (an explicit
    # init_scale outside them is an error: test_amax_scaler.py), and the
    # probe stays within [min_scale, ceiling].
    k = jas.amax_scaler(**bounds)
    assert (float(k.scale), float(k.ceiling)) == (probe, ceiling)


def _float16_model():
    x = jax.random.normal(jax.random.key(0), (64, 16))
    y = jnp.sin(x).sum(axis=1, keepdims=True) * 1e-3  # small gradients, as late in training
    params = {
        "w": jax.random.normal(jax.random.key(1), (16, 32)) * 0.3,
        "v": jax.random.normal(jax.random.key(2), (32, 1)) * 1e-3,
    }

    def loss_fn(p):
        p16, x16 = jax.tree.map(lambda a: a.astype(jnp.float16), (p, x))
        return jnp.mean((jnp.tanh(x16 @ p16["w"]) @ p16["v"] - y) ** 2).astype(jnp.float32)

    return params, loss_fn


def _first_step(scaler):
    params, loss_fn = _float16_model()
    tx = loss_scaled(optax.sgd(0.1), scaler)
    state = tx.init(params)
    grads = jax.grad(lambda p: jas.scale_loss(loss_fn(p), state))(params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    return grads, updates, get_loss_scaled_state(state)


@pytest.mark.parametrize("init_scale", [2.0**16, 2.0**24])
def test_the_first_step_runs_at_the_probe_and_jumps_to_the_rule(init_scale):
    grads, updates, state = _first_step(jas.amax_scaler(init_scale=init_scale))
    params, loss_fn = _float16_model()
    plain = jax.grad(loss_fn)(params)  # at scale 1: the float16 gradients themselves
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(plain), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(updates["w"], -0.1 * plain["w"])
    assert int(state.skipped_steps) == 0
    # The next scale is the rule's at once: the largest power of two that
    # keeps this step's amax under the line, up to the ceiling.
    g = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(grads))
    e = 0
    while g * 2.0 ** (e + 1) <= TARGET:
        e += 1
    assert float(state.scale) == min(2.0**e, init_scale) > 1


def _ours_until_finite(g, init_scale, steps=20):
    """Skipped steps of amax_scaler() on gradients `g` (unscaled) that pass
    through float16 at the scale, until a step applies; and the scale after it."""
    tx = loss_scaled(optax.sgd(0.1), jas.amax_scaler(init_scale=init_scale))
    params = {"w": jnp.zeros(g.shape)}
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(steps):
        scale = np.float32(get_loss_scaled_state(state).scale)
        scaled = {"w": jnp.asarray((g * scale).astype(np.float16).astype(np.float32))}
        _, state = update(scaled, state, params)
        if int(state.skipped_steps) < int(state.total_steps):
            return int(state.skipped_steps), float(get_loss_scaled_state(state).scale)
    raise AssertionError("never finite")


def _torch_until_finite(g, steps=20):
    """Skipped steps of torch's GradScaler (CPU, defaults) on the same gradients:
    a float32 parameter used in float16, as under autocast."""
    p = torch.nn.Parameter(torch.zeros(g.shape))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for skipped in range(steps):
        opt.zero_grad()
        loss = (p.half() * torch.tensor(g).half()).float().sum()  # d loss / d p = g, via float16
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() >= before:
            return skipped
    raise AssertionError("never finite")


@pytest.mark.parametrize("init_scale", [2.0**16, 2.0**24])
@pytest.mark.parametrize("largest", [2.0, 8.0, 100.0])
def test_no_first_step_is_lost_to_the_scale(largest, init_scale):
    g = np.array([largest, 1e-3, -0.5], np.float32)  # finite unscaled; inf at 2**16 in float16
    ours, scale = _ours_until_finite(g, init_scale)
    theirs = _torch_until_finite(g)
    assert ours == 0 < theirs  # torch halves once per skip: log2 of the excess
    assert scale * largest <= TARGET < 2 * scale * largest  # then the rule's scale at once
