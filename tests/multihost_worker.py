"""One process of the multi-host test; tests/test_multihost.py starts several.

Not a test module.  Each process joins a `jax.distributed` job on loopback
(CPU collectives: gloo, JAX's default), builds one global mesh over every
process's devices and trains a tiny float16 model for a few steps, with an
overflow injected into the local batch of ONE process at one step.  Every
configuration (how the step is written x backend) runs in the same job; the
process writes what it holds at the end (scale, tracker, skipped count,
found trace, params, every local copy of replicated values) to
``<out>/process<id>.npz`` for the parent to compare across processes, bit
for bit.
"""

from __future__ import annotations

import argparse
import os
import sys

LR = 0.05
FEATURES = 24  # divisible by every global device count used (2 per process)


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--coordinator", required=True, help="host:port of process 0")
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--out", required=True, help="directory for process<id>.npz")
    p.add_argument("--overflow-process", type=int, default=1)
    p.add_argument("--overflow-step", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--timeout", type=int, default=60, help="seconds to wait for peers")
    return p.parse_args(argv)


def main(argv=None):
    args = _parse(argv)
    import jax

    jax.distributed.initialize(
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=args.timeout,
        heartbeat_timeout_seconds=args.timeout,
        shutdown_timeout_seconds=args.timeout,
    )
    import numpy as np

    results = {
        "process_count": np.int32(jax.process_count()),
        "device_count": np.int32(jax.device_count()),
        "cpu_collectives": np.str_(jax.config.jax_cpu_collectives_implementation),
    }
    for name, run in _CONFIGS.items():
        for backend in ("reference", "ffi"):
            for key, value in run(args, backend).items():
                results[f"{name}/{backend}/{key}"] = value
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"process{args.process_id}.npz"), **results)
    jax.distributed.shutdown()


# --- the model and the data -------------------------------------------------


def _init_params():
    import numpy as np

    rng = np.random.default_rng(0)  # the same on every process
    return {
        "w": (0.1 * rng.standard_normal((FEATURES, 4))).astype(np.float32),
        "b": np.zeros((4,), np.float32),
    }


def _local_batch(args, step):
    """This process's rows of the global batch at `step` (4 per local device)."""
    import jax
    import numpy as np

    rng = np.random.default_rng(1000 * step + args.process_id)
    rows = 4 * jax.local_device_count()
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    y = rng.standard_normal((rows, 4)).astype(np.float32)
    if args.process_id == args.overflow_process and step == args.overflow_step:
        x[0, 0] = np.inf  # this process, this step only
    return x, y


def _loss(params, x, y):
    import jax.numpy as jnp

    pred = x.astype(jnp.float16) @ params["w"].astype(jnp.float16) + params["b"].astype(jnp.float16)
    return jnp.mean((pred.astype(jnp.float32) - y) ** 2)


def _all_finite(tree):
    import jax
    import jax.numpy as jnp

    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(tree)]))


def _local_copies(x):
    """Every copy this process holds of a replicated array, stacked."""
    import numpy as np

    return np.stack([np.asarray(s.data) for s in x.addressable_shards])


def _full(x):
    """The whole global array on this process (gathers sharded ones)."""
    import numpy as np
    from jax.experimental import multihost_utils

    if x.is_fully_replicated:
        return np.asarray(x.addressable_shards[0].data)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _global_batch(args, mesh, step):
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    sharding = NamedSharding(mesh, P("data"))
    return tuple(
        jax.make_array_from_process_local_data(sharding, a) for a in _local_batch(args, step)
    )


