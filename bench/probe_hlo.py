"""Why a target is missed: the optimized HLO of each step, counted.

For the workload-3 step (`bench_compile.py`) at a few leaf counts, compiles
each candidate once and prints what XLA made of it: kernels (fusions),
reduction kernels, the largest fusion's operand count, optimized-HLO lines
and the compile time.  A fusion whose operand count grows with the number of
leaves means a value (the overflow flag) was recomputed inside every
per-leaf kernel: compile time then grows with the square of the tree.  It
also times compiling N per-leaf reductions alone against N elementwise
kernels, the per-kernel cost XLA:CPU pays for each leaf's finiteness check,
what an exact skip (a select per leaf) adds to compiling a plain momentum
step, what each part of `loss_scaled` adds to the step's compile (one part
switched on after another), and what one conditional costs to compile.

    python bench/probe_hlo.py                 # 10 and 100 leaves
    python bench/probe_hlo.py --leaves 20     # one size
    python bench/probe_hlo.py --dump DIR      # also write each optimized HLO
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _steps
import bench_compile

_FUSION_HEAD = re.compile(r"^%\S+ \((.*)\) -> ")


def hlo_stats(text: str) -> dict[str, int]:
    entry = text.split("\nENTRY ", 1)[-1]
    max_operands = 0
    for line in text.splitlines():
        m = _FUSION_HEAD.match(line)
        if m and line.startswith("%fused"):
            max_operands = max(max_operands, m.group(1).count(": "))
    return {
        "kernels": entry.count(" fusion(") + entry.count(" dot(") + entry.count(" custom-call("),
        # reduce ops, inside fused computations or not (one per reduction kernel)
        "reductions": text.count(" reduce(") + text.count(" reduce-window("),
        "max fusion operands": max_operands,
        "HLO lines": len(text.splitlines()),
    }


def compile_step(builder, n: int):
    params = bench_compile.make_params(n)
    batch = bench_compile.MODELS["tree"].make_batch()
    carry, step = builder(bench_compile.leafy_loss, params, optax.sgd(1e-3, momentum=0.9))
    leaves, treedef = jax.tree.flatten(carry)

    def flat_step(leaves, batch):
        return jax.tree.leaves(step(jax.tree.unflatten(treedef, leaves), batch))

    lowered = jax.jit(flat_step).lower(leaves, batch)
    t0 = time.perf_counter()
    compiled = lowered.compile()
    return compiled.as_text(), time.perf_counter() - t0


def kernel_cost(n: int) -> dict[str, float]:
    """Compile seconds for n per-leaf kernels of each kind, 16 floats a leaf."""
    xs = [jnp.ones((bench_compile.LEAF,), jnp.float32) for _ in range(n)]
    kinds = {
        "elementwise x*s": lambda xs: [x * 0.5 for x in xs],
        "all(isfinite(x)) per leaf": lambda xs: jnp.all(
            jnp.stack([jnp.all(jnp.isfinite(x)) for x in xs])
        ),
        "sum(x - x) per leaf": lambda xs: jnp.sum(jnp.stack([jnp.sum(x - x) for x in xs])) == 0,
    }
    out = {}
    for name, fn in kinds.items():
        lowered = jax.jit(fn).lower(xs)
        t0 = time.perf_counter()
        lowered.compile()
        out[name] = time.perf_counter() - t0
    return out


def momentum_step(skip: str):
    """A plain momentum step over leaves (no custom call, no scaling), with
    the update skipped by `skip`: "none", "select" (lax.select per leaf, as
    loss_scaled's skip) or "bit blend" (the same choice made on the bits)."""

    def blend(flag, old, new):
        # new where not flag, old where flag, on the int32 bits: exact too.
        mask = -flag.astype(jnp.int32)
        o, n = (jax.lax.bitcast_convert_type(x, jnp.int32) for x in (old, new))
        return jax.lax.bitcast_convert_type(n ^ ((n ^ o) & mask), jnp.float32)

    def step(params, moms, batch, flag_source):
        flag = flag_source > 0  # known only at run time
        out_p, out_m = [], []
        for p, m in zip(params, moms, strict=True):
            new_m = 0.9 * m + jnp.tanh(p * batch) * batch
            u = -1e-3 * new_m
            if skip == "select":
                new_m = jax.lax.select(flag, m, new_m)
                u = jax.lax.select(flag, jnp.zeros_like(u), u)
            elif skip == "bit blend":
                new_m, u = blend(flag, m, new_m), blend(flag, jnp.zeros_like(u), u)
            out_p.append(p + u)
            out_m.append(new_m)
        return out_p, out_m

    return step


def skip_cost(n: int, reps: int = 5) -> dict[str, float]:
    """Median XLA compile seconds of `momentum_step` with n leaves, per skip,
    fresh compiles interleaved."""
    params = [jnp.full((bench_compile.LEAF,), 0.01 * (i % 7 + 1)) for i in range(n)]
    moms = [jnp.zeros((bench_compile.LEAF,)) for _ in range(n)]
    batch = jnp.linspace(-1.0, 1.0, bench_compile.LEAF)
    times: dict[str, list[float]] = {"none": [], "select": [], "bit blend": []}
    for _ in range(reps):
        for skip in times:
            step = momentum_step(skip)
            lowered = jax.jit(lambda *a, step=step: step(*a)).lower(
                params, moms, batch, jnp.float32(1)
            )
            t0 = time.perf_counter()
            lowered.compile()
            times[skip].append(time.perf_counter() - t0)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def unscale_only(loss_fn, params, opt):
    """The plain step with the fused pass added, nothing else of loss_scaled."""
    import jax_amp_scale as jas

    def step(carry, batch):
        params, opt_state = carry
        grads = jax.grad(lambda p: loss_fn(p, batch) * _steps.INIT_SCALE)(params)
        grads, _ = jas.unscale_and_check(grads, jas.init_scale_state(_steps.INIT_SCALE))
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return (params, opt.init(params)), step


PARTS = {
    "plain step": _steps.plain,
    "+ unscale_and_check (fused pass)": unscale_only,
    # loss_scaled compiles its skip whatever the scaler's drop_overflow_update
    # says (the decision is data), so the scale update, the counters and the
    # skip are one part.
    "+ update_scale, the counters and the skip": _steps.ours("auto", host_reports=False),
    "+ the overflow report (loss_scaled's default)": _steps.ours("auto"),
}


def parts_cost(n: int, reps: int = 9) -> dict[str, tuple[float, float]]:
    """(median seconds, median paired ratio to the plain step) of a fresh
    trace+lower+compile of the step, each part of loss_scaled added in turn."""
    params = bench_compile.make_params(n)
    batch = bench_compile.MODELS["tree"].make_batch()
    times: dict[str, list[float]] = {k: [] for k in PARTS}
    for b in PARTS.values():  # warm-up: jax's own first-use costs
        bench_compile.compile_once(b, params, batch)
    for _ in range(reps):
        for name, b in PARTS.items():
            times[name].append(sum(bench_compile.compile_once(b, params, batch)))
    base = times["plain step"]
    return {
        k: (statistics.median(v), statistics.median(a / b for a, b in zip(v, base, strict=True)))
        for k, v in times.items()
    }


def conditional_cost(reps: int = 9) -> dict[str, float]:
    """Median XLA compile seconds of a small function, bare or with one
    conditional (a real branch or a host callback) or one callback."""
    x = jnp.ones((bench_compile.LEAF,), jnp.float32)

    def body(x, variant):
        found = jnp.any(x > 3)  # known only at run time
        if variant == "lax.cond, a scalar branch":
            found = jax.lax.cond(found, lambda: jnp.sum(x) > 1, lambda: jnp.bool_(False))
        elif variant == "jax.debug.callback, every step":
            jax.debug.callback(lambda f: None, found)
        elif variant == "lax.cond around jax.debug.callback":
            jax.lax.cond(found, lambda: jax.debug.callback(lambda f: None, found), lambda: None)
        return x * 2, found

    variants = [
        "none",
        "lax.cond, a scalar branch",
        "jax.debug.callback, every step",
        "lax.cond around jax.debug.callback",
    ]
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(reps + 1):
        for v in variants:
            lowered = jax.jit(lambda x, v=v: body(x, v)).lower(x)
            t0 = time.perf_counter()
            lowered.compile()
            times[v].append(time.perf_counter() - t0)
    return {k: statistics.median(v[1:]) for k, v in times.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leaves", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--dump", metavar="DIR", help="write each optimized HLO here")
    args = ap.parse_args(argv)
    why = _steps.ours_available()
    builders = _steps.candidates(("auto", "reference") if why is None else ())
    if why is not None:
        print(f"ours not probed: {why}")
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    for n in args.leaves:
        print(f"\n#### step with {n} parameter leaves\n")
        print(
            "| candidate | kernels | reductions | max fusion operands | HLO lines | compile (s) |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for name, b in builders.items():
            text, secs = compile_step(b, n)
            s = hlo_stats(text)
            print(
                f"| {name} | {s['kernels']} | {s['reductions']} | {s['max fusion operands']} "
                f"| {s['HLO lines']} | {secs:.2f} |",
                flush=True,
            )
            if args.dump:
                Path(args.dump).mkdir(parents=True, exist_ok=True)
                safe = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")
                (Path(args.dump) / f"{safe}_{n}.hlo.txt").write_text(text)
    n = max(args.leaves)
    print(f"\n#### compiling {n} per-leaf kernels alone\n")
    print("| kernel per leaf | compile (s) | per leaf (ms) |")
    print("|---|---:|---:|")
    for name, secs in kernel_cost(n).items():
        print(f"| {name} | {secs:.2f} | {secs / n * 1e3:.1f} |")
    print(f"\n#### an exact skip in a plain momentum step, {n} leaves (XLA compile)\n")
    print("| skip | compile (s) | ratio to none |")
    print("|---|---:|---:|")
    costs = skip_cost(n)
    for name, secs in costs.items():
        print(f"| {name} | {secs:.3f} | {secs / costs['none']:.2f} |")
    if why is not None:
        return
    n = min(args.leaves)
    print(f"\n#### loss_scaled's parts, one added after another, {n} leaves\n")
    print("Fresh trace+lower+compile, interleaved; ratio paired per repetition.\n")
    print("| step | compile (s) | ratio to plain |")
    print("|---|---:|---:|")
    for name, (secs, ratio) in parts_cost(n).items():
        print(f"| {name} | {secs:.3f} | {ratio:.2f} |", flush=True)
    print("\n#### one conditional (XLA compile of a 16-float function)\n")
    print("| added | compile (s) | added (ms) |")
    print("|---|---:|---:|")
    cond = conditional_cost()
    for name, secs in cond.items():
        print(f"| {name} | {secs:.4f} | {(secs - cond['none']) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
