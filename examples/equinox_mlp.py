"""An equinox model trained in float16 with dynamic loss scaling.

    python examples/equinox_mlp.py [--steps 200]

A byte-level MLP language model (the previous 16 bytes predict the next) on
the Python standard library's sources.  The model's arrays stay float32 (the
master weights); the forward pass runs on a float16 copy, so the backward
pass and the gradients are float16 until the cast back.  With equinox the
optimizer sees ``eqx.filter(model, eqx.is_array)``; ``loss_scaled`` works on
that pytree like any other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import jax_amp_scale as jas
from jax_amp_scale.optax import loss_scaled

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stdlib_corpus import load_corpus, random_windows

CONTEXT = 16


class ByteMLP(eqx.Module):
    embed: eqx.nn.Embedding
    mlp: eqx.nn.MLP

    def __init__(self, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.embed = eqx.nn.Embedding(256, 32, key=k1)
        self.mlp = eqx.nn.MLP(CONTEXT * 32, 256, 256, depth=2, activation=jax.nn.gelu, key=k2)

    def __call__(self, tokens: jax.Array) -> jax.Array:  # one example: (CONTEXT,) -> (256,)
        return self.mlp(jax.vmap(self.embed)(tokens).reshape(-1))


def to_float16(model: ByteMLP) -> ByteMLP:
    """A float16 copy of the model's floating arrays (the forward pass's weights)."""
    cast = lambda x: x.astype(jnp.float16) if eqx.is_inexact_array(x) else x  # noqa: E731
    return jax.tree.map(cast, model)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args(argv)

    train, _ = load_corpus()
    data = random_windows(train, args.steps, 128, CONTEXT + 1)
    model = ByteMLP(jax.random.key(0))
    tx = loss_scaled(optax.adam(1e-3), jas.dynamic_scaler(2.0**15, growth_interval=50))
    opt_state = tx.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def train_step(model: ByteMLP, opt_state, batch: jax.Array):
        def loss_fn(model: ByteMLP) -> tuple[jax.Array, jax.Array]:
            logits = jax.vmap(to_float16(model))(batch[:, :CONTEXT]).astype(jnp.float32)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, CONTEXT])
            loss = loss.mean()
            return jas.scale_loss(loss, opt_state), loss  # scaled for the backward pass

        grads, loss = eqx.filter_grad(loss_fn, has_aux=True)(model)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    for step in range(args.steps):
        model, opt_state, loss = train_step(model, opt_state, data[step])
        if (step + 1) % max(1, args.steps // 5) == 0 or step + 1 == args.steps:
            scale = opt_state.scale  # LossScaledState.scale: the number
            print(f"step {step + 1:4d}  loss {float(loss):.4f}  scale {float(scale):g}")
    if not jnp.isfinite(loss) or float(loss) > 5.0:  # starts at ln(256) = 5.55
        print("the loss did not decrease", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
