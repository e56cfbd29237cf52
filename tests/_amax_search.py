"""A deterministic search for models where `amax_scaler` skips more steps than
`dynamic_scaler` (torch's rule) on the same data (issue 51).

A family of small float16 MLPs: depth, biases, whether the loss (its mean
or sum) is computed in float16 or after a cast of the output to float32,
gradient accumulation and the growth interval are the *structure* (one
compile each); the input, weight and target scales, the learning rate and
the data are drawn per model and run as a ``vmap`` population of both
scalers side by side.  ``python -m tests._amax_search --json F`` runs the full
search and prints every model where amax skipped more; the tests run slices.

A model whose float32 twin (the same steps, float32 compute, no scaling)
diverges (a non-finite loss, or a last loss 100 times its first) is reported
apart: there both float16 runs end in NaN steps that every scaler skips, and
their counts say when each run diverged, not how well it scaled.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jax_amp_scale as jas
from jax_amp_scale.optax import accumulate_gradients, get_loss_scaled_state, loss_scaled

WIDTH, FEATURES, BATCH = 8, 4, 16


@dataclasses.dataclass(frozen=True)
class Structure:
    depth: int  # hidden layers
    bias: bool
    loss_in_float16: bool  # the mean/sum in float16; else the output cast to float32 first
    mean: bool  # mean or sum over the batch
    accumulate: int  # micro-batches per optimizer step
    growth_interval: int


STRUCTURES = [
    Structure(*s)
    for s in itertools.product(
        (1, 2, 3), (True, False), (True, False), (True, False), (1, 4), (2000, 8)
    )
]


def _forward(s: Structure, p: dict, x: jax.Array, dtype: jnp.dtype) -> jax.Array:
    h = x.astype(dtype)
    for i in range(s.depth + 1):
        h = h @ p[f"w{i}"].astype(dtype)
        if s.bias:
            h = h + p[f"b{i}"].astype(dtype)
        if i < s.depth:
            h = jnp.tanh(h)
    return h


def _loss(s: Structure, p: dict, x: jax.Array, y: jax.Array, dtype=jnp.float16) -> jax.Array:
    out = _forward(s, p, x, dtype)
    # The loss's difference in float16, or the output cast to float32 first.
    err = (out - y.astype(dtype)) ** 2 if s.loss_in_float16 else (out.astype(jnp.float32) - y) ** 2
    red = jnp.mean(err) if s.mean else jnp.sum(err)
    return red.astype(jnp.float32)


def _draw(key: jax.Array) -> dict:
    """One model's scales (log-uniform) and its keys."""
    ks = jax.random.split(key, 6)
    u = lambda k, lo, hi: 10.0 ** jax.random.uniform(k, (), minval=lo, maxval=hi)  # noqa: E731
    return {
        "x": u(ks[0], -4.0, 1.0),
        "w": u(ks[1], -1.5, 0.5),
        "y": u(ks[2], -2.0, 1.5),
        "lr": u(ks[3], -4.0, -1.0),
        "init": ks[4],
        "data": ks[5],
    }


def _params(s: Structure, draw: dict) -> dict:
    dims = [FEATURES] + [WIDTH] * s.depth + [1]
    keys = jax.random.split(draw["init"], 2 * len(dims))
    p = {}
    for i, (a, b) in enumerate(itertools.pairwise(dims)):
        p[f"w{i}"] = jax.random.normal(keys[2 * i], (a, b)) * draw["w"] / np.sqrt(a)
        if s.bias:
            p[f"b{i}"] = jax.random.normal(keys[2 * i + 1], (b,)) * 0.1
    return p


