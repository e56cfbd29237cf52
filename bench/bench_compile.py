"""Workload 3: time to compile the training step as parameter trees grow.

``tree``: 10 to 10,000 leaves of 16 floats used elementwise; ``dense``
(``--models dense``): an MLP of n/2 32x32 layers.  A candidate whose
compile, projected from its growth, would pass ``--budget-s`` is skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import _harness
import _steps
import jax
import jax.numpy as jnp
import optax

LEAF = 16
WIDTH = 32  # dense model: layer width
BATCH = 16  # dense model: rows per batch


def make_params(n: int) -> dict[str, jax.Array]:
    return {f"p{i:05d}": jnp.full((LEAF,), 0.01 * (i % 7 + 1), jnp.float32) for i in range(n)}


def leafy_loss(params: dict[str, jax.Array], batch: jax.Array) -> jax.Array:
    """Every leaf takes part in float16 compute; the loss is float32."""
    x = batch.astype(jnp.float16)
    total = jnp.float32(0.0)
    for p in params.values():
        total = total + jnp.sum(jnp.tanh(p.astype(jnp.float16) * x).astype(jnp.float32))
    return total


def make_dense_params(n: int) -> dict[str, dict[str, jax.Array]]:
    """n // 2 dense layers (at least one): a WIDTH x WIDTH weight and a bias each."""
    keys = jax.random.split(jax.random.key(0), max(1, n // 2))
    return {
        f"l{i:05d}": {
            "w": jax.random.normal(k, (WIDTH, WIDTH), jnp.float32) / math.sqrt(WIDTH),
            "b": jnp.zeros((WIDTH,), jnp.float32),
        }
        for i, k in enumerate(keys)
    }


def dense_loss(params: dict[str, dict[str, jax.Array]], batch: jax.Array) -> jax.Array:
    """An MLP in float16 (tanh between layers); the loss is float32."""
    x = batch.astype(jnp.float16)
    for layer in params.values():
        x = jnp.tanh(x @ layer["w"].astype(jnp.float16) + layer["b"].astype(jnp.float16))
    return jnp.mean(jnp.square(x.astype(jnp.float32)))


@dataclasses.dataclass(frozen=True)
class Model:
    workload: str
    title: str  # "{n}" is the leaf count
    make_params: Callable[[int], Any]
    loss: Callable[[Any, jax.Array], jax.Array]
    make_batch: Callable[[], jax.Array]
    leaf_counts: tuple[int, ...]  # the default sizes


MODELS = {
    "tree": Model(
        "3. Compile time",
        "training step, {n} parameter leaves",
        make_params,
        leafy_loss,
        lambda: jnp.linspace(-1.0, 1.0, LEAF, dtype=jnp.float32),
        (10, 100, 1000, 10_000),
    ),
    "dense": Model(
        "3. Compile time, dense layers",
        "MLP training step, {n} parameter leaves",
        make_dense_params,
        dense_loss,
        lambda: jnp.linspace(-1.0, 1.0, BATCH * WIDTH, dtype=jnp.float32).reshape(BATCH, WIDTH),
        (10, 100, 1000),
    ),
}


def compile_once(builder: _steps.Builder, params, batch, loss: Callable) -> tuple[float, float]:
    """(trace+lower seconds, XLA compile seconds) for a fresh step function."""
    carry, step = builder(loss, params, optax.sgd(1e-3, momentum=0.9))
    leaves, treedef = jax.tree.flatten(carry)

    # A flat signature: some peers' states (jmp) cannot be rebuilt from the
    # placeholders `lower` passes through their pytree hooks.
    def flat_step(leaves, batch):
        return jax.tree.leaves(step(jax.tree.unflatten(treedef, leaves), batch))

    t0 = time.perf_counter()
    lowered = jax.jit(flat_step).lower(leaves, batch)
    t1 = time.perf_counter()
    lowered.compile()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def run_case(model: Model, n: int, builders: dict[str, _steps.Builder], reps: int, warmup: int):
    params = model.make_params(n)
    batch = model.make_batch()
    split: dict[str, list[tuple[float, float]]] = {k: [] for k in builders}

    def run(name):
        split[name].append(compile_once(builders[name], params, batch, model.loss))

    cands = {k: functools.partial(run, k) for k in builders}
    rows = _harness.measure(cands, baseline="plain", reps=reps, warmup=warmup)
    for r in rows:
        timed = split[r.name][warmup:]  # the warm-up samples came first
        r.extra["lower_s"] = [a for a, _ in timed]
        r.extra["compile_s"] = [b for _, b in timed]
    return rows


def exponent(t: dict[int, float], a: int, b: int) -> float:
    """k in t ~ n**k between `a` and `b` leaves (1 = linear)."""
    return math.log(t[b] / t[a]) / math.log(b / a)


def projected(history: dict[int, float], n: int) -> float | None:
    """Seconds one compile at `n` leaves would take: the last size's time carried
    forward with the growth between the two largest sizes so far (at least linear)."""
    sizes = sorted(history)
    if not sizes:
        return None
    k = max(1.0, exponent(history, *sizes[-2:])) if len(sizes) >= 2 else 1.0
    return history[sizes[-1]] * (n / sizes[-1]) ** k


def run_model(model: Model, builders: dict, leaf_counts: tuple[int, ...], args: Any, why):
    """One model's tables, one per leaf count, with the growth column."""
    tables: list[_harness.Table] = []
    seconds: dict[str, dict[int, float]] = {k: {} for k in builders}  # one compile
    for n in leaf_counts:
        reps, warmup = (args.reps_large, 0) if n >= 100 else (args.reps, args.warmup)
        reps, warmup = (1, 0) if args.tiny else (reps, warmup)
        proj = {k: projected(seconds[k], n) or 0.0 for k in builders}
        skipped = [f"{k} (projected {s:.0f} s)" for k, s in proj.items() if s > args.budget_s]
        run_now = {k: b for k, b in builders.items() if proj[k] <= args.budget_s}
        if "plain" not in run_now:
            tables[-1].notes.append(
                f"{n} leaves not run: even the plain step's compile is projected past "
                f"--budget-s {args.budget_s:g} s: " + "; ".join(skipped)
            )
            break
        rows = run_case(model, n, run_now, reps, warmup)
        notes = [] if why is None else [f"ours not measured: {why}"]
        if skipped:
            notes.append(
                f"not run at {n} leaves, one compile projected past --budget-s "
                f"{args.budget_s:g} s from the growth measured so far: " + "; ".join(skipped)
            )
        if warmup == 0:
            notes.append("no warm-up at this size: every sample is a cold trace+compile anyway")
        split = {}
        for r in rows:
            seconds[r.name][n] = r.median
            lower, comp = (statistics.median(r.extra[k]) for k in ("lower_s", "compile_s"))
            split[r.name] = f"{lower:.2f} + {comp:.2f}"
        t = _harness.Table(model.workload, model.title.format(n=n), "plain", rows, "s")
        t.reps, t.warmup, t.notes = reps, warmup, notes
        t.columns = {"trace+lower + XLA compile (s)": split}
        tables.append(t)
    if len(leaf_counts) >= 2:
        pairs = list(itertools.pairwise(leaf_counts))
        growth = {
            k: ", ".join(
                f"{a}->{b}: {exponent(d, a, b):.2f}" for a, b in pairs if {a, b} <= d.keys()
            )
            for k, d in seconds.items()
        }
        for t in tables:
            t.columns["growth exponent (1 = linear)"] = {r.name: growth[r.name] for r in t.rows}
    return tables


def main(argv: list[str] | None = None) -> list[_harness.Table]:
    p = _harness.parser(__doc__.splitlines()[0], reps=3, warmup=1)
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=["tree"])
    p.add_argument("--leaves", type=int, nargs="+", help="leaf counts (default: the model's)")
    p.add_argument("--budget-s", type=float, default=100.0, help="per compile (default 100)")
    p.add_argument("--reps-large", type=int, default=1, help="repetitions from 100 leaves")
    p.add_argument("--candidates", nargs="+", help="only these (and plain), by table name")
    args = p.parse_args(argv)
    why = _steps.ours_available()
    # auto: one custom call for the whole gradient pass (CPU); reference: one
    # kernel and one reduction per leaf.  "ffi" compiles as auto does.
    builders = _steps.candidates(("auto", "reference") if why is None else ())
    if args.candidates:
        builders = {k: v for k, v in builders.items() if k in {"plain", *args.candidates}}
    tables = []
    for name in args.models:
        counts = args.leaves or ((2, 4) if args.tiny else MODELS[name].leaf_counts)
        tables += run_model(MODELS[name], builders, tuple(counts), args, why)
    _harness.save(args, tables, show=True)
    return tables


if __name__ == "__main__":
    main()
