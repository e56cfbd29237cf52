"""Why our step beats the plain one on XLA:CPU: where the gradient's transpose runs.

In the workload-1 MLP a weight gradient leaves its dot transposed (and
rounded through float16).  In the plain step XLA fuses that transpose into
the optimizer's elementwise kernel (``momentum * 0.9 + grad``), whose loop
then reads the gradient with a 4 KiB stride.  In our step the native
unscale-and-check call needs the gradient in memory, so the transpose runs
alone, as a copy kernel, and the optimizer's kernel reads contiguously.
This times the two shapes of the same work side by side:

- ``fused``: ``0.9 * m + g`` with the transposed gradient ``g`` fused in;
- ``copy, native pass, update``: our step's shape: ``g`` goes through
  ``unscale_and_check`` (the native in-place call needs it in memory, so
  the transpose runs as its own copy kernel), then ``0.9 * m + g``;
- ``transpose copy alone`` and ``dot alone``: the parts.

    python bench/probe_transpose.py [--reps 30]
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness

WIDTH, BATCH = 1024, 256


def _gradient(a: jax.Array, b: jax.Array) -> jax.Array:
    # The weight gradient as the MLP step forms it: dot, float16, transposed.
    return jnp.dot(a.T, b).astype(jnp.float16).astype(jnp.float32).T


def _through_native_pass(x: jax.Array) -> jax.Array:
    import jax_amp_scale as jas

    (u,), _ = jas.unscale_and_check([x], jas.init_scale_state(2.0), backend="ffi")
    return u


def candidates(width: int, batch: int) -> dict[str, _harness.Candidate]:
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(ka, (batch, width), jnp.float32)
    b = jax.random.normal(kb, (batch, width), jnp.float32)
    m = jnp.ones((width, width), jnp.float32)
    fns = {
        "fused": lambda m, a, b: 0.9 * m + _gradient(a, b),
        "copy, native pass, update": lambda m, a, b: (
            0.9 * m + _through_native_pass(_gradient(a, b))
        ),
        "transpose copy alone": lambda m, a, b: _gradient(a, b),
        "dot alone": lambda m, a, b: jnp.dot(a.T, b),
    }
    out: dict[str, _harness.Candidate] = {}
    for name, fn in fns.items():
        jitted = jax.jit(fn)
        out[name] = lambda f=jitted: jax.block_until_ready(f(m, a, b))
    return out


def main(argv: list[str] | None = None) -> list[_harness.Table]:
    p = _harness.parser(__doc__.splitlines()[0], reps=30)
    args = p.parse_args(argv)
    width, batch = (32, 8) if args.tiny else (WIDTH, BATCH)
    reps, warmup = (1, 1) if args.tiny else (args.reps, args.warmup)
    rows = _harness.measure(candidates(width, batch), baseline="fused", reps=reps, warmup=warmup)
    table = _harness.Table(
        workload="probe",
        title=f"transposed {width}x{width} gradient into a momentum update",
        baseline="fused",
        rows=rows,
        unit="ms",
        reps=reps,
        warmup=warmup,
        notes=["each candidate jitted; one call per sample, blocked on"],
    )
    _harness.finish(args, [table])
    return [table]


if __name__ == "__main__":
    main()