@functools.cache
def _runner(s: Structure, steps: int):
    """jit(vmap(run)): per model, the skipped optimizer steps of (amax, dynamic)
    and whether the float32 twin diverged."""

    def tx_for(scaler):
        tx = loss_scaled(optax.sgd(1.0), scaler, host_reports=False)
        return accumulate_gradients(tx, s.accumulate) if s.accumulate > 1 else tx

    def run_one(key):
        draw = _draw(key)
        params = _params(s, draw)
        xs = jax.random.normal(draw["data"], (steps, BATCH, FEATURES)) * draw["x"]
        ys = jnp.sin(xs.sum(-1, keepdims=True) / draw["x"]) * draw["y"]

        def train(scaler):
            tx = tx_for(scaler)

            def step(carry, batch):
                p, st = carry
                x, y = batch
                sst = get_loss_scaled_state(st)
                g = jax.grad(lambda q: jas.scale_loss(_loss(s, q, x, y), sst))(p)
                u, st = tx.update(g, st, p)
                # sgd(1.0) gives -g; the drawn learning rate, a leaf, scales it
                p = optax.apply_updates(p, jax.tree.map(lambda v: draw["lr"] * v, u))
                return (p, st), None

            (_, st), _ = jax.lax.scan(step, (params, tx.init(params)), (xs, ys))
            return get_loss_scaled_state(st).skipped_steps

        def twin_step(p, batch):
            loss, g = jax.value_and_grad(lambda q: _loss(s, q, *batch, jnp.float32))(p)
            return jax.tree.map(lambda a, b: a - draw["lr"] * b / s.accumulate, p, g), loss

        losses = jax.lax.scan(twin_step, params, (xs, ys))[1]
        diverged = ~jnp.all(jnp.isfinite(losses)) | (losses[-1] > 100 * losses[0])
        amax = train(jas.amax_scaler(growth_interval=s.growth_interval))
        dyn = train(jas.dynamic_scaler(growth_interval=s.growth_interval))
        return amax, dyn, diverged

    return jax.jit(jax.vmap(run_one))


def search(structures: list[Structure], per_structure: int, steps: int = 60, seed: int = 0):
    """Runs `per_structure` models of each structure; returns a list of
    ``(structure, model index, amax skips, dynamic skips, float32 twin diverged)``."""
    rows = []
    for s in structures:
        j = STRUCTURES.index(s)  # the same models whichever slice is run
        keys = jax.random.split(jax.random.key(seed * 100_003 + j), per_structure)
        amax, dyn, div = jax.device_get(_runner(s, steps)(keys))
        per_model = zip(amax, dyn, div, strict=True)
        rows += [(s, i, int(a), int(d), bool(v)) for i, (a, d, v) in enumerate(per_model)]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--per-structure", type=int, default=11)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--json", type=Path, default=None, help="write the models' rows here")
    args = p.parse_args(argv)
    rows = search(STRUCTURES, args.per_structure, args.steps)
    kept = [r for r in rows if not r[4]]
    worse = [r for r in kept if r[2] > r[3]]
    summary = {
        "models": len(rows),
        "structures": len(STRUCTURES),
        "steps": args.steps,
        "twin_diverged": len(rows) - len(kept),
        "amax_more": len(worse),
        "amax_fewer": sum(r[2] < r[3] for r in kept),
        "equal": sum(r[2] == r[3] for r in kept),
        "skips_amax": sum(r[2] for r in kept),
        "skips_dynamic": sum(r[3] for r in kept),
        "amax_more_where_twin_diverged": sum(r[2] > r[3] for r in rows if r[4]),
    }
    print(json.dumps(summary))
    for s, i, a, d, v in rows:
        if a > d:
            print(f"  {s} model {i}: amax {a} dynamic {d}{' (float32 twin diverged)' if v else ''}")
    if args.json is not None:
        fields = [f.name for f in dataclasses.fields(Structure)]
        table = [[*dataclasses.astuple(s), i, a, d, v] for s, i, a, d, v in rows]
        args.json.write_text(
            json.dumps(
                {
                    "summary": summary,
                    # What the docs show (tools/figures.py: amax_search.NAME).
                    "figures": {k: f"{n:,}" for k, n in summary.items()}
                    | {"kept": f"{len(kept):,}"},
                    "columns": [*fields, "model", "amax", "dynamic", "twin_diverged"],
                    "rows": table,
                }
            )
        )
    return 0 if not worse else 1


if __name__ == "__main__":
    raise SystemExit(main())
