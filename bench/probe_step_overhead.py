"""Where the default step's overhead over the plain step goes (adam, float32).

Workload 1's MLP with ``optax.adam(1e-3)``, float32 compute.  Each variant
adds one piece to the plain step, all interleaved in this one process:

- ``multiply by 1/scale``: the plain step on scaled gradients, unscaled by
  a multiply XLA fuses into adam's kernels (no check, no skip);
- ``check, flag unused by the update``: each gradient's finiteness reduced
  by XLA and the flag fed only to `update_scale`, so the optimizer's
  kernels do not wait for it;
- ``check, flag selects the update``: the same check, and the skip as
  `loss_scaled` applies it (one select per leaf inside adam's kernels), so
  every optimizer kernel waits for the last gradient's check;
- ``native pass, flag selects the update``: the same with the native
  in-place pass;
- ``native pass, lax.cond skips the update``: the skip as one ``lax.cond``
  around the optimizer's update instead (optax's ``apply_if_finite`` shape);
- ``loss_scaled, host_reports=False`` and ``loss_scaled (default)``.

And a second table: one jitted elementwise function with and without a
``jax.debug.callback`` in a branch that never runs, timing the call's
return (dispatch) and its completion: a program holding a host callback is
run by JAX's Python path, synchronously (the call returns when it is done).

    python bench/probe_step_overhead.py [--reps 100]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness
import _steps
import bench_step

import jax_amp_scale as jas
from jax_amp_scale.reference.gradient_pass import leaf_finite


def _xla_check(grads) -> jax.Array:
    return jnp.logical_not(jnp.all(jnp.stack([leaf_finite(g) for g in jax.tree.leaves(grads)])))


def variant(check: str, flag_skips: bool | str) -> _steps.Builder:
    """The plain step plus unscaling by a fused multiply and, unless `check` is
    "none", a finiteness check ("xla" or "native") whose flag advances the
    scale and, when `flag_skips`, selects the update as `loss_scaled` does
    (or, when it is "cond", skips it with a lax.cond)."""

    def build(loss_fn, params, opt):
        def step(carry, batch):
            params, opt_state, scale = carry
            grads = jax.grad(lambda p: loss_fn(p, batch) * scale.scale)(params)
            found = jnp.bool_(False)
            if check == "native":
                grads, found = jas.unscale_and_check(grads, scale, backend="ffi")
            else:
                if check == "xla":
                    found = _xla_check(grads)
                inv = 1.0 / scale.scale
                grads = jax.tree.map(lambda g: g * inv, grads)
            if flag_skips == "cond":

                def skip():
                    updates, _ = opt.update(grads, opt_state, params)
                    return jax.tree.map(jnp.zeros_like, updates), opt_state

                def apply():
                    return opt.update(grads, opt_state, params)

                updates, new_state = jax.lax.cond(found, skip, apply)
            else:
                updates, new_state = opt.update(grads, opt_state, params)
            if flag_skips is True:
                zero = jax.tree.map(jnp.zeros_like, updates)
                updates = jax.tree.map(lambda z, u: jax.lax.select(found, z, u), zero, updates)
                new_state = jax.tree.map(
                    lambda o, n: jax.lax.select(found, jnp.asarray(o), jnp.asarray(n)),
                    opt_state,
                    new_state,
                )
            return optax.apply_updates(params, updates), new_state, jas.update_scale(scale, found)

        return (params, opt.init(params), jas.init_scale_state(_steps.INIT_SCALE)), step

    return build


CANDIDATES: dict[str, _steps.Builder] = {
    "plain": _steps.plain,
    "multiply by 1/scale": variant("none", flag_skips=False),
    "check, flag unused by the update": variant("xla", flag_skips=False),
    "check, flag selects the update": variant("xla", flag_skips=True),
    "native pass, flag selects the update": variant("native", flag_skips=True),
    "native pass, lax.cond skips the update": variant("native", flag_skips="cond"),
    "loss_scaled, host_reports=False": _steps.ours("auto", host_reports=False),
    "loss_scaled (default)": _steps.ours("auto"),
}


def step_table(width: int, depth: int, batch: int, reps: int, warmup: int) -> _harness.Table:
    built, data, count = bench_step.build(
        width, depth, batch, CANDIDATES, jnp.dtype(jnp.float32), "adam"
    )
    runs = {name: bench_step.runner(step, carry, data) for name, (step, carry) in built.items()}
    rows = _harness.measure(runs, baseline="plain", reps=reps, warmup=warmup)
    return _harness.Table(
        workload="1. Step overhead, decomposed",
        title=f"MLP {count / 1e6:.1f}M params, batch {batch}, float32 compute, adam",
        baseline="plain",
        rows=rows,
        unit="ms",
        reps=reps,
        warmup=warmup,
        notes=["each variant adds one piece to the plain step; see the module docstring"],
    )


def _ignore(*args: object) -> None:
    del args


def _elementwise(x: jax.Array) -> jax.Array:
    return (x + 1) * 2 - 1


def _elementwise_with_callback(x: jax.Array) -> jax.Array:
    never = x[0] < -jnp.inf
    jax.lax.cond(never, lambda: jax.debug.callback(_ignore, x[0]), lambda: None)
    return _elementwise(x)


def callback_table(n: int, reps: int) -> _harness.Table:
    x = jnp.ones(n, jnp.float32)
    fns = {
        "elementwise": jax.jit(_elementwise),
        "elementwise + never-run host callback": jax.jit(_elementwise_with_callback),
    }
    for f in fns.values():
        f(x).block_until_ready()
    dispatch: dict[str, list[float]] = {name: [] for name in fns}
    total: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, f in fns.items():
            t0 = time.perf_counter()
            y = f(x)
            t1 = time.perf_counter()
            y.block_until_ready()
            t2 = time.perf_counter()
            dispatch[name].append(t1 - t0)
            total[name].append(t2 - t0)
    base = np.array(total["elementwise"])
    rows = [
        _harness.Row(
            name=name,
            times=total[name],
            ratios=list(np.array(total[name]) / base),
        )
        for name in fns
    ]
    return _harness.Table(
        workload="1. Step overhead, decomposed",
        title=f"a host callback in the program: {n / 1e6:g}M float32 elementwise",
        baseline="elementwise",
        rows=rows,
        unit="ms",
        reps=reps,
        warmup=1,
        notes=["'call returns after': the median time until the jitted call returns, unblocked"],
        columns={
            "call returns after (ms)": {
                name: f"{np.median(dispatch[name]) * 1e3:.2f}" for name in fns
            }
        },
    )


def main() -> None:
    args = _harness.parser(__doc__.splitlines()[0], reps=100).parse_args()
    if args.tiny:
        tables = [step_table(64, 2, 8, 1, 0), callback_table(1000, 1)]
    else:
        tables = [step_table(1024, 4, 256, args.reps, args.warmup), callback_table(16_000_000, 30)]
    _harness.finish(args, tables)


if __name__ == "__main__":
    main()
