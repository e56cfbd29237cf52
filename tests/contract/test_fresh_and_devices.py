"""The contract's cells that need a fresh process or eight devices (slow tier).

One worker process per column serves every row: orbax restore and
jax.export (tests/contract/fresh_worker.py; this process does the first
half and saves), shard_map, pmap and FSDP (tests/contract/devices_worker.py,
eight virtual CPU devices).  Each test is one cell of docs/contract.md.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.contract import cells as C
from tests.contract import fresh_worker

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _worker(module: str, *args: str) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _first_half(save, root: pathlib.Path) -> None:
    for i, row in enumerate(C.ROWS):
        path = root / str(i)
        path.mkdir(parents=True)
        try:
            save(row, path)
        except Exception as e:
            (path / "error.txt").write_text(f"in the saving process: {type(e).__name__}: {e}")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    out = {}
    for kind, save in [("orbax", fresh_worker.save_orbax), ("export", fresh_worker.save_export)]:
        root = tmp_path_factory.mktemp(kind)
        _first_half(save, root)
        _worker("tests.contract.fresh_worker", kind, str(root), str(root / "out.json"))
        out[kind] = json.loads((root / "out.json").read_text())
    return out


@pytest.fixture(scope="module")
def devices(tmp_path_factory):
    path = tmp_path_factory.mktemp("devices") / "out.json"
    _worker("tests.contract.devices_worker", str(path))
    return json.loads(path.read_text())


FRESH = {"orbax restore, fresh process": "orbax", "jax.export, fresh process": "export"}


def _cells(where):
    return [pytest.param(c, r, id=f"{c}|{r}") for c, r in C.cells() if C.COLUMN[c].where == where]


@pytest.mark.parametrize(("column", "row"), _cells("fresh"))
def test_cell_fresh_process(fresh, column, row):
    error = fresh[FRESH[column]][row]
    if error is not None:
        pytest.fail(error, pytrace=False)


@pytest.mark.parametrize(("column", "row"), _cells("devices"))
def test_cell_eight_devices(devices, column, row):
    error = devices[column][row]
    if error is not None:
        pytest.fail(error, pytrace=False)


def test_every_column_here_is_served(devices):
    assert set(FRESH) == {c.name for c in C.COLUMNS if c.where == "fresh"}
    assert set(devices) == {c.name for c in C.COLUMNS if c.where == "devices"}
