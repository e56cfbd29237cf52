"""Workload 1: step overhead of loss scaling in a jitted MLP training step.

An MLP of about 4.2M parameters (4 dense layers 1024x1024 with biases),
batch 256, float32 master weights cast to the compute dtype for the matmuls
(float16, and float32: one table each, --compute), a float32
mean-squared-error loss and SGD with momentum (or adam: --optimizer adam).  Every candidate runs the same
model and optimizer; each is reported as a ratio to the plain step (no
scaling), from repetitions interleaved in this one process.

    python bench/bench_step.py            # full size
    python bench/bench_step.py --tiny     # smoke: tiny MLP, one repetition
    python bench/bench_step.py --compute float32 --optimizer adam \
        --only "ours loss_scaled[auto]" --reps 150   # issue 25's ratio
    python bench/bench_step.py --models 4096x8x2048 256x4x64 --optimizer adam \
        --compute float16 --torch                     # the GPU check's tables
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness
import _steps


def init_mlp(key: jax.Array, width: int, depth: int) -> list[dict[str, jax.Array]]:
    keys = jax.random.split(key, depth)
    return [
        {
            "w": jax.random.normal(k, (width, width), jnp.float32) / np.sqrt(width),
            "b": jnp.zeros((width,), jnp.float32),
        }
        for k in keys
    ]


def mlp_loss(compute: jnp.dtype) -> _steps.LossFn:
    """`compute` matmuls, float32 loss; gradients arrive in float32 (the params' dtype)."""

    def loss(params: list[dict[str, jax.Array]], batch: tuple[jax.Array, jax.Array]) -> jax.Array:
        x, y = batch
        h = x.astype(compute)
        for i, layer in enumerate(params):
            h = h @ layer["w"].astype(compute) + layer["b"].astype(compute)
            if i < len(params) - 1:
                h = jax.nn.relu(h)
        return jnp.mean(jnp.square(h.astype(jnp.float32) - y))

    return loss


def n_params(params) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


OPTIMIZERS = {
    "sgd": lambda: optax.sgd(1e-3, momentum=0.9),
    "adam": lambda: optax.adam(1e-3),
}


def build(
    width: int,
    depth: int,
    batch: int,
    steps: dict[str, _steps.Builder],
    compute,
    optimizer: str = "sgd",
):
    """name -> (jitted step, initial carry), plus the batch and the param count."""
    kp, kx, ky = jax.random.split(jax.random.PRNGKey(0), 3)
    params = init_mlp(kp, width, depth)
    data = (
        jax.random.normal(kx, (batch, width), jnp.float32),
        jax.random.normal(ky, (batch, width), jnp.float32),
    )
    opt = OPTIMIZERS[optimizer]()
    built = {}
    for name, builder in steps.items():
        carry, step = builder(mlp_loss(compute), params, opt)
        built[name] = (jax.jit(step), carry)
    return built, data, n_params(params)


def runner(step, carry, data):
    """A candidate for `_harness.measure`: one step, blocking, carry threaded.

    The carry is primed by one step first: a state built from Python numbers
    (weak types) would otherwise be traced and compiled twice, the second
    time inside the timed runs.
    """
    box = [jax.block_until_ready(step(carry, data))]

    def run():
        box[0] = jax.block_until_ready(step(box[0], data))

    return run


def torch_rows(args, model: tuple[int, int, int], compute: str) -> dict:
    """torch's plain and GradScaler steps on JAX's device, with --torch."""
    if not args.torch:
        return {}
    import bench_torch

    device = _harness.torch_device()
    if device is None:
        raise SystemExit(f"--torch: torch cannot run on {jax.default_backend()}")
    return bench_torch.step_candidates(*model, compute, args.optimizer, device)


def vs(rows, base_prefix: str) -> dict[str, str]:
    """torch rows' paired ratio to torch's plain step."""
    base = next((r for r in rows if r.name.startswith(base_prefix)), None)
    if base is None:
        return {}
    return {
        r.name: f"{_harness.paired_ratio(r, base):.3f}" for r in rows if r.name.startswith("torch")
    }


def run_table(args, model: tuple[int, int, int], backends, why, compute: str) -> _harness.Table:
    """Every candidate's step (or --only these and plain) on `model` (width,
    depth, batch) with `compute` matmuls, and torch's with --torch, interleaved."""
    (width, depth, batch), optimizer = model, args.optimizer
    reps, warmup = (1, 1) if args.tiny else (args.reps, args.warmup)
    notes = [] if why is None else [f"our candidates not measured: {why}"]
    cands = _steps.candidates(backends)
    if args.only:
        unknown = sorted(set(args.only) - set(cands))
        if unknown:
            raise SystemExit(f"--only: unknown candidates {unknown}; known: {sorted(cands)}")
        cands = {k: v for k, v in cands.items() if k == "plain" or k in args.only}
    built, data, count = build(width, depth, batch, cands, jnp.dtype(compute), optimizer)
    runs = {name: runner(step, carry, data) for name, (step, carry) in built.items()}
    rows = _harness.measure(
        {**runs, **torch_rows(args, model, compute)}, baseline="plain", reps=reps, warmup=warmup
    )
    base = rows[0].median
    overhead = {r.name: f"{(r.median - base) * 1e3:+.2f}" for r in rows}
    columns = {"overhead (ms)": overhead}
    if args.torch:
        columns["ratio to torch plain"] = vs(rows, "torch plain")
    notes.append(
        f"{count / 1e6:.2f}M parameters ({depth} x dense {width}x{width} + bias), batch {batch}, "
        f"{compute} compute, float32 master weights, "
        f"{'optax.adam(1e-3)' if optimizer == 'adam' else 'optax.sgd(1e-3, momentum=0.9)'}; "
        "each step jitted, carry threaded, blocked on."
    )
    notes.append(
        "optax apply_if_finite has no dynamic scale: a static scale 2**15, unscaled by hand."
    )
    if args.torch:
        notes.append(
            "torch rows: the same MLP in torch on the same device, autocast to the compute "
            "dtype, GradScaler(init_scale=2**15); each step synchronised."
        )
    return _harness.Table(
        workload="1. Step overhead",
        title=f"MLP {count / 1e6:.1f}M params, batch {batch}, {optimizer}, {compute} compute",
        baseline="plain",
        rows=rows,
        unit="ms",
        reps=reps,
        warmup=warmup,
        notes=notes,
        columns=columns,
    )


def main(argv: list[str] | None = None) -> list[_harness.Table]:
    p = _harness.parser(__doc__.splitlines()[0], reps=15)
    p.add_argument(
        "--compute",
        nargs="+",
        default=["float16", "float32"],
        choices=["float16", "float32"],
        help="compute dtypes, one table each (default float16 float32)",
    )
    p.add_argument(
        "--optimizer", default="sgd", choices=sorted(OPTIMIZERS), help="default sgd (momentum)"
    )
    p.add_argument(
        "--only", nargs="+", metavar="NAME", help="measure plain and these candidates only"
    )
    p.add_argument(
        "--models",
        nargs="+",
        default=["1024x4x256"],
        metavar="WIDTHxDEPTHxBATCH",
        help="MLPs, one table each per compute dtype (default 1024x4x256)",
    )
    p.add_argument(
        "--torch",
        action="store_true",
        help="also torch's plain and GradScaler steps, on JAX's device, in the same table",
    )
    args = p.parse_args(argv)
    models = ["32x2x8"] if args.tiny else args.models
    why = _steps.ours_available()
    backends = _steps.backends() if why is None else ()
    tables = []
    for model in models:
        width, depth, batch = (int(v) for v in model.split("x"))
        for compute in args.compute:
            tables.append(run_table(args, (width, depth, batch), backends, why, compute))
            _harness.save(args, tables)
    _harness.finish(args, tables)
    return tables


if __name__ == "__main__":
    main()
