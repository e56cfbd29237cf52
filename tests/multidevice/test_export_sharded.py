"""jax.export of a sharded step with eight devices.

custom_partitioning's partitioner is a Python callback, which does not
serialize; `jax_amp_scale.export.export` traces the native calls whole
there.  Oracle: the unexported, partitioned step's bits, and a fresh
process (no library call before) that runs the deserialized artifact.
"""

import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_amp_scale as jas

optax = pytest.importorskip("optax")
pytest.importorskip("flatbuffers")
from jax_amp_scale import export  # noqa: E402
from jax_amp_scale.optax import loss_scaled  # noqa: E402
from tests.fixtures import make_export_fixtures as fx  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
fx.register_optax_states()  # adam's state types, by name


def _step_and_args():
    tx = loss_scaled(optax.adam(1e-2), host_reports=False)
    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
    rng = np.random.default_rng(0)
    params = {
        "w": jax.device_put(rng.standard_normal((16, 4), np.float32), NamedSharding(mesh, P("d"))),
        "b": jnp.zeros((4,), jnp.float32),
    }
    x = jax.device_put(rng.standard_normal((8, 16), np.float32), NamedSharding(mesh, P("d")))
    x_bad = x.at[3, 2].set(jnp.inf)

    def step(p, s, x):
        loss = lambda p: jnp.mean((x @ p["w"] + p["b"]) ** 2)  # noqa: E731
        g = jax.grad(lambda p: jas.scale_loss(loss(p), s))(p)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    return step, params, tx.init(params), x, x_bad


def _bits(tree):
    return [np.asarray(a).view(f"u{np.asarray(a).itemsize}") for a in jax.tree.leaves(tree)]


@pytest.mark.slow
@pytest.mark.trimmed
def test_sharded_step_exports_and_runs_with_the_partitioned_bits(tmp_path):
    step, params, state, x, x_bad = _step_and_args()
    jitted = jax.jit(step)
    want = [jitted(params, state, x), jitted(params, state, x_bad)]  # traced partitioned first
    assert "CustomSPMDPartitioning" in jitted.lower(params, state, x).as_text()
    exp = export.export(jitted)(params, state, x)
    assert exp.nr_devices == 8
    blob = exp.serialize()
    # In this process, and in a fresh one, the artifact gives the same bits.
    back = export.deserialize(blob)
    for args, w in zip([(params, state, x), (params, state, x_bad)], want, strict=True):
        for g, e in zip(_bits(back.call(*args)), _bits(w), strict=True):
            np.testing.assert_array_equal(g, e)
    assert int(want[1][1].skipped_steps) == 1  # the overflow step was skipped
    assert "CustomSPMDPartitioning" not in exp.mlir_module()
    assert "jas_unscale_and_check_v1" in exp.mlir_module()
    # Later steps partition again (the switch is scoped to the export).
    assert "CustomSPMDPartitioning" in jitted.lower(params, state, x).as_text()
    np.savez(
        tmp_path / "data.npz",
        **{f"in{i}": a for i, a in enumerate(jax.tree.leaves((params, state, x)))},
        **{f"out{i}": a for i, a in enumerate(_bits(want[0]))},
    )
    (tmp_path / "step.bin").write_bytes(blob)
    code = f"""
import jax, numpy as np
from jax_amp_scale import export
from tests.fixtures import make_export_fixtures as fx
fx.register_optax_states()
exp = export.deserialize(open({str(tmp_path / "step.bin")!r}, "rb").read())
d = np.load({str(tmp_path / "data.npz")!r})
n_in = len(exp.in_avals)
args = jax.tree.unflatten(exp.in_tree, [d[f"in{{i}}"] for i in range(n_in)])
mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
args = jax.device_put(args, jax.tree.unflatten(exp.in_tree, exp.in_shardings_jax(mesh)))
out = jax.tree.leaves(exp.call(*args[0], **args[1]))
for i, a in enumerate(out):
    a = np.asarray(a)
    assert np.array_equal(a.view(f"u{{a.itemsize}}"), d[f"out{{i}}"]), i
print("same bits", len(out))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "same bits" in proc.stdout
