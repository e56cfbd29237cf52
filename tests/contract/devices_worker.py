"""The contract's eight-device cells, in a process of their own.

python -m tests.contract.devices_worker OUT.json [ROW ...]

XLA reads its device-count flag once per process, so these cells run here
(tests/contract/test_fresh_and_devices.py starts it).  Each cell runs the
row data-parallel (shard_map, pmap: every device its own micro-batch,
gradients averaged over the axis) or FSDP (NamedSharding, float16
parameters sharded on dim 0), compares with the oracle on the mean batch
and counts the compiled step's collectives against the plain optax step's
in the same layout: the row may add one scalar all-reduce (the overflow
flag's OR) and, with 16-bit parameters, the scalar boolean all-reduce of
loss_scaled's update check (skip_nonfinite_updates, docs/guide/multi-device.md),
nothing else.  Writes {column: {row: null | "Type: message"}}.
"""

from __future__ import annotations

import os

from tests import virtual_devices

virtual_devices.use(8)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import collections  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_amp_scale as jas  # noqa: E402
from tests.contract import cells as C  # noqa: E402

N = 8
AXIS = "d"

_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%\S+ = (.+?) "
    r"(all-reduce|all-gather|reduce-scatter|all-to-all|ragged-all-to-all|"
    r"collective-permute|collective-broadcast)(?:-start)?\(",
    re.MULTILINE,
)


def collectives(compiled_text: str) -> collections.Counter:
    """(op, element type) of every collective; a combined one counts per element."""
    out: collections.Counter = collections.Counter()
    for m in _COLLECTIVE.finditer(compiled_text):
        for t in re.findall(r"\w+\[[^\]]*\]", m.group(1)):
            out[(m.group(2), t)] += 1
    return out


def check_collectives(step_text: str, plain_text: str, amax: bool = False) -> None:
    """The step's collectives beyond the plain step's: one scalar all-reduce
    (the flag), or for amax_scaler one all-reduce of a float32 vector (the
    flag beside the leaves' amaxes), plus the update check's boolean one."""
    got, plain = collectives(step_text), collectives(plain_text)
    missing = plain - got
    extra = got - plain
    assert not missing, f"the plain step's collectives {dict(missing)} are not in the step's"
    if amax:
        vectors = [k for k in extra.elements() if re.fullmatch(r"f32\[\d+\]", k[1])]
        assert len(vectors) == 1 and vectors[0][0] == "all-reduce", dict(extra)
        extra = extra - collections.Counter(vectors)
    scalar = [k for k in extra.elements() if k[0] == "all-reduce" and k[1].endswith("[]")]
    # The update check's AND over 16-bit parameters reduces a boolean (u8/pred).
    flag = [k for k in scalar if not k[1].startswith(("u8", "pred"))]
    assert len(scalar) == sum(extra.values()) and len(flag) <= 1, (
        f"beyond the plain step's collectives {dict(plain)}: {dict(extra)} "
        "(one scalar all-reduce allowed, plus the update check's boolean one)"
    )


# ------------------------------------------------------------ drivers


def dp_driver(row: C.Row) -> C.Driver:
    """The row data-parallel over AXIS, as its docs say to write it."""
    if row.kind == "optax":
        return C.optax_driver(row.tx(axis_name=AXIS))
    if row.kind == "trainer":
        return C.trainer_driver(jas.Trainer(row.inner(), row.scaler(), axis_name=AXIS))
    if row.kind == "function":
        return C.function_driver(row.scaler, row.inner(), axis_name=AXIS)
    return C.scaler_driver(row.scaler, C.LR, axis_name=AXIS)


def plain_step(inner: Any, axis_name: str | None) -> Any:
    def step(params: Any, state: Any, batch: Any) -> tuple[Any, Any]:
        grads = jax.grad(lambda p: C.loss_fn(p, batch))(params)
        grads = C._mean(grads, axis_name)
        updates, state = inner.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step


def dp_batches(seed: int = 3) -> tuple[list[Any], list[Any]]:
    """Per step: the eight devices' micro-batches (stacked), and their mean."""
    per = [
        C.batches(overflow_at=(2,) if i == 5 else (6,) if i == 1 else (), seed=seed + i)
        for i in range(N)
    ]
    stacked = [C.stack([per[i][t] for i in range(N)]) for t in range(C.STEPS)]
    # Multiples of 1/16 summed and divided by 8: exact.
    mean = [{k: v.mean(axis=0, dtype=np.float32) for k, v in s.items()} for s in stacked]
    return stacked, mean


def _scales(row: C.Row, states: list[Any]) -> list[float]:
    return [
        float(np.asarray(C.scale_of(s)).reshape(-1)[0])
        for t, s in enumerate(states)
        if (t + 1) % row.k == 0
    ]


