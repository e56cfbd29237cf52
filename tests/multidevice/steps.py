"""The plain optax step and the same step through a `loss_scaled` transformation."""

from __future__ import annotations

import jax
import optax

import jax_amp_scale as jas


def plain_and_scaled(loss, inner, tx):
    """``(plain, scaled)``: ``step(params, opt_state, x, y) -> (params, opt_state)``
    with `inner` alone and with `tx` (which wraps `inner`) on the scaled loss."""

    def plain(params, opt_state, x, y):
        grads = jax.grad(loss)(params, x, y)
        updates, opt_state = inner.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def scaled(params, opt_state, x, y):
        grads = jax.grad(lambda p: jas.scale_loss(loss(p, x, y), opt_state))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return plain, scaled
