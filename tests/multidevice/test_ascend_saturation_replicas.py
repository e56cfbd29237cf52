"""Saturation mode with eight replicas (issue #53): every replica takes the
same decision, however few of them saw the overflow.

Data parallelism under ``shard_map`` (``loss_scaled(axis_name=)``), the
Ascend path on CPU against the CANN double in saturation mode
(tests/ascend_harness.py): each replica's backward saturates on its own
device (``ascend_harness.saturate`` sets only that device's float status
register), each device clears and reads its own register, and the flag is
OR-reduced over the axis with found_inf.  Oracle: torch_npu's saturation-mode
GradScaler with the overflow count all-reduced (tests/_torch_npu_saturation.py).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_amp_scale as jas
from tests import _torch_npu_saturation as torch_npu
from tests import ascend_harness
from tests.cann_double import control
from tests.jax_compat import BEFORE_0_7, GRAD_OF_VARYING_LOSS, shard_map

optax = pytest.importorskip("optax")

N = 8
STEPS = 40
# step -> the replica whose backward overflows there (inf in its input).
OVERFLOWS = {3: 5, 11: 0, 12: 7, 25: 2}


def _inputs():
    rng = np.random.default_rng(8)
    xs = rng.uniform(-1.5, 1.5, size=(STEPS, N, 4)).astype(np.float16)
    for step, replica in OVERFLOWS.items():
        xs[step, replica, 1] = np.inf
    return xs


def _oracle(xs):
    def backward(step, replica, scale):
        with np.errstate(over="ignore", invalid="ignore"):
            return {"w": np.float16(scale) * xs[step, replica]}

    scaler = torch_npu.GradScaler(2.0**10, growth_interval=6)
    return torch_npu.run(scaler, STEPS, backward, replicas=N)


# jax < 0.7 cannot differentiate a loss typed as varying inside a checked
# shard_map, library or not (tests/jax_compat.py).
VMA_GRAD = pytest.mark.xfail(BEFORE_0_7, reason=GRAD_OF_VARYING_LOSS, strict=True)


@pytest.mark.parametrize(
    "check_vma", [pytest.param(True, marks=VMA_GRAD), False], ids=["checked", "unchecked"]
)
def test_every_replica_skips_when_one_device_saturated(double, monkeypatch, check_vma):
    control.use(monkeypatch, double, "full", soc="Ascend910B2", mode="saturation")
    xs = _inputs()
    tx = jas.optax.loss_scaled(
        optax.sgd(2.0**-10), jas.dynamic_scaler(2.0**10, growth_interval=6), axis_name="r"
    )
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:N]), ("r",))

    def body(params, state, x):
        def loss(p):
            return jas.scale_loss(jnp.sum(p["w"] * x[0]).astype(jnp.float32), state)

        grads = ascend_harness.saturate(jax.grad(loss)(params))
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        # Each replica's own view of the decision, gathered to compare.
        return params, state, state.skipped_steps[None], params["w"][None]

    params = {"w": jnp.zeros((4,), jnp.float16)}
    decisions = []
    with ascend_harness.ascend_on_cpu():
        step = jax.jit(
            shard_map(
                body,
                mesh=mesh,
                in_specs=(P(), P(), P("r")),
                out_specs=(P(), P(), P("r"), P("r")),
                check_vma=check_vma,
            )
        )
        state = tx.init(params)
        for i in range(STEPS):
            used, before = float(state.scale), int(state.skipped_steps)
            params, state, skipped, ws = step(params, state, xs[i])
            skipped = np.asarray(skipped)
            # Every replica took the same decision and holds the same weights.
            assert np.all(skipped == skipped[0]), (i, skipped)
            assert np.all(np.asarray(ws) == np.asarray(ws)[0]), i
            decisions.append({"skipped": int(skipped[0]) > before, "scale": used})
    oracle = _oracle(xs)
    assert decisions == oracle
    assert [i for i, d in enumerate(decisions) if d["skipped"]] == sorted(OVERFLOWS)
    # Each device read its own register; only the overflowing replicas' were set.
    log = double.log()
    assert {e["device"] for e in log if e["ev"] == "flag_get"} == set(range(N))
    raised = {e["device"] for e in log if e["ev"] == "flag_raise"}
    if check_vma:  # the gradient's psum is inside the backward: every device saw the inf
        assert raised == set(range(N))
    else:
        assert raised == set(OVERFLOWS.values())
    assert [double.float_status(d) for d in range(N)] == [0] * N


def test_under_jit_every_device_sees_the_or_of_the_flags(double, monkeypatch, partitioner):
    # jit over eight devices, no shard_map: each device reads its own
    # register, and the result XLA takes for replicated must be the OR; the
    # read takes the sharded gradients as operands without gathering them.
    from jax.sharding import NamedSharding

    from jax_amp_scale.operators import float_status

    control.use(monkeypatch, double, "full", soc="Ascend910B2", mode="saturation")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:N]), ("r",))
    rep = NamedSharding(mesh, P())
    found = jax.device_put(jnp.array(False), rep)
    grads = [jax.device_put(jnp.ones((16, 4), jnp.float16), NamedSharding(mesh, P("r")))]
    with ascend_harness.ascend_on_cpu():
        read = jax.jit(float_status.or_flag, out_shardings=rep)
        hlo = read.lower(found, grads).compile().as_text()
        double.raise_float_status(5)
        flags = [bool(s.data) for s in read(found, grads).addressable_shards]
        assert flags == [True] * N
        assert [double.float_status(d) for d in range(N)] == [0] * N  # cleared after the read
        assert [bool(s.data) for s in read(found, grads).addressable_shards] == [False] * N
    assert "all-gather" not in hlo
    assert len(re.findall(r" all-reduce(?:-start)?\(", hlo)) == 1
