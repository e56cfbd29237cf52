"""The contract's fresh-process cells: the second half of a run in a new process.

python -m tests.contract.fresh_worker orbax DIR OUT.json
    for every row saved under DIR/<index> (orbax StandardCheckpointer, after
    the first half of the steps): restore into a fresh ``init`` template,
    run the second half, compare with the oracle.
python -m tests.contract.fresh_worker export DIR OUT.json
    for every row exported under DIR/<index> (step.bin, args.npz: the
    step serialized with host reports off, and its first arguments):
    deserialize, run every step, compare with the oracle.

Writes {row: null | "Type: message"}; tests/contract/test_fresh_and_devices.py
does the first half (`save_orbax`, `save_export`) and reads the result.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import traceback
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

from tests.contract import cells as C

HALF = C.STEPS // 2


def register_optax_states() -> None:
    """optax registers none of its states for jax.export: users register the
    ones their optimizer uses, in both processes (sgd with momentum's)."""
    import optax

    for cls in (optax.TraceState, optax.EmptyState):
        with contextlib.suppress(ValueError):  # registered already
            jax.export.register_namedtuple_serialization(
                cls, serialized_name=f"optax.{cls.__name__}"
            )


def export_options(row: C.Row) -> dict[str, Any]:
    """jax.export cannot serialize the host reports: off, as export.md says."""
    return {"host_reports": False} if row.kind in ("optax", "trainer") else {}


# ------------------------------------------------------------ first half (old process)


def save_orbax(row: C.Row, path: pathlib.Path) -> None:
    import orbax.checkpoint as ocp

    d = row.make()
    params, state, _ = C.run_loop(
        row, jax.jit(d.step), C.params0(), d.init(C.params0()), C.batches()[:HALF]
    )
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path.absolute() / "ckpt", {"params": params, "state": state})
        ckpt.wait_until_finished()


def save_export(row: C.Row, path: pathlib.Path) -> None:
    from jax_amp_scale import export

    register_optax_states()
    d = row.make(**export_options(row))
    args = (C.params0(), d.init(C.params0()), C.batches()[0])
    exp = export.export(jax.jit(d.step))(*args)
    path.mkdir(parents=True, exist_ok=True)
    (path / "step.bin").write_bytes(exp.serialize())
    leaves = jax.tree.leaves(args)
    np.savez(path / "args.npz", *[np.asarray(x) for x in leaves])


# ------------------------------------------------------------ second half (fresh process)


def restore_orbax(row: C.Row, path: pathlib.Path) -> None:
    import orbax.checkpoint as ocp

    d = row.make()
    template = {"params": C.params0(), "state": d.init(C.params0())}
    with ocp.StandardCheckpointer() as ckpt:
        back = ckpt.restore(path.absolute() / "ckpt", template)
    bs = C.batches()
    params, state, scales = C.run_loop(
        row, jax.jit(d.step), back["params"], back["state"], bs[HALF:]
    )
    want = C.oracle(row, bs)
    C.check(row, params, state, want, None)
    assert scales == want.scales[HALF // row.k :]


def run_export(row: C.Row, path: pathlib.Path) -> None:
    from jax_amp_scale import export

    register_optax_states()
    exp = export.deserialize((path / "step.bin").read_bytes())
    data = np.load(path / "args.npz")
    leaves = [data[f"arr_{i}"] for i in range(len(data.files))]
    (params, state, _), _ = jax.tree.unflatten(exp.in_tree, leaves)
    bs = C.batches()
    params, state, scales = C.run_loop(row, exp.call, params, state, bs)
    C.check(row, params, state, C.oracle(row, bs), scales)


def main(kind: str, root: str, out: str) -> None:
    run = {"orbax": restore_orbax, "export": run_export}[kind]
    results: dict[str, str | None] = {}
    for i, row in enumerate(C.ROWS):
        path = pathlib.Path(root) / str(i)
        if (path / "error.txt").exists():  # the first half failed: say so
            results[row.name] = (path / "error.txt").read_text()
            continue
        try:
            run(row, path)
            results[row.name] = None
        except Exception as e:
            tb = traceback.format_exc(limit=-3)
            results[row.name] = f"{type(e).__name__}: {e}"[:1500] + "\n" + tb[-1500:]
    pathlib.Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:4])
