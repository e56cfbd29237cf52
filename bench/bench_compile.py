"""Workload 3: time to compile the training step as parameter trees grow.

Two models, computed in float16 from float32 master weights (the default
runs the tree only):

- ``tree``: 10, 100, 1,000 and 10,000 leaves, each a float32 vector of 16
  values, used elementwise.
  The gradient of each leaf is an elementwise kernel that the plain step
  fuses into the optimizer's update: the worst case for any scaled step
  that needs the gradients in memory before it updates.
- ``dense``: an MLP of n/2 dense layers (32x32 weight and a bias each,
  batch 16).  Weight gradients come out of dots, as in real models.  Up to
  1,000 leaves by default: XLA:CPU compiling the plain step of 5,000 such
  layers ran this 23 GB machine out of memory.

The same step per candidate as workload 1 (`_steps.py`; of ours
``backend="auto"``, the fused native gradient pass on CPU, and
``"reference"``, the pure-JAX pass with one kernel per leaf).  A candidate
whose compile, projected from its growth so far, would pass ``--budget-s``
is not run at that size and the table says so.  Each sample traces, lowers
and compiles a fresh function object (nothing cached between samples),
split into trace+lower and the XLA compile.  Growth is linear when the time
per leaf stays flat from 1,000 to 10,000 leaves; the ratio to the plain
step's compile time is paired per repetition as everywhere in bench/.

    python bench/bench_compile.py                                # tree model
    python bench/bench_compile.py --models dense --budget-s 20   # dense model
    python bench/bench_compile.py --tiny                         # smoke
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness
import _steps

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


def compile_once(
    builder: _steps.Builder, params, batch, loss: Callable = leafy_loss
) -> tuple[float, float]:
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

    def candidate(name):
        def run():
            split[name].append(compile_once(builders[name], params, batch, model.loss))

        return run

    rows = _harness.measure(
        {k: candidate(k) for k in builders}, baseline="plain", reps=reps, warmup=warmup
    )
    for r in rows:
        timed = split[r.name][warmup:]  # the warm-up samples came first
        r.extra["lower_s"] = [a for a, _ in timed]
        r.extra["compile_s"] = [b for _, b in timed]
    return rows


def projected(history: dict[int, float], n: int) -> float | None:
    """Seconds one compile at `n` leaves would take, from the sizes already run.

    The growth exponent between the two largest sizes run so far (at least
    1: compile time never grows slower than the tree) carries the last time
    forward.
    """
    sizes = sorted(history)
    if not sizes:
        return None
    last = sizes[-1]
    k = 1.0
    if len(sizes) >= 2:
        prev = sizes[-2]
        k = max(1.0, math.log(history[last] / history[prev]) / math.log(last / prev))
    return history[last] * (n / last) ** k


def run_model(
    model: Model,
    builders: dict[str, _steps.Builder],
    leaf_counts: tuple[int, ...],
    args: Any,
    why: str | None,
) -> list[_harness.Table]:
    """One model's tables, one per leaf count, with the growth column."""
    tables: list[_harness.Table] = []
    per_leaf: dict[str, dict[int, float]] = {k: {} for k in builders}
    for n in leaf_counts:
        if args.tiny:
            reps, warmup = 1, 0
        elif n >= 100:
            reps, warmup = args.reps_large, 0
        else:
            reps, warmup = args.reps, args.warmup
        run_now, skipped = {}, []
        for name, b in builders.items():
            proj = projected({k: v * k for k, v in per_leaf[name].items()}, n)
            if proj is not None and proj > args.budget_s:
                skipped.append(f"{name} (projected {proj:.0f} s)")
            else:
                run_now[name] = b
        if "plain" not in run_now:
            tables[-1].notes.append(
                f"{n} leaves not run: even the plain step's compile is projected past "
                f"--budget-s {args.budget_s:g} s: " + "; ".join(skipped)
            )
            break
        rows = run_case(model, n, run_now, reps, warmup)
        for r in rows:
            per_leaf[r.name][n] = r.median / n
        split_col = {
            r.name: "{:.2f} + {:.2f}".format(
                statistics.median(r.extra["lower_s"]), statistics.median(r.extra["compile_s"])
            )
            for r in rows
        }
        notes = [] if why is None else [f"ours not measured: {why}"]
        if skipped:
            notes.append(
                f"not run at {n} leaves, one compile projected past --budget-s "
                f"{args.budget_s:g} s from the growth measured so far: " + "; ".join(skipped)
            )
        if warmup == 0:
            notes.append("no warm-up at this size: every sample is a cold trace+compile anyway")
        tables.append(
            _harness.Table(
                workload=model.workload,
                title=model.title.format(n=n),
                baseline="plain",
                rows=rows,
                unit="s",
                reps=reps,
                warmup=warmup,
                notes=notes,
                columns={"trace+lower + XLA compile (s)": split_col},
            )
        )
    if len(leaf_counts) >= 2:
        growth = {}
        for name, d in per_leaf.items():
            # exponent k in t ~ n**k between consecutive sizes; 1 = linear
            ks = []
            for a, b in itertools.pairwise(leaf_counts):
                if a in d and b in d:
                    k = math.log((d[b] * b) / (d[a] * a)) / math.log(b / a)
                    ks.append(f"{a}->{b}: {k:.2f}")
            growth[name] = ", ".join(ks)
        for t in tables:
            t.columns["growth exponent (1 = linear)"] = {
                r.name: growth.get(r.name, "") for r in t.rows
            }
    return tables


def main(argv: list[str] | None = None) -> list[_harness.Table]:
    p = _harness.parser(__doc__.splitlines()[0], reps=3, warmup=1)
    p.add_argument(
        "--models",
        nargs="+",
        choices=list(MODELS),
        default=["tree"],
        help="which models (default tree; run dense on its own with --budget-s 20: "
        "inside run_all with a 60 s budget it was killed for memory on a 23 GB machine)",
    )
    p.add_argument(
        "--leaves",
        type=int,
        nargs="+",
        default=None,
        help="leaf counts (default: tree 10 100 1000 10000, dense 10 100 1000; --tiny: 2 4)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=100.0,
        help="skip a candidate at a size where one compile is projected to take longer "
        "(from its growth so far; default 100 s)",
    )
    p.add_argument(
        "--reps-large",
        type=int,
        default=1,
        help="repetitions at 100 leaves and above, where one compile takes seconds",
    )
    p.add_argument(
        "--candidates",
        nargs="+",
        default=None,
        help="run only these candidates (names as in the table; plain always runs)",
    )
    args = p.parse_args(argv)
    why = _steps.ours_available()
    # auto: one custom call for the whole gradient pass (CPU); reference: one
    # kernel and one reduction per leaf.  "ffi" compiles as auto does.
    builders = _steps.candidates(("auto", "reference") if why is None else ())
    if args.candidates:
        keep = {"plain", *args.candidates}
        builders = {k: v for k, v in builders.items() if k in keep}
    tables = []
    for name in args.models:
        model = MODELS[name]
        leaf_counts = tuple(args.leaves or ((2, 4) if args.tiny else model.leaf_counts))
        tables += run_model(model, builders, leaf_counts, args, why)
    _harness.finish(args, tables)
    return tables


if __name__ == "__main__":
    main()
