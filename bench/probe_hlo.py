"""Why a target is missed: the optimized HLO of each step, counted.

For the workload-3 step (`bench_compile.py`) at a few leaf counts, compiles
each candidate once and prints what XLA made of it: kernels (fusions),
reduction kernels, the largest fusion's operand count, optimized-HLO lines
and the compile time.  A fusion whose operand count grows with the number of
leaves means a value (the overflow flag) was recomputed inside every
per-leaf kernel: compile time then grows with the square of the tree.  It
also times compiling N per-leaf reductions alone against N elementwise
kernels, the per-kernel cost XLA:CPU pays for each leaf's finiteness check.

    python bench/probe_hlo.py                 # 10 and 100 leaves
    python bench/probe_hlo.py --leaves 20     # one size
    python bench/probe_hlo.py --dump DIR      # also write each optimized HLO
"""

from __future__ import annotations

import argparse
import re
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
    batch = jnp.linspace(-1.0, 1.0, bench_compile.LEAF, dtype=jnp.float32)
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


if __name__ == "__main__":
    main()
