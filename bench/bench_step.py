"""Workload 1: step overhead of loss scaling in a jitted MLP training step.

4 dense 1024x1024 layers, batch 256, float32 master weights; every candidate
in `_steps.py` against the plain step.  The GPU check's tables:
``--models 4096x8x2048 256x4x64 --optimizer adam --compute float16 --torch``
"""

from __future__ import annotations

import _harness
import _steps
import jax
import jax.numpy as jnp
import numpy as np
import optax

OPTIMIZERS = {"sgd": lambda: optax.sgd(1e-3, momentum=0.9), "adam": lambda: optax.adam(1e-3)}


def mlp_loss(compute) -> _steps.LossFn:
    """`compute` matmuls, float32 loss; gradients arrive in float32 (the params' dtype)."""

    def loss(params, batch):
        x, y = batch
        h = x.astype(compute)
        for i, layer in enumerate(params):
            h = h @ layer["w"].astype(compute) + layer["b"].astype(compute)
            h = jax.nn.relu(h) if i < len(params) - 1 else h
        return jnp.mean(jnp.square(h.astype(jnp.float32) - y))

    return loss


def runner(step, carry, data) -> _harness.Candidate:
    """One step, blocking, the carry threaded.  The carry is primed by one
    step first: a state built from Python numbers (weak types) would
    otherwise be traced and compiled again inside the timed runs."""
    box = [jax.block_until_ready(step(carry, data))]

    def run():
        box[0] = jax.block_until_ready(step(box[0], data))

    return run


def run_table(args, width: int, depth: int, batch: int, compute: str) -> _harness.Table:
    """Every candidate's step (or plain and --only these) with `compute`
    matmuls, and torch's with --torch, interleaved."""
    why = _steps.ours_available()
    cands = _steps.candidates(_steps.backends() if why is None else ())
    if args.only:
        if unknown := sorted(set(args.only) - set(cands)):
            raise SystemExit(f"--only: unknown candidates {unknown}; known: {sorted(cands)}")
        cands = {k: v for k, v in cands.items() if k == "plain" or k in args.only}
    kp, kx, ky = jax.random.split(jax.random.PRNGKey(0), 3)
    params = [
        {"w": jax.random.normal(k, (width, width)) / np.sqrt(width), "b": jnp.zeros((width,))}
        for k in jax.random.split(kp, depth)
    ]
    data = (jax.random.normal(kx, (batch, width)), jax.random.normal(ky, (batch, width)))
    runs = {}
    for name, builder in cands.items():
        carry, step = builder(mlp_loss(jnp.dtype(compute)), params, OPTIMIZERS[args.optimizer]())
        runs[name] = runner(jax.jit(step), carry, data)
    if args.torch:
        import bench_torch

        if (device := _harness.torch_device()) is None:
            raise SystemExit(f"--torch: torch cannot run on {jax.default_backend()}")
        runs |= bench_torch.step_candidates(width, depth, batch, compute, args.optimizer, device)
    count = sum(x.size for x in jax.tree.leaves(params))
    opt = "optax.adam(1e-3)" if args.optimizer == "adam" else "optax.sgd(1e-3, momentum=0.9)"
    notes = [] if why is None else [f"our candidates not measured: {why}"]
    notes += [
        f"{count / 1e6:.2f}M parameters ({depth} x dense {width}x{width} + bias), batch {batch}, "
        f"{compute} compute, float32 master weights, {opt}; "
        "each step jitted, carry threaded, blocked on.",
        "optax apply_if_finite has no dynamic scale: a static scale 2**15, unscaled by hand.",
    ]
    if args.torch:
        notes.append(
            "torch rows: the same MLP in torch on the same device, autocast to the compute "
            "dtype, GradScaler(init_scale=2**15); each step synchronised."
        )
    reps, warmup = (1, 1) if args.tiny else (args.reps, args.warmup)
    title = f"MLP {count / 1e6:.1f}M params, batch {batch}, {args.optimizer}, {compute} compute"
    t = _harness.timed_table(
        "1. Step overhead", title, runs, baseline="plain", reps=reps, warmup=warmup, notes=notes
    )
    t.columns = _harness.overhead_ms(t.rows)
    if args.torch:  # torch's rows against torch's plain step
        base = next(r for r in t.rows if r.name.startswith("torch plain"))
        ratios = {r.name: _harness.paired_ratio(r, base) for r in t.rows}
        t.columns["ratio to torch plain"] = {
            k: f"{v:.3f}" for k, v in ratios.items() if k.startswith("torch")
        }
    return t


def main(argv: list[str] | None = None) -> list[_harness.Table]:
    p = _harness.parser(__doc__.splitlines()[0], reps=15)
    dtypes = ["float16", "float32"]
    p.add_argument("--compute", nargs="+", default=dtypes, choices=dtypes)
    p.add_argument("--optimizer", default="sgd", choices=sorted(OPTIMIZERS))
    p.add_argument("--only", nargs="+", metavar="NAME", help="plain and these candidates only")
    p.add_argument("--models", nargs="+", default=["1024x4x256"], metavar="WIDTHxDEPTHxBATCH")
    p.add_argument("--torch", action="store_true", help="also torch's steps, on JAX's device")
    args = p.parse_args(argv)
    tables = []
    for model in ["32x2x8"] if args.tiny else args.models:
        for compute in args.compute:
            tables.append(run_table(args, *(int(v) for v in model.split("x")), compute))
            _harness.save(args, tables)
    _harness.save(args, tables, show=True)
    return tables


if __name__ == "__main__":
    main()
