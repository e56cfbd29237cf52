"""Workload 4, the operator itself: reference lowering vs FFI custom call, side by side.

Workloads (each timed interleaved in one process, medians of --reps runs):
  scan      update_scale in a jitted lax.scan of --steps steps
  vmap      the same scan over --population independent states (jax.vmap)
  mlp       a jitted SGD step of a small float16 MLP that calls update_scale,
            against the same step without it
  compile   a fresh jit+compile of update_scale alone (one float32 state),
            against a trivial jitted scalar function of the same arguments

Prints per-step costs and ratios; the scan/vmap ratios decide "auto"
(jax_amp_scale.ops.dispatch.DEFAULT_CONFIG).

  python bench/bench_update_scale.py            # full size
  python bench/bench_update_scale.py --tiny     # smoke size
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jax_amp_scale as jas

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness


def scan_fn(backend: str, steps: int, population: int | None):
    found = jnp.asarray(np.random.default_rng(0).random(steps) < 0.001)

    def run(found):
        def body(st, f):
            return jas.update_scale(st, f, backend=backend), None

        st = jas.init_scale_state(growth_interval=100)
        if population is None:
            return jax.lax.scan(body, st, found)[0].scale
        sts = jax.vmap(lambda s: jas.ScaleState(s, jnp.int32(0), 2.0, 0.5, 100))(
            jnp.full((population,), 2.0**16, jnp.float32)
        )

        def vbody(sts, f):
            return jax.vmap(lambda s: jas.update_scale(s, f, backend=backend))(sts), None

        return jax.lax.scan(vbody, sts, found)[0].scale

    f = jax.jit(run)
    return lambda: jax.block_until_ready(f(found))


def mlp_fn(backend: str | None, width: int, batch: int):
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {
        "w1": jax.random.normal(k1, (width, width)) / np.sqrt(width),
        "w2": jax.random.normal(k2, (width, 1)) / np.sqrt(width),
    }
    x = jax.random.normal(k3, (batch, width))
    y = jnp.sum(x, axis=1, keepdims=True)

    def loss(p, scale):
        h = jnp.tanh(x.astype(jnp.float16) @ p["w1"].astype(jnp.float16))
        out = (h @ p["w2"].astype(jnp.float16)).astype(jnp.float32)
        return jnp.mean((out - y) ** 2) * scale

    @jax.jit
    def step(p, st):
        g = jax.grad(loss)(p, st.scale)
        g = jax.tree.map(lambda a: a / st.scale, g)
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(g)]))
        if backend is not None:
            st = jas.update_scale(st, ~finite, backend=backend)
        p = jax.tree.map(lambda a, b: jnp.where(finite, a - 1e-3 * b, a), p, g)
        return p, st

    st = jas.init_scale_state(2.0**10)
    return lambda: jax.block_until_ready(step(params, st))


def trivial_scalar(scale, tracker, found):
    """The compile-time baseline: one select and one add on the same scalars."""
    return jnp.where(found, scale * 0.5, scale), tracker + 1


def compile_fn(backend: str | None, gf: float = 2.0, bf: float = 0.5):
    """A fresh trace, lowering and XLA compile each call (no jit cache hit)."""
    args = (jnp.float32(2.0**16), jnp.int32(0), jnp.bool_(False))

    def run():
        if backend is None:

            def fn(s, t, f):
                return trivial_scalar(s, t, f)
        else:

            def fn(s, t, f):
                return jas.amp_update_scale(
                    s,
                    t,
                    f,
                    growth_factor=gf,
                    backoff_factor=bf,
                    growth_interval=2000,
                    backend=backend,
                )

        jax.jit(fn).lower(*args).compile()

    return run


def main(argv: list[str] | None = None) -> list[_harness.Table]:
    ap = _harness.parser(__doc__.splitlines()[0], reps=7)
    ap.formatter_class = argparse.RawTextHelpFormatter
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--population", type=int, default=1024)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args(argv)
    if args.tiny:
        args.steps, args.population, args.reps, args.width, args.batch = 100, 8, 2, 16, 8
        args.warmup = 1
    backends = list(jas.available_backends())
    auto = jas.auto_backend()
    common = dict(unit="us", reps=args.reps, warmup=args.warmup)
    tables = []

    def per_step(rows, n):
        for r in rows:
            r.times = [t / n for t in r.times]
        return rows

    rows = _harness.measure(
        {b: scan_fn(b, args.steps, None) for b in backends},
        baseline="reference",
        reps=args.reps,
        warmup=args.warmup,
    )
    tables.append(
        _harness.Table(
            workload="4. The operator",
            title=f"update_scale in a jitted lax.scan of {args.steps} steps, one state (per step)",
            baseline="reference",
            rows=per_step(rows, args.steps),
            notes=[f'"auto" picks {auto!r} on {jax.default_backend()}.'],
            **common,
        )
    )
    n = max(args.steps // 10, 1)
    rows = _harness.measure(
        {b: scan_fn(b, n, args.population) for b in backends},
        baseline="reference",
        reps=args.reps,
        warmup=args.warmup,
    )
    tables.append(
        _harness.Table(
            workload="4. The operator",
            title=f"lax.scan of {n} steps, vmap over {args.population} states (per step)",
            baseline="reference",
            rows=per_step(rows, n),
            **common,
        )
    )
    cands = {"plain step": mlp_fn(None, args.width, args.batch)}
    cands.update({f"step + update_scale({b})": mlp_fn(b, args.width, args.batch) for b in backends})
    rows = _harness.measure(cands, baseline="plain step", reps=args.reps * 3, warmup=args.warmup)
    tables.append(
        _harness.Table(
            workload="4. The operator",
            title=f"small MLP training step (width {args.width}, batch {args.batch})",
            baseline="plain step",
            rows=rows,
            unit="us",
            reps=args.reps * 3,
            warmup=args.warmup,
        )
    )
    cands = {"trivial jitted scalar function": compile_fn(None)}
    for b in backends:
        cands[f"update_scale({b}), factors 2.0/0.5"] = compile_fn(b)
    cands["update_scale(reference), factors 1.1/0.3"] = compile_fn("reference", 1.1, 0.3)
    base = "trivial jitted scalar function"
    creps = args.reps * 3
    rows = _harness.measure(cands, baseline=base, reps=creps, warmup=args.warmup)
    tables.append(
        _harness.Table(
            workload="4. The operator",
            title="compile time: update_scale alone, one float32 state (fresh jit each run)",
            baseline=base,
            rows=rows,
            unit="ms",
            reps=creps,
            warmup=args.warmup,
            notes=[
                "Power-of-two factors (the defaults) take exponent arithmetic; "
                "others the exact integer product (jax_amp_scale/reference/product.py)."
            ],
        )
    )
    _harness.finish(args, tables)
    return tables


if __name__ == "__main__":
    main()
