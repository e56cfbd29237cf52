"""A short float16 training loop with dynamic loss scaling.

  python -m jax_amp_scale.demo [--steps 300] [--overflow-at 50 120]

Fits a linear model in float16 on synthetic data; the loss is scaled before
differentiation, gradients are unscaled and checked, overflow steps are
skipped and the scale follows `jax_amp_scale.update_scale`.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jax_amp_scale as jas


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="float16 training with dynamic loss scaling")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--overflow-at", type=int, nargs="*", default=[50, 120, 121])
    ap.add_argument("--backend", default="auto", choices=["auto", "reference", "ffi"])
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(512, 16)), jnp.float16)
    w_true = jnp.asarray(rng.normal(size=(16, 1)), jnp.float16)
    y = x @ w_true
    params = jnp.zeros((16, 1), jnp.float32)  # float32 master weights
    state = jas.init_scale_state(2.0**15, growth_interval=50)

    @jax.jit
    def step(params, state, poison):
        def loss_fn(p):
            err = x @ p.astype(jnp.float16) - y
            loss = jnp.mean(err.astype(jnp.float32) ** 2)
            return (loss * state.scale).astype(jnp.float16), loss

        grads, loss = jax.grad(loss_fn, has_aux=True)(params)
        grads = grads.astype(jnp.float32) / state.scale + poison
        found_inf = ~jnp.all(jnp.isfinite(grads))
        new_params = jnp.where(found_inf, params, params - 0.05 * grads)
        return new_params, jas.update_scale(state, found_inf, args.backend), loss, found_inf

    skipped = 0
    for i in range(args.steps):
        poison = jnp.float32(np.inf if i in args.overflow_at else 0.0)
        params, state, loss, found = step(params, state, poison)
        skipped += int(found)
        if found or i % 25 == 0 or i == args.steps - 1:
            tag = "  overflow: step skipped" if found else ""
            print(f"step {i:4d}  loss {float(loss):.5f}  scale {float(state.scale):9.1f}{tag}")
    print(f"done: {args.steps} steps, {skipped} skipped, final scale {float(state.scale)}")


if __name__ == "__main__":
    main()
