"""Multi-host loss scaling with jax.distributed: every process makes the same decision.

Run a 2-process job on this machine (loopback, CPU collectives, 2 devices per
process), with an overflow injected into process 1's batch at step 3::

    python examples/multihost.py --processes 2

On a real cluster, start one process per host instead::

    python examples/multihost.py --coordinator HOST0:1234 --num-processes N --process-id I

Each process trains a small float16 model data-parallel over the global mesh
with `jax_amp_scale.optax.loss_scaled` and prints its final scale, tracker,
skipped/total counters and a hash of its params; the local launcher checks
that every process printed the same thing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time


def train(args: argparse.Namespace) -> str:
    """One process of the job; returns its summary line."""
    import jax

    jax.distributed.initialize(
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=args.timeout,
    )
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_amp_scale as jas
    from jax_amp_scale.optax import loss_scaled

    # One mesh over every device of every process; the batch is split over it.
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    replicated, by_row = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    tx = loss_scaled(optax.adam(1e-2), jas.dynamic_scaler(2.0**12, growth_interval=2))
    rng = np.random.default_rng(0)  # the same initial params everywhere
    params = {"w": 0.1 * rng.standard_normal((16, 4)), "b": np.zeros(4)}
    params = jax.device_put(jax.tree.map(np.float32, params), replicated)
    opt_state = jax.device_put(tx.init(params), replicated)

    def loss_fn(p, x, y):
        pred = x.astype(jnp.float16) @ p["w"].astype(jnp.float16) + p["b"].astype(jnp.float16)
        return jnp.mean((pred.astype(jnp.float32) - y) ** 2)

    @jax.jit
    def step(params, opt_state, x, y):
        grads = jax.grad(lambda p: jas.scale_loss(loss_fn(p, x, y), opt_state))(params)
        updates, opt_state = tx.update(grads, opt_state, params)  # one global decision
        return optax.apply_updates(params, updates), opt_state

    for t in range(args.steps):
        # Each process loads only its own rows of the global batch.
        local = np.random.default_rng(1000 * t + args.process_id)
        x = local.standard_normal((8 * jax.local_device_count(), 16)).astype(np.float32)
        y = local.standard_normal((8 * jax.local_device_count(), 4)).astype(np.float32)
        if args.process_id == args.inject_process and t == args.inject_step:
            x[0, 0] = np.inf  # an overflow on this process only
        batch = [jax.make_array_from_process_local_data(by_row, a) for a in (x, y)]
        params, opt_state = step(params, opt_state, *batch)

    def local_value(a):  # this process's copy of a replicated array
        return np.asarray(a.addressable_shards[0].data)

    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        digest.update(local_value(leaf).tobytes())
    state = jas.find_scale_state(opt_state)
    summary = (
        f"scale={local_value(state.scale)} tracker={local_value(state.growth_tracker)} "
        f"skipped={local_value(opt_state.skipped_steps)}/{local_value(opt_state.total_steps)} "
        f"params_sha256={digest.hexdigest()[:16]}"
    )
    jax.distributed.shutdown()
    return summary


def launch(args: argparse.Namespace) -> int:
    """Starts args.processes copies of this script on loopback and compares them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    base = [sys.executable, os.path.abspath(__file__), f"--coordinator=127.0.0.1:{port}"]
    base += [f"--num-processes={args.processes}", f"--steps={args.steps}"]
    base += [f"--inject-process={args.inject_process}", f"--inject-step={args.inject_step}"]
    base += [f"--timeout={args.timeout}"]
    procs = [
        subprocess.Popen(
            [*base, f"--process-id={i}"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # so a hung job can be killed as a group
        )
        for i in range(args.processes)
    ]
    deadline = time.monotonic() + args.timeout
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append(out)
    except subprocess.TimeoutExpired:
        print(f"timed out after {args.timeout}s", file=sys.stderr)
        return 1
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    if any(p.returncode != 0 for p in procs):
        print(f"a process failed: exit codes {[p.returncode for p in procs]}", file=sys.stderr)
        return 1
    lines = [out.strip().splitlines()[-1] for out in outputs]
    print("\n".join(lines))
    summaries = {line.split(": ", 1)[1] for line in lines}
    if len(summaries) != 1:
        print("processes DISAGREE", file=sys.stderr)
        return 1
    print(f"all {args.processes} processes agree")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--processes", type=int, help="launch this many local processes (2 to 4)")
    p.add_argument("--coordinator", help="HOST:PORT of process 0 (one process of a job)")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--process-id", type=int)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--inject-process", type=int, default=1)
    p.add_argument("--inject-step", type=int, default=3)
    p.add_argument("--timeout", type=int, default=120, help="seconds for the whole job")
    args = p.parse_args(argv)
    if args.processes is not None:
        if not 1 <= args.processes <= 8:
            p.error("--processes must be between 1 and 8")
        return launch(args)
    if args.coordinator is None or args.num_processes is None or args.process_id is None:
        p.error("give --processes N, or --coordinator, --num-processes and --process-id")
    summary = train(args)
    print(f"process {args.process_id}/{args.num_processes}: {summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
