"""One side of the fresh-process export round trip (tests/public/test_export.py).

python -m tests.export_worker save FIXTURE_NAME BACKEND DIR
    exports the step, writes DIR/step.bin and DIR/step.npz (inputs and
    the unexported step's outputs)
python -m tests.export_worker check DIR [DIR ...]
    deserializes each DIR/step.bin in this (fresh) process with
    jax_amp_scale.export.deserialize, runs it, exits 0 when every output
    has the unexported step's bits
"""

from __future__ import annotations

import pathlib
import sys

import jax
import numpy as np

from tests.fixtures import make_export_fixtures as fx


def save(name: str, backend: str, out_dir: str) -> None:
    from jax_amp_scale import export

    _, make_args = fx.STEPS[name]
    step = fx.STEP_FACTORIES[name](backend)
    args = make_args()
    exp = export.export(jax.jit(step))(*args)
    out = jax.jit(step)(*args)
    d = pathlib.Path(out_dir)
    (d / "step.bin").write_bytes(exp.serialize())
    np.savez(d / "step.npz", **fx.flat_arrays(args, "in"), **fx.flat_arrays(out, "out"))


def run_artifact(blob: bytes, data: dict) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(outputs of the deserialized artifact, the stored outputs)."""
    from jax_amp_scale import export

    fx.register_optax_states()  # the inner optimizer's state, by name
    exp = export.deserialize(blob)
    args = jax.tree_util.tree_unflatten(exp.in_tree, fx.read_arrays(data, "in"))
    got = jax.tree_util.tree_leaves(exp.call(*args[0], **args[1]))
    return [np.asarray(x) for x in got], fx.read_arrays(data, "out")


def check(out_dir: str) -> None:
    d = pathlib.Path(out_dir)
    got, want = run_artifact((d / "step.bin").read_bytes(), dict(np.load(d / "step.npz")))
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype)
        np.testing.assert_array_equal(g.view(f"u{g.itemsize}"), w.view(f"u{w.itemsize}"))
    print("same bits:", d.name, len(got), "outputs")


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(*sys.argv[2:5])
    else:
        for out_dir in sys.argv[2:]:
            check(out_dir)