def _train(args, backend, step_fn, param_specs, tx=None):
    """Runs `step_fn` for args.steps steps on a 1-D global mesh and reports.

    Without `tx` the carried state is ``(ScaleState, skipped count)``; with
    an optax `loss_scaled` transformation it is ``tx``'s state, which keeps
    its own counters.
    """
    import jax
    import numpy as np
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_amp_scale as jas

    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
        params = {
            k: jax.device_put(v, NamedSharding(mesh, param_specs[k]))
            for k, v in _init_params().items()
        }
        if tx is None:
            carry = (jas.init_scale_state(2.0**8, growth_interval=2), np.int32(0))
        else:
            carry = tx.init(params)
        carry = jax.device_put(carry, NamedSharding(mesh, P()))
        step = jax.jit(lambda c, p, x, y: step_fn(c, p, x, y, backend))
        founds = []
        for t in range(args.steps):
            carry, params, found = step(carry, params, *_global_batch(args, mesh, t))
            founds.append(_local_copies(found))
    if tx is None:
        state, skipped = carry
        out = {"skipped": _local_copies(skipped)}
    else:
        from jax_amp_scale.optax import get_loss_scaled_state

        opt = get_loss_scaled_state(carry)
        state = opt.scale_state
        out = {
            "skipped": _local_copies(opt.skipped_steps),
            "total": _local_copies(opt.total_steps),
            "last_found": _local_copies(opt.found_inf),
        }
    out.update(
        scale=_local_copies(state.scale),
        tracker=_local_copies(state.growth_tracker),
        found=np.stack(founds, axis=1),  # (local devices, steps)
    )
    for k, v in params.items():
        out[f"params/{k}"] = _full(v)
    return out


def _with_count(step_fn):
    """Adapts a (state, params, x, y, backend) step to carry a skipped count."""

    def step(carry, params, x, y, backend):
        state, skipped = carry
        state, params, found = step_fn(state, params, x, y, backend)
        return (state, skipped + found.astype(skipped.dtype)), params, found

    return step


# --- the configurations: how the training step is written -------------------


def _global_step(state, params, x, y, backend):
    """jit over global arrays: found_inf is computed over the global gradient."""
    import jax
    import jax.numpy as jnp

    import jax_amp_scale as jas

    grads = jax.grad(lambda p: _loss(p, x, y) * state.scale)(params)
    grads = jax.tree.map(lambda g: g / state.scale, grads)
    found = ~_all_finite(grads)
    params = jax.tree.map(lambda p, g: jnp.where(found, p, p - LR * g), params, grads)
    return jas.update_scale(state, found, backend), params, found


def _run_data_parallel(args, backend):
    from jax.sharding import PartitionSpec as P

    return _train(args, backend, _with_count(_global_step), {"w": P(), "b": P()})


def _run_fully_sharded(args, backend):
    from jax.sharding import PartitionSpec as P

    def step(state, params, x, y, backend):
        import jax

        # FSDP: gather the weight for compute, keep it sharded between steps.
        gathered = {**params, "w": jax.sharding.reshard(params["w"], P())}
        state, new, found = _global_step(state, gathered, x, y, backend)
        return state, {**new, "w": jax.sharding.reshard(new["w"], P("data"))}, found

    return _train(args, backend, _with_count(step), {"w": P("data"), "b": P()})


