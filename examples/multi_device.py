"""Data-parallel float16 training on 8 devices, two ways: NamedSharding and shard_map.

    python examples/multi_device.py [--steps 30]

On a machine without 8 accelerators the example makes 8 virtual CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set below before
jax is imported).  A byte-level MLP language model (float16 matrix
products, float32 master weights) on the Python standard library's sources
is trained data parallel: the batch is split over the 8 devices, the
parameters and the optimizer state are replicated.

- **jit with NamedSharding**: the step is written for the global batch; XLA
  partitions it.  ``loss_scaled`` needs nothing more: the gradients, the
  overflow check and the scale are global values.
- **shard_map**: the step is written per device; ``loss_scaled(...,
  axis_name="data")`` averages the gradients over the axis (torch DDP's
  all-reduce) and ORs the overflow flag across it, so every device skips
  together and the replicas stay identical.

The scale starts at 2**10 and does not grow within the run: with shard_map
each device differentiates the mean over its own rows, so its float16
gradients are 8 times those of the jit version's per-device partial sums (the
global mean's terms), and a scale of 2**15 already overflows there at the
first step while it does not under jit.  Real runs of the two settle at
different scales for that reason; here the scale stays put so that the two
ways can be compared step by step.

An overflow is injected into device 3's rows at step ``--inject``.  The
example checks that both ways skip exactly that step and agree on the scale
at every step and on the losses within ``--tol``; it exits 1 otherwise.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import sys
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_amp_scale as jas
from jax_amp_scale.optax import get_loss_scaled_state, loss_scaled

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stdlib_corpus import load_corpus, random_windows

CONTEXT, ROWS_PER_DEVICE, BAD_DEVICE = 8, 16, 3


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "embed": jax.random.normal(k1, (256, 16)),
        "w1": jax.random.normal(k2, (CONTEXT * 16, 256)) / np.sqrt(CONTEXT * 16),
        "w2": jax.random.normal(k3, (256, 256)) / 16.0,
    }


def loss_fn(p: dict[str, jax.Array], batch: jax.Array, poison: jax.Array) -> jax.Array:
    """Mean cross-entropy of the rows; `poison` (one per row) is 1, or inf to overflow."""
    f16 = jnp.float16
    x = p["embed"][batch[:, :CONTEXT]].reshape(batch.shape[0], -1).astype(f16)
    logits = (jax.nn.relu(x @ p["w1"].astype(f16)) @ p["w2"].astype(f16)).astype(jnp.float32)
    per_row = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, CONTEXT])
    return jnp.mean(per_row * poison)


def scaled_loss(p, opt_state, batch, poison):
    """(the loss times the scale: what to differentiate, the loss)."""
    loss = loss_fn(p, batch, poison)
    return jas.scale_loss(loss, opt_state), loss


def make_tx(axis_name: str | None) -> optax.GradientTransformation:
    return loss_scaled(
        optax.adam(1e-3), jas.dynamic_scaler(2.0**10, growth_interval=1000), axis_name=axis_name
    )


def train_named_sharding(mesh, data, poison):
    replicated, by_row = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    tx = make_tx(None)
    params = jax.device_put(init_params(jax.random.key(0)), replicated)
    opt_state = jax.device_put(tx.init(params), replicated)

    @jax.jit
    def step(params, opt_state, batch, poison):
        grads, loss = jax.grad(scaled_loss, has_aux=True)(params, opt_state, batch, poison)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return run(step, params, opt_state, data, poison, by_row)


def train_shard_map(mesh, data, poison):
    replicated, by_row = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    tx = make_tx("data")
    params = jax.device_put(init_params(jax.random.key(0)), replicated)
    opt_state = jax.device_put(tx.init(params), replicated)

    @jax.jit
    @partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=(P(), P(), P("data"), P("data")),
        out_specs=(P(), P(), P()),
    )
    def step(params, opt_state, batch, poison):
        # Per device: its own rows; the gradients are this device's.
        grads, loss = jax.grad(scaled_loss, has_aux=True)(params, opt_state, batch, poison)
        updates, opt_state = tx.update(grads, opt_state, params)  # pmean + shared skip inside
        return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, "data")

    return run(step, params, opt_state, data, poison, by_row)


def run(step, params, opt_state, data, poison, by_row):
    out = []
    for batch, bad in zip(data, poison, strict=False):
        old_scale = float(jas.find_scale_state(opt_state).scale)
        params, opt_state, loss = step(
            params, opt_state, jax.device_put(batch, by_row), jax.device_put(bad, by_row)
        )
        out.append((float(loss), old_scale, int(get_loss_scaled_state(opt_state).skipped_steps)))
    return np.array(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--inject", type=int, default=5, help="step whose device-3 rows overflow")
    ap.add_argument("--tol", type=float, default=1e-3, help="largest |loss difference| allowed")
    args = ap.parse_args(argv)
    n = jax.device_count()
    if n < 2:
        print(f"this example needs several devices, found {n}", file=sys.stderr)
        return 1
    # Auto axes: XLA decides the shardings inside jit (jax's explicit mode would ask
    # for an out_sharding on the embedding's gather).
    mesh = jax.make_mesh((n,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    train, _ = load_corpus()
    data = random_windows(train, args.steps, n * ROWS_PER_DEVICE, CONTEXT + 1)
    poison = np.ones((args.steps, n * ROWS_PER_DEVICE), np.float32)
    poison[args.inject, BAD_DEVICE * ROWS_PER_DEVICE] = np.inf  # one row on one device

    a = train_named_sharding(mesh, data, poison)
    b = train_shard_map(mesh, data, poison)
    print(f"{n} devices: {jax.devices()[0].platform}, {ROWS_PER_DEVICE} rows each")
    for t in range(0, args.steps, max(1, args.steps // 8)):
        print(
            f"step {t:3d}  loss jit {a[t, 0]:.4f} shard_map {b[t, 0]:.4f}  "
            f"scale {a[t, 1]:g} / {b[t, 1]:g}  skipped {int(a[t, 2])} / {int(b[t, 2])}"
        )
    finite = np.isfinite(a[:, 0]) & np.isfinite(b[:, 0])
    worst = float(np.max(np.abs(a[finite, 0] - b[finite, 0])))
    skipped_at = [int(np.argmax(r[:, 2] > 0)) if r[-1, 2] else None for r in (a, b)]
    ok = skipped_at == [args.inject, args.inject] and int(a[-1, 2]) == int(b[-1, 2]) == 1
    ok &= bool(np.array_equal(a[:, 1], b[:, 1])) and worst <= args.tol
    print(
        f"skipped step: jit {skipped_at[0]}, shard_map {skipped_at[1]} (injected at {args.inject}); "
        f"scales {'agree' if np.array_equal(a[:, 1], b[:, 1]) else 'DIFFER'}; "
        f"max |loss difference| {worst:.2e} (tolerance {args.tol:g})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