# Every cell waits for each step before dispatching the next.  With steps in
# flight, eight virtual devices on two loaded cores deadlocked XLA:CPU's
# runtime: one replica's launch waited on its device's in-flight-computation
# semaphore while the other seven sat in the step's all-reduce, past any
# timeout (CI, once per few runs; 3 of 3 runs beside three CPU hogs; 0 of 6
# with the wait).


def shard_map_cell(row: C.Row) -> None:
    mesh = jax.make_mesh((N,), (AXIS,))
    d = dp_driver(row)
    spec = (P(), P(), P(AXIS))

    def local(p: Any, s: Any, x: Any) -> Any:
        return d.step(p, s, jax.tree.map(lambda a: a[0], x))

    step = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=(P(), P())))
    inner = row.inner()
    plain = jax.jit(
        jax.shard_map(
            lambda p, s, x: plain_step(inner, AXIS)(p, s, jax.tree.map(lambda a: a[0], x)),
            mesh=mesh,
            in_specs=spec,
            out_specs=(P(), P()),
        )
    )
    stacked, mean = dp_batches()
    stacked = [jax.device_put(x, NamedSharding(mesh, P(AXIS))) for x in stacked]
    params, state = C.params0(), d.init(C.params0())
    check_collectives(
        step.lower(params, state, stacked[0]).compile().as_text(),
        plain.lower(params, inner.init(params), stacked[0]).compile().as_text(),
        amax=row.rule == "amax",
    )
    states = []
    for x in stacked:
        params, state = jax.block_until_ready(step(params, state, x))
        states.append(state)
    C.check(row, params, state, C.oracle(row, mean), _scales(row, states))


def pmap_cell(row: C.Row) -> None:
    d = dp_driver(row)
    step = jax.pmap(d.step, axis_name=AXIS)
    inner = row.inner()
    plain = jax.pmap(plain_step(inner, AXIS), axis_name=AXIS)
    stacked, mean = dp_batches()

    def rep(tree: Any) -> Any:
        return jax.tree.map(lambda a: jnp.stack([a] * N), tree)

    params, state = rep(C.params0()), rep(d.init(C.params0()))
    check_collectives(
        step.lower(params, state, stacked[0]).compile().as_text(),
        plain.lower(params, rep(inner.init(C.params0())), stacked[0]).compile().as_text(),
        amax=row.rule == "amax",
    )
    states = []
    for x in stacked:
        params, state = jax.block_until_ready(step(params, state, x))
        states.append(jax.tree.map(lambda a: a[0], state))
    for leaf in jax.tree.leaves((params, state)):  # every replica took the same step
        leaf = np.asarray(leaf)
        np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[:1], leaf.shape))
    one = jax.tree.map(lambda a: a[0], (params, state))
    C.check(row, one[0], one[1], C.oracle(row, mean), _scales(row, states))


def fsdp_cell(row: C.Row) -> None:
    dtype = jnp.float16
    mesh = jax.make_mesh((N,), (AXIS,))
    shard = {"b": NamedSharding(mesh, P()), "w": NamedSharding(mesh, P(AXIS, None))}
    d = row.make()
    inner = row.inner()
    params = jax.device_put(C.params0(dtype), shard)
    state = d.init(params)
    bs = C.batches(dtype=dtype)
    sharded = [jax.device_put(b, shard) for b in bs]
    step, plain = jax.jit(d.step), jax.jit(plain_step(inner, None))
    check_collectives(
        step.lower(params, state, sharded[0]).compile().as_text(),
        plain.lower(params, inner.init(params), sharded[0]).compile().as_text(),
        amax=row.rule == "amax",
    )
    states = []
    for x in sharded:
        params, state = jax.block_until_ready(step(params, state, x))
        states.append(state)
    assert params["w"].sharding.is_equivalent_to(shard["w"], 2), params["w"].sharding
    C.check(row, params, state, C.oracle(row, bs, dtype), _scales(row, states))


CELLS = {
    "shard_map, 8 devices": shard_map_cell,
    "pmap, 8 devices": pmap_cell,
    "FSDP NamedSharding, 8 devices": fsdp_cell,
}


def main(out: str, rows: list[str]) -> None:
    assert jax.device_count() == N, jax.devices()
    results: dict[str, dict[str, Any]] = {}
    for column, run in CELLS.items():
        results[column] = {}
        for name in rows or [r.name for r in C.ROWS]:
            try:
                run(C.ROW[name])
                results[column][name] = None
            except Exception as e:
                tb = traceback.format_exc(limit=-3)
                results[column][name] = f"{type(e).__name__}: {e}"[:1500] + "\n" + tb[-1500:]
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
