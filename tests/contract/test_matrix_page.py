"""docs/contract.md lists exactly the suite's cells, each with a known status.

The page is generated (tools/contract_matrix.py); this checks the committed
one against the suite's rows, columns and documented errors, so that no
cell is missing, unknown or described with another outcome than the one the
suite asserts.
"""

from __future__ import annotations

import pathlib

from tests.contract import cells as C
from tests.contract import test_contract, test_fresh_and_devices

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "contract.md"


def _table() -> tuple[list[str], dict[str, list[str]]]:
    lines = [x for x in PAGE.read_text().splitlines() if x.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return header, rows


def test_the_page_lists_every_cell_with_a_known_status():
    header, rows = _table()
    assert header == [c.name for c in C.COLUMNS]
    assert list(rows) == [r.name for r in C.ROWS]
    for row in C.ROWS:
        for column, got in zip(C.COLUMNS, rows[row.name], strict=True):
            where = f"{column.name} | {row.name}"
            if C.na(column, row) is not None:
                assert got == "n/a", where
            elif (column.name, row.name) in C.EXPECTED_ERRORS:
                error = C.EXPECTED_ERRORS[column.name, row.name][0].__name__
                assert got in (f"error: {error}", "fails"), where
            else:
                assert got in ("works (oracle)", "fails"), where


def test_the_suite_runs_every_cell_of_the_page():
    ran = {(c, r) for c, r in test_contract.HERE}
    ran |= {
        tuple(p.values)
        for name in ("fresh", "devices")
        for p in test_fresh_and_devices._cells(name)
    }
    assert ran == set(C.cells())
