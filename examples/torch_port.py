"""A torch ``GradScaler`` loop ported line by line, and both run side by side.

    python examples/torch_port.py [--steps 60] [--inject 10,11]

The loop, torch on the left, this library on the right:

    torch                                          jax_amp_scale
    scaler = torch.amp.GradScaler("cpu", ...)      scaler = jas.dynamic_scaler(...)
    opt = torch.optim.SGD(params, lr, momentum)    tx = optax.sgd(lr, momentum)
    opt.zero_grad()                                (nothing: gradients are values)
    with torch.autocast("cpu", torch.float16):     (the float16 casts are explicit)
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()                  grads = jax.grad(lambda p: scaler.scale_loss(loss_fn(p)))(params)
    scaler.unscale_(opt)                           grads, found_inf = scaler.unscale_and_check(grads)
    clip_grad_norm_(model.parameters(), 1.0)       grads, norm = jas.clip_by_global_norm(grads, 1.0)
    scaler.step(opt)                               params, opt_state = optimizer_step(tx, grads, opt_state, params, found_inf)
    scaler.update()                                scaler = scaler.update(found_inf)

(``found_inf`` is True on an overflow, as in torch.)  The model is a byte-level
MLP (the previous 8 bytes predict the next) on the Python standard library's
sources; torch starts from the JAX initial weights and sees the same batches.
Overflows are injected at the ``--inject`` steps (the loss is multiplied by
inf in both), so both skip those steps and back the scale off.  The example
checks that the scale is the same at every step and the losses agree within
``--tol`` (float16 products round differently in the two libraries); it
exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn.functional as F

import jax_amp_scale as jas
from jax_amp_scale.optax import optimizer_step

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stdlib_corpus import load_corpus, random_windows

CONTEXT, EMBED, HIDDEN, BATCH = 8, 16, 256, 128
LR, MOMENTUM, MAX_NORM = 0.1, 0.9, 1.0
INIT_SCALE, GROWTH_INTERVAL = 2.0**15, 10


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    k = jax.random.split(key, 4)
    n_in = CONTEXT * EMBED
    return {
        "embed": jax.random.normal(k[0], (256, EMBED)),
        "w1": jax.random.normal(k[1], (n_in, HIDDEN)) / np.sqrt(n_in),
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k[2], (HIDDEN, 256)) / np.sqrt(HIDDEN),
        "b2": jnp.zeros(256),
    }


def forward(p: dict[str, jax.Array], tokens: jax.Array) -> jax.Array:
    """Logits, float32; the two matrix products in float16 (what autocast does in torch)."""
    f16 = jnp.float16
    x = p["embed"][tokens].reshape(tokens.shape[0], -1)
    h = jax.nn.relu(x.astype(f16) @ p["w1"].astype(f16) + p["b1"].astype(f16))
    return (h @ p["w2"].astype(f16) + p["b2"].astype(f16)).astype(jnp.float32)


def train_jax(data: np.ndarray, poison: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    params = init_params(jax.random.key(0))
    scaler = jas.dynamic_scaler(INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    tx = optax.sgd(LR, momentum=MOMENTUM)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, scaler, batch, poison):
        def loss_fn(p):
            logits = forward(p, batch[:, :CONTEXT])
            labels = batch[:, CONTEXT]
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
            loss = loss.mean()
            return scaler.scale_loss(loss * poison), loss

        # torch: scaler.scale(loss).backward()
        grads, loss = jax.grad(loss_fn, has_aux=True)(params)
        # torch: scaler.unscale_(opt)
        grads, found_inf = scaler.unscale_and_check(grads)
        # torch: torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
        grads, _ = jas.clip_by_global_norm(grads, MAX_NORM)
        # torch: scaler.step(opt)
        params, opt_state = optimizer_step(tx, grads, opt_state, params, found_inf)
        # torch: scaler.update()
        return params, opt_state, scaler.update(found_inf), loss

    losses, scales = [], []
    for t in range(len(data)):
        scales.append(float(scaler.scale))
        params, opt_state, scaler, loss = step(params, opt_state, scaler, data[t], poison[t])
        losses.append(float(loss))
    return np.array(losses), np.array(scales)


def train_torch(data: np.ndarray, poison: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = {
        k: torch.from_numpy(np.array(v)).requires_grad_()
        for k, v in init_params(jax.random.key(0)).items()
    }
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    opt = torch.optim.SGD(p.values(), lr=LR, momentum=MOMENTUM)
    losses, scales = [], []
    for t in range(len(data)):
        batch = torch.from_numpy(data[t]).long()
        scales.append(scaler.get_scale())
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            x = p["embed"][batch[:, :CONTEXT]].reshape(len(batch), -1)
            h = F.relu(F.linear(x, p["w1"].T, p["b1"]))
            logits = F.linear(h, p["w2"].T, p["b2"])
        loss = F.cross_entropy(logits.float(), batch[:, CONTEXT])
        scaler.scale(loss * float(poison[t])).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(p.values(), MAX_NORM)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return np.array(losses), np.array(scales)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument(
        "--inject", default="10,11", help="steps (0-based) whose loss is multiplied by inf"
    )
    ap.add_argument(
        "--tol", type=float, default=1e-2, help="largest |loss_jax - loss_torch| allowed"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    train, _ = load_corpus()
    data = random_windows(train, args.steps, BATCH, CONTEXT + 1)
    poison = np.ones(args.steps, np.float32)
    for s in filter(None, args.inject.split(",")):
        poison[int(s)] = np.inf

    jl, js = train_jax(data, poison)
    tl, ts = train_torch(data, poison)
    diff = np.abs(jl - tl)
    for t in range(0, args.steps, max(1, args.steps // 10)):
        print(
            f"step {t:3d}  loss JAX {jl[t]:.4f} torch {tl[t]:.4f}  scale JAX {js[t]:g} torch {ts[t]:g}"
        )
    same_scales = bool(np.array_equal(js, ts))
    print(
        f"scales {'equal' if same_scales else 'DIFFER'} at every step "
        f"(JAX {js[-1]:g} at the end, torch {ts[-1]:g}); "
        f"max |loss difference| {diff.max():.2e} (tolerance {args.tol:g})"
    )
    return 0 if same_scales and diff.max() <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
