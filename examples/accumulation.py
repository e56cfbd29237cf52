"""Gradient accumulation with loss scaling, torch ``GradScaler``'s semantics.

    python examples/accumulation.py [--windows 40] [--micro 4]

``accumulate_gradients(loss_scaled(inner, scaler), k)`` sums the *scaled*
gradients of k micro-batches and steps once per window with their mean, so
k micro-batches of n rows train like one batch of k*n rows (the learning rate
does not change with k; do not divide the loss yourself).  The scale changes
once per window, and an overflow in any micro-batch skips the whole window.

A byte-level MLP language model (float16 matrix products, float32 master
weights) on the Python standard library's sources is trained twice on the
same rows: in windows of ``--micro`` micro-batches of 32, and in whole
batches of ``32 * micro``.  An overflow is injected into one micro-batch of
window 5 (its loss is multiplied by inf).  The example checks that window 5
is skipped in the accumulated run (and the whole-batch run's step 5 too: the
injected micro-batch is part of that batch), that the scales agree, and that
the two runs' losses agree within ``--tol``; it exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jax_amp_scale as jas
from jax_amp_scale.optax import accumulate_gradients, get_loss_scaled_state, loss_scaled

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stdlib_corpus import load_corpus, random_windows

CONTEXT, MICRO_ROWS, INJECT_WINDOW = 8, 32, 5


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "embed": jax.random.normal(k1, (256, 16)),
        "w1": jax.random.normal(k2, (CONTEXT * 16, 256)) / np.sqrt(CONTEXT * 16),
        "w2": jax.random.normal(k3, (256, 256)) / 16.0,
    }


def loss_fn(p: dict[str, jax.Array], batch: jax.Array, poison: jax.Array) -> jax.Array:
    f16 = jnp.float16
    x = p["embed"][batch[:, :CONTEXT]].reshape(batch.shape[0], -1).astype(f16)
    logits = (jax.nn.relu(x @ p["w1"].astype(f16)) @ p["w2"].astype(f16)).astype(jnp.float32)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, CONTEXT]).mean()
    return loss * poison


def run(tx: optax.GradientTransformation, batches: np.ndarray, poison: np.ndarray):
    """Trains over `batches`; returns per-call (loss, scale, skipped_steps)."""
    params = init_params(jax.random.key(0))
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch, poison):
        def scaled(p):
            loss = loss_fn(p, batch, poison)
            return jas.scale_loss(loss, opt_state), loss

        grads, loss = jax.grad(scaled, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    out = []
    for batch, bad in zip(batches, poison, strict=False):
        params, opt_state, loss = step(params, opt_state, batch, bad)
        state = get_loss_scaled_state(opt_state)
        scale = jas.find_scale_state(opt_state).scale
        out.append((float(loss), float(scale), int(state.skipped_steps)))
    return np.array(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--windows", type=int, default=40)
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per window (k)")
    ap.add_argument("--tol", type=float, default=2e-2, help="largest |loss difference| allowed")
    args = ap.parse_args(argv)
    k = args.micro

    train, _ = load_corpus()
    rows = random_windows(train, args.windows, k * MICRO_ROWS, CONTEXT + 1)
    micro = rows.reshape(args.windows * k, MICRO_ROWS, CONTEXT + 1)
    poison_micro = np.ones(args.windows * k, np.float32)
    poison_micro[INJECT_WINDOW * k + 1] = np.inf  # the second micro-batch of window 5
    poison_whole = poison_micro.reshape(args.windows, k).max(axis=1)

    def make(kk: int) -> optax.GradientTransformation:
        scaler = jas.dynamic_scaler(2.0**15, growth_interval=10)
        inner = optax.adam(1e-3)
        return (
            accumulate_gradients(loss_scaled(inner, scaler), kk)
            if kk > 1
            else loss_scaled(inner, scaler)
        )

    acc = run(make(k), micro, poison_micro)
    whole = run(make(1), rows, poison_whole)

    # Per window: the mean loss of its micro-batches (without the injected one),
    # the scale and the skipped count after its last micro-batch.
    acc_loss = np.where(np.isfinite(acc[:, 0]), acc[:, 0], np.nan).reshape(-1, k)
    acc_loss = np.nanmean(acc_loss, axis=1)
    acc_end = acc[k - 1 :: k]
    ok = True
    for w in range(0, args.windows, max(1, args.windows // 8)):
        print(
            f"window {w:3d}  loss accumulated {acc_loss[w]:.4f} whole {whole[w, 0]:.4f}  "
            f"scale {acc_end[w, 1]:g} / {whole[w, 1]:g}  skipped {int(acc_end[w, 2])} / {int(whole[w, 2])}"
        )
    skipped = int(acc_end[-1, 2])
    print(f"skipped windows: {skipped} (expected 1: the overflow in window {INJECT_WINDOW})")
    ok &= skipped == 1 and int(whole[-1, 2]) == 1
    ok &= bool(np.array_equal(acc_end[:, 1], whole[:, 1]))
    finite = np.isfinite(whole[:, 0])
    worst = float(np.max(np.abs(acc_loss - whole[:, 0])[finite]))
    print(
        f"max |loss difference| {worst:.2e} (tolerance {args.tol:g}); "
        f"scales {'agree' if np.array_equal(acc_end[:, 1], whole[:, 1]) else 'DIFFER'}"
    )
    ok &= worst <= args.tol
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
