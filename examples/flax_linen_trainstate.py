"""flax linen's ``TrainState`` with float16 compute and dynamic loss scaling.

    python examples/flax_linen_trainstate.py [--steps 200]

A byte-level MLP language model (the previous 16 bytes predict the next) on
the Python standard library's sources, its Dense layers computing in float16
(``dtype=jnp.float16``; the parameters stay float32).  The only changes to a
plain ``TrainState`` loop are the two marked statements: the optimizer is
wrapped in ``loss_scaled``, and the loss is multiplied by the scale before
``grad``.
``state.apply_gradients`` then receives *scaled* gradients; ``loss_scaled``
unscales them, skips the step on inf/NaN and adjusts the scale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState

import jax_amp_scale as jas
from jax_amp_scale.optax import loss_scaled

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stdlib_corpus import load_corpus, random_windows

CONTEXT = 16


class ByteMLP(nn.Module):
    dtype: jnp.dtype = jnp.float16

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = nn.Embed(256, 32)(tokens).reshape(tokens.shape[0], -1)
        x = nn.gelu(nn.Dense(256, dtype=self.dtype)(x))
        x = nn.gelu(nn.Dense(256, dtype=self.dtype)(x))
        return nn.Dense(256, dtype=self.dtype)(x).astype(jnp.float32)  # logits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args(argv)

    train, _ = load_corpus()
    data = random_windows(train, args.steps, 128, CONTEXT + 1)
    model = ByteMLP()
    params = model.init(jax.random.key(0), data[0, :, :CONTEXT])["params"]
    tx = loss_scaled(  # (1)
        optax.adam(1e-3), jas.dynamic_scaler(2.0**15, growth_interval=50)
    )
    state = TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    @jax.jit
    def train_step(state: TrainState, batch: jax.Array) -> tuple[TrainState, jax.Array]:
        def loss_fn(params):
            logits = state.apply_fn({"params": params}, batch[:, :CONTEXT])
            labels = batch[:, CONTEXT]
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return jas.scale_loss(loss, state.opt_state), loss  # (2)

        grads, loss = jax.grad(loss_fn, has_aux=True)(state.params)
        return state.apply_gradients(grads=grads), loss

    for step in range(args.steps):
        state, loss = train_step(state, data[step])
        if (step + 1) % max(1, args.steps // 5) == 0 or step + 1 == args.steps:
            scale = state.opt_state.scale  # LossScaledState.scale: the number
            print(f"step {step + 1:4d}  loss {float(loss):.4f}  scale {float(scale):g}")
    if not jnp.isfinite(loss) or float(loss) > 5.0:  # starts at ln(256) = 5.55
        print("the loss did not decrease", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
