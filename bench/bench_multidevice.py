"""Workload 7: a training step on eight virtual CPU devices.

Plain against the reference and native passes, then the pass alone against
a copy; ``fsdp`` (weights sharded) and ``data_parallel`` layouts.
"""

from __future__ import annotations

import os

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}=8".strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import Table, parser, save, timed_table  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_amp_scale as jas  # noqa: E402

LR = 1e-3


def _params(width: int, depth: int, seed: int = 0) -> dict[str, jax.Array]:
    rng = np.random.default_rng(seed)
    out = {}
    for k in range(depth):
        out[f"w{k}"] = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        out[f"b{k}"] = np.zeros((width,), np.float32)
    return out


def _loss(params: dict[str, jax.Array], x: jax.Array, depth: int, gather: bool) -> jax.Array:
    h = x
    for k in range(depth):
        w, b = params[f"w{k}"], params[f"b{k}"]
        if gather:  # FSDP: the layer's weights gathered for its use
            w = jax.lax.with_sharding_constraint(w, P())
            b = jax.lax.with_sharding_constraint(b, P())
        h = jnp.tanh(h @ w + b)
    return jnp.mean(h**2)


def _steps(depth: int, gather: bool) -> dict[str, object]:
    def plain(params, x, state):
        grads = jax.grad(_loss)(params, x, depth, gather)
        return jax.tree.map(lambda p, g: p - LR * g, params, grads), state

    def scaled(backend):
        def step(params, x, state):
            grads = jax.grad(lambda p: _loss(p, x, depth, gather) * state.scale)(params)
            grads, found = jas.unscale_and_check(grads, state, backend=backend)
            new = jax.tree.map(lambda p, g: jnp.where(found, p, p - LR * g), params, grads)
            return new, jas.update_scale(state, found, backend=backend)

        return step

    return {"plain": plain, "reference": scaled("reference"), "native": scaled("ffi")}


NOTES = [
    "8 virtual CPU devices sharing this machine's cores "
    "(XLA_FLAGS=--xla_force_host_platform_device_count=8)",
    "fsdp: weights sharded P('d') on their first axis; data_parallel: replicated; "
    "the batch sharded P('d') in both",
]


def _table(layout: str, width: int, depth: int, batch: int, args) -> Table:
    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
    fsdp = layout == "fsdp"
    host = _params(width, depth)
    with jax.sharding.use_mesh(mesh) if hasattr(jax.sharding, "use_mesh") else mesh:
        params = jax.device_put(host, NamedSharding(mesh, P("d") if fsdp else P()))
        x = np.random.default_rng(1).standard_normal((batch, width)).astype(np.float32)
        x = jax.device_put(x, NamedSharding(mesh, P("d")))
        state = jax.device_put(jas.init_scale_state(2.0**10), NamedSharding(mesh, P()))
        candidates = {}
        for name, fn in _steps(depth, gather=fsdp).items():
            step = jax.jit(fn)
            step(params, x, state)  # compile
            candidates[name] = lambda step=step: jax.block_until_ready(step(params, x, state))
        n = sum(v.size for v in host.values()) / 1e6
        title = f"{layout}: MLP {n:.1f}M float32 params ({depth}x{width}), batch {batch}"
        return _timed(title, candidates, "plain", args, NOTES)


def _pass_table(layout: str, width: int, depth: int, args) -> Table:
    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
    host = _params(width, depth, seed=2)
    sharding = NamedSharding(mesh, P("d") if layout == "fsdp" else P())
    # Scale 1: the values stay put however many samples run (no drift into
    # subnormals); the passes multiply by the inverse all the same.
    fns = {
        "copy (-g)": lambda g: (jax.tree.map(lambda x: -x, g), jnp.array(False)),
        "reference": lambda g: jas.unscale_and_check(g, jnp.float32(1), backend="reference"),
        "native": lambda g: jas.unscale_and_check(g, jnp.float32(1), backend="ffi"),
    }
    candidates = {}
    for name, fn in fns.items():
        step = jax.jit(fn, donate_argnums=0)
        box = [jax.device_put(host, sharding)]

        def run(step=step, box=box):
            box[0] = jax.block_until_ready(step(box[0])[0])

        candidates[name] = run
    n = sum(v.size for v in host.values()) / 1e6
    title = f"{layout}: the gradient pass alone, {n:.1f}M float32 values, {len(host)} leaves"
    notes = ["one jitted call per sample, gradients donated; found-inf flag replicated"]
    return _timed(title, candidates, "copy (-g)", args, notes)


def _timed(title: str, candidates: dict, baseline: str, args, notes: list[str]) -> Table:
    opts = {"baseline": baseline, "reps": args.reps, "warmup": args.warmup, "notes": notes}
    return timed_table("7. Eight devices", title, candidates, **opts)


def main() -> None:
    args = parser(__doc__.splitlines()[0], reps=30, warmup=3).parse_args()
    if args.tiny:
        args.reps, args.warmup = 1, 1
    width, depth, batch = (64, 2, 64) if args.tiny else (512, 4, 256)
    assert jax.device_count() == 8, jax.devices()
    tables = [_table(layout, width, depth, batch, args) for layout in ("fsdp", "data_parallel")]
    tables += [_pass_table(layout, width, depth, args) for layout in ("fsdp", "data_parallel")]
    save(args, tables, show=True)


if __name__ == "__main__":
    main()
