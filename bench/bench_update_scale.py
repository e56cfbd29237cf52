"""The operator itself: reference lowering vs FFI custom call, side by side.

Workloads (each timed interleaved in one process, medians of --reps runs):
  scan      update_scale in a jitted lax.scan of --steps steps
  vmap      the same scan over --population independent states (jax.vmap)
  mlp       a jitted SGD step of a small float16 MLP that calls update_scale,
            against the same step without it

Prints per-step costs and ratios; the scan/vmap ratios decide "auto"
(jax_amp_scale._core.AUTO_PREFERS_FFI).

  python bench/bench_update_scale.py            # full size
  python bench/bench_update_scale.py --tiny     # smoke size
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import jax_amp_scale as jas


def timeit(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def interleaved(cands: dict[str, Callable[[], object]], reps: int) -> dict[str, list[float]]:
    for fn in cands.values():  # compile + warm up
        jax.block_until_ready(fn())
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {k: [] for k in cands}
    for _ in range(reps):
        for k, fn in cands.items():
            times[k].append(timeit(fn))
    return times


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
    return lambda: f(found)


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
    return lambda: step(params, st)


def report(title: str, times: dict[str, list[float]], per: int, base: str) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n## {title}")
    print(f"| candidate | median us/step | min | max | ratio to {base} |")
    print("|---|---|---|---|---|")
    for k, v in times.items():
        print(
            f"| {k} | {med[k] / per * 1e6:.3f} | {min(v) / per * 1e6:.3f} | "
            f"{max(v) / per * 1e6:.3f} | {med[k] / med[base]:.3f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--population", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--tiny", action="store_true", help="smoke-test sizes")
    args = ap.parse_args()
    if args.tiny:
        args.steps, args.population, args.reps, args.width, args.batch = 100, 8, 2, 16, 8

    print(
        f"# bench_update_scale on {platform.processor() or platform.machine()}, "
        f"{jax.devices()[0].device_kind}, jax {jax.__version__}, "
        f"jax_amp_scale {jas.__version__}, backends {jas.available_backends()}"
    )
    backends = list(jas.available_backends())

    t = interleaved({b: scan_fn(b, args.steps, None) for b in backends}, args.reps)
    report(f"lax.scan of {args.steps} steps, one state", t, args.steps, "reference")

    t = interleaved({b: scan_fn(b, args.steps // 10, args.population) for b in backends}, args.reps)
    report(
        f"lax.scan of {args.steps // 10} steps, vmap over {args.population} states",
        t,
        args.steps // 10,
        "reference",
    )

    cands = {"plain step": mlp_fn(None, args.width, args.batch)}
    cands.update({f"step + update_scale({b})": mlp_fn(b, args.width, args.batch) for b in backends})
    t = interleaved(cands, args.reps * 3)
    report(f"MLP training step (width {args.width}, batch {args.batch})", t, 1, "plain step")


if __name__ == "__main__":
    main()
