"""Workload 4, the operator: update_scale's reference against its FFI call
in a lax.scan, vmapped, in a small step, and its compile time."""

from __future__ import annotations

import _harness
import jax
import jax.numpy as jnp
import numpy as np

import jax_amp_scale as jas


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


def compile_fn(backend: str | None, gf: float = 2.0, bf: float = 0.5):
    """A fresh trace, lowering and XLA compile each call (a fresh function: no jit cache
    hit); without a backend the baseline, one select and one add on the same scalars."""
    args = (jnp.float32(2.0**16), jnp.int32(0), jnp.bool_(False))
    kw = dict(growth_factor=gf, backoff_factor=bf, growth_interval=2000, backend=backend)

    def run():
        def fn(s, t, f):
            if backend is None:
                return jnp.where(f, s * 0.5, s), t + 1
            return jas.amp_update_scale(s, t, f, **kw)

        jax.jit(fn).lower(*args).compile()

    return run


def main(argv: list[str] | None = None) -> list[_harness.Table]:
    ap = _harness.parser(__doc__.splitlines()[0], reps=7)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--population", type=int, default=1024)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args(argv)
    if args.tiny:
        args.steps, args.population, args.reps, args.width, args.batch = 100, 8, 2, 16, 8
        args.warmup = 1
    backends, w, n = list(jas.available_backends()), "4. The operator", max(args.steps // 10, 1)
    steps = {"plain step": mlp_fn(None, args.width, args.batch)}
    steps |= {f"step + update_scale({b})": mlp_fn(b, args.width, args.batch) for b in backends}
    trivial = "trivial jitted scalar function"
    compiles = {trivial: compile_fn(None)}
    compiles |= {f"update_scale({b}), factors 2.0/0.5": compile_fn(b) for b in backends}
    compiles["update_scale(reference), factors 1.1/0.3"] = compile_fn("reference", 1.1, 0.3)
    auto = f'"auto" picks {jas.auto_backend()!r} on {jax.default_backend()}.'
    factors = (
        "Power-of-two factors (the defaults) take exponent arithmetic; "
        "others the exact integer product."
    )
    titles = [
        f"update_scale in a jitted lax.scan of {args.steps} steps, one state (per step)",
        f"lax.scan of {n} steps, vmap over {args.population} states (per step)",
        f"small MLP training step (width {args.width}, batch {args.batch})",
        "compile time: update_scale alone, one float32 state (fresh jit each run)",
    ]
    one = {b: scan_fn(b, args.steps, None) for b in backends}
    many = {b: scan_fn(b, n, args.population) for b in backends}
    specs = [  # candidates, baseline, repetitions, unit, steps per sample, notes
        (one, "reference", args.reps, "us", args.steps, [auto]),
        (many, "reference", args.reps, "us", n, []),
        (steps, "plain step", args.reps * 3, "us", 1, []),
        (compiles, trivial, args.reps * 3, "ms", 1, [factors]),
    ]
    tables = []
    for title, (cands, base, reps, unit, per, notes) in zip(titles, specs, strict=True):
        t = _harness.timed_table(
            w, title, cands, baseline=base, reps=reps, warmup=args.warmup, unit=unit, notes=notes
        )
        for r in t.rows:
            r.times = [x / per for x in r.times]
        tables.append(t)
    _harness.save(args, tables, show=True)
    return tables


if __name__ == "__main__":
    main()