def _run_shard_map(args, backend):
    """Per-device code: found_inf from the LOCAL gradient, reduced by axis_name."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import jax_amp_scale as jas

    def local(state, params, x, y):
        # Typed as varying, the params get this device's gradient; replicated
        # ones would get it already summed over 'data' (shard_map's transpose).
        varying = jax.tree.map(lambda a: jax.lax.pcast(a, "data", to="varying"), params)
        grads = jax.grad(lambda p: _loss(p, x, y) * state.scale)(varying)
        local_found = ~_all_finite(grads)  # this device's batch only
        new_state = jas.update_scale(state, local_found, backend, axis_name="data")
        grads = jax.tree.map(lambda g: jax.lax.pmean(g, "data") / state.scale, grads)
        found = ~_all_finite(grads)  # the mean is non-finite if any part was
        params = jax.tree.map(lambda p, g: jnp.where(found, p, p - LR * g), params, grads)
        return new_state, params, found

    def step(state, params, x, y, backend):
        del backend
        return jax.shard_map(
            local,
            in_specs=(P(), P(), P("data"), P("data")),
            out_specs=(P(), P(), P()),
        )(state, params, x, y)

    return _train(args, backend, _with_count(step), {"w": P(), "b": P()})


def _varying(tree):
    import jax

    return jax.tree.map(lambda a: jax.lax.pcast(a, "data", to="varying"), tree)


def _run_value_and_grad_shard_map(args, backend):
    """Per device: `jas.value_and_grad(axis_name=...)` on the local batch."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import jax_amp_scale as jas

    def local(state, params, x, y):
        _, grads, found = jas.value_and_grad(_loss, state, axis_name="data")(
            _varying(params), x, y
        )  # local unscaled grads; found shared by every device
        grads = jax.tree.map(lambda g: jax.lax.pmean(g, "data"), grads)
        params = jax.tree.map(lambda p, g: jnp.where(found, p, p - LR * g), params, grads)
        return jas.update_scale(state, found, backend), params, found

    def step(state, params, x, y, backend):
        del backend
        return jax.shard_map(
            local, in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P(), P())
        )(state, params, x, y)

    return _train(args, backend, _with_count(step), {"w": P(), "b": P()})


def _loss_scaled(backend, axis_name=None):
    import optax

    import jax_amp_scale as jas
    import jax_amp_scale.optax

    return jax_amp_scale.optax.loss_scaled(
        optax.sgd(LR),
        jas.dynamic_scaler(2.0**8, growth_interval=2),
        axis_name=axis_name,
        backend=backend,
    )


def _run_loss_scaled(args, backend):
    """jit over global arrays, the optax wrapper (README usage)."""
    import jax
    import optax

    import jax_amp_scale as jas
    from jax_amp_scale.optax import get_loss_scaled_state

    tx = _loss_scaled(backend)

    def step(opt_state, params, x, y, backend):
        del backend
        grads = jax.grad(lambda p: jas.scale_loss(_loss(p, x, y), opt_state))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        found = get_loss_scaled_state(opt_state).found_inf
        return opt_state, optax.apply_updates(params, updates), found

    from jax.sharding import PartitionSpec as P

    return _train(args, backend, step, {"w": P(), "b": P()}, tx=tx)


def _run_loss_scaled_shard_map(args, backend):
    """Per device: LOCAL scaled grads into `loss_scaled(axis_name=...)`."""
    import jax
    import optax
    from jax.sharding import PartitionSpec as P

    import jax_amp_scale as jas
    from jax_amp_scale.optax import get_loss_scaled_state

    tx = _loss_scaled(backend, axis_name="data")

    def local(opt_state, params, x, y):
        grads = jax.grad(lambda p: jas.scale_loss(_loss(p, x, y), opt_state))(_varying(params))
        updates, opt_state = tx.update(grads, opt_state, params)
        # sgd is linear: the mean of local updates is the update of the mean.
        updates = jax.tree.map(lambda u: jax.lax.pmean(u, "data"), updates)
        found = get_loss_scaled_state(opt_state).found_inf
        return opt_state, optax.apply_updates(params, updates), found

    def step(opt_state, params, x, y, backend):
        del backend
        return jax.shard_map(
            local, in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), P(), P())
        )(opt_state, params, x, y)

    return _train(args, backend, step, {"w": P(), "b": P()}, tx=tx)


_CONFIGS = {
    "data_parallel": _run_data_parallel,
    "fully_sharded": _run_fully_sharded,
    "shard_map": _run_shard_map,
    "value_and_grad_shard_map": _run_value_and_grad_shard_map,
    "loss_scaled": _run_loss_scaled,
    "loss_scaled_shard_map": _run_loss_scaled_shard_map,
}


if __name__ == "__main__":
    sys.exit(main())
