"""The training step written with each library, for workloads 1 and 3:
a builder takes ``(loss_fn, params, optax optimizer)`` and returns ``(carry, step)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

PyTree = Any
LossFn = Callable[[PyTree, Any], jax.Array]
Builder = Callable[[LossFn, PyTree, optax.GradientTransformation], tuple[Any, Callable]]

INIT_SCALE = 2.0**15
HANDWRITTEN = "hand-written exact skip (no library)"
NO_REPORTS = "ours, no host reports (loss_scaled[auto], host_reports=False)"
AMAX = "ours amax_scaler (loss_scaled[auto])"


def plain(loss_fn: LossFn, params: PyTree, opt: optax.GradientTransformation):
    """No loss scaling at all: the floor every scaled step is compared to."""

    def step(carry, batch):
        params, opt_state = carry
        grads = jax.grad(loss_fn)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return (params, opt.init(params)), step


def ours(backend: str, drop_overflow_update: bool = True, amax=False, **options: Any) -> Builder:
    """`jax_amp_scale.optax.loss_scaled` with `backend` and `options` (`amax`: amax_scaler)."""

    def build(loss_fn: LossFn, params: PyTree, opt: optax.GradientTransformation):
        import jax_amp_scale as jas
        from jax_amp_scale import optax as jas_optax

        scaler = jas.dynamic_scaler(INIT_SCALE, drop_overflow_update=drop_overflow_update)
        scaler = jas.amax_scaler() if amax else scaler
        tx = jas_optax.loss_scaled(opt, scaler, **{"backend": backend, **options})

        def step(carry, batch):
            params, opt_state = carry
            grads = jax.grad(lambda p: jas.scale_loss(loss_fn(p, batch), opt_state))(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        return (params, tx.init(params)), step

    return build


def handwritten_skip(loss_fn: LossFn, params: PyTree, opt: optax.GradientTransformation):
    """The exact skip by hand, torch's rule at its defaults: what ours is held to."""

    def step(carry, batch):
        params, opt_state, scale, tracker = carry
        grads = jax.grad(lambda p: loss_fn(p, batch) * scale)(params)
        grads = jax.tree.map(lambda g: g * (1.0 / scale).astype(g.dtype), grads)
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
        updates, new_state = opt.update(grads, opt_state, params)
        new = (optax.apply_updates(params, updates), new_state)
        params, opt_state = jax.tree.map(
            lambda n, o: jnp.where(finite, n, o), new, (params, opt_state)
        )
        grown = scale * 2.0
        grow = finite & (tracker + 1 == 2000)
        scale = jnp.where(finite, jnp.where(grow & jnp.isfinite(grown), grown, scale), scale * 0.5)
        tracker = jnp.where(finite & ~grow, tracker + 1, 0)
        return params, opt_state, scale, tracker

    return (params, opt.init(params), jnp.float32(INIT_SCALE), jnp.int32(0)), step


def jmp_dynamic(loss_fn: LossFn, params: PyTree, opt: optax.GradientTransformation):
    """jmp's documented pattern: DynamicLossScale, all_finite, select_tree."""
    import jmp

    loss_scale = jmp.DynamicLossScale(jnp.float32(INIT_SCALE))

    def step(carry, batch):
        params, opt_state, loss_scale = carry
        grads = jax.grad(lambda p: loss_scale.scale(loss_fn(p, batch)))(params)
        grads = loss_scale.unscale(grads)
        finite = jmp.all_finite(grads)
        loss_scale = loss_scale.adjust(finite)
        updates, new_opt_state = opt.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        params, opt_state = jmp.select_tree(
            finite, (new_params, new_opt_state), (params, opt_state)
        )
        return params, opt_state, loss_scale

    return (params, opt.init(params), loss_scale), step


def flax_dynamic(loss_fn: LossFn, params: PyTree, opt: optax.GradientTransformation):
    """flax's documented pattern: DynamicScale.value_and_grad, then a where per leaf."""
    from flax.training.dynamic_scale import DynamicScale

    ds = DynamicScale(scale=jnp.float32(INIT_SCALE))

    def step(carry, batch):
        params, opt_state, ds = carry
        ds, is_fin, _, grads = ds.value_and_grad(loss_fn)(params, batch)
        updates, new_opt_state = opt.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)

        def keep(new, old):
            return jax.tree.map(lambda a, b: jnp.where(is_fin, a, b), new, old)

        return keep(new_params, params), keep(new_opt_state, opt_state), ds

    return (params, opt.init(params), ds), step


def optax_if_finite(loss_fn: LossFn, params: PyTree, opt: optax.GradientTransformation):
    """optax has no dynamic scale: a static one, and ``optax.apply_if_finite``."""
    tx = optax.apply_if_finite(opt, max_consecutive_errors=5)
    inv = jnp.float32(1.0 / INIT_SCALE)

    def step(carry, batch):
        params, opt_state = carry
        grads = jax.grad(lambda p: loss_fn(p, batch) * INIT_SCALE)(params)
        grads = jax.tree.map(lambda g: g * inv, grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return (params, tx.init(params)), step


def candidates(backends: tuple[str, ...]) -> dict[str, Builder]:
    """name -> builder, plain first (the baseline)."""
    out: dict[str, Builder] = {"plain": plain}
    out |= {f"ours loss_scaled[{b}]": ours(b) for b in backends}
    # The host reports' cost where they are a callback in a conditional (off the CPU).
    out[NO_REPORTS] = ours("auto", host_reports=False)
    out[AMAX] = ours("auto", amax=True)
    peers = {"jmp DynamicLossScale": jmp_dynamic, "flax DynamicScale": flax_dynamic}
    return out | {HANDWRITTEN: handwritten_skip, **peers, "optax apply_if_finite": optax_if_finite}


def ours_available() -> str | None:
    """None when the training API imports, else why not."""
    try:
        from jax_amp_scale import optax as jas_optax  # noqa: F401
    except ImportError as e:
        return f"jax_amp_scale.optax not importable: {e}"
    return None


def backends() -> tuple[str, ...]:
    """auto and each backend that runs the whole step on this platform."""
    import jax_amp_scale as jas

    return ("auto", *jas.available_backends(op="unscale_and_check"))
