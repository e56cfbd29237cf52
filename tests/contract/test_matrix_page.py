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


def _letters(text: str) -> list[str]:
    """'A-G, I' -> the rows' names."""
    names = []
    for span in filter(None, (s.strip() for s in text.split(","))):
        first, _, last = span.partition("-")
        start, stop = ord(first) - ord("A"), ord(last or first) - ord("A")
        names += [C.ROWS[i].name for i in range(start, stop + 1)]
    return names


def _table() -> tuple[list[str], dict[str, dict[str, str]]]:
    """The last table, "Every cell, by outcome": its header, and per holding
    (column of the suite) each object's (row's) outcome as the suite names it."""
    section = PAGE.read_text().split("\n## Every cell, by outcome\n", 1)[1]
    lines = [x for x in section.splitlines() if x.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    cells: dict[str, dict[str, str]] = {}
    for line in lines[2:]:
        holding, *by_outcome = [c.strip() for c in line.strip("|").split("|")]
        cells[holding] = {}
        for outcome, text in zip(header[1:], by_outcome, strict=True):
            if outcome == "error" and text:
                error, _, text = text.partition(": ")
                outcome = f"error: {error}"
            for row in _letters(text):
                assert row not in cells[holding], (holding, row)
                cells[holding][row] = outcome
    return header, cells


def test_the_page_lists_every_cell_with_a_known_status():
    header, cells = _table()
    assert header == ["holding", "works (oracle)", "error", "n/a", "fails"]
    assert list(cells) == [c.name for c in C.COLUMNS]
    for column in C.COLUMNS:
        assert set(cells[column.name]) == {r.name for r in C.ROWS}, column.name
        for row in C.ROWS:
            got = cells[column.name][row.name]
            where = f"{column.name} | {row.name}"
            if C.na(column, row) is not None:
                assert got == "n/a", where
            elif (column.name, row.name) in C.EXPECTED_ERRORS:
                error = C.EXPECTED_ERRORS[column.name, row.name][0].__name__
                assert got in (f"error: {error}", "fails"), where
            else:
                assert got in ("works (oracle)", "fails"), where


def test_the_grouped_tables_mark_the_same_outcomes():
    """The tables a reader looks at (a mark per cell) agree with the last one."""
    _, cells = _table()
    marks = {"works (oracle)": "✓", "n/a": "n/a", "fails": "✗"}
    text = PAGE.read_text()
    for block in text.split("```{list-table}")[1:]:
        items = block.split("```", 1)[0].split("\n* - ")[2:]  # the header row first
        for item in items:
            holding, *got = [x.strip().removeprefix("- ") for x in item.strip().splitlines()]
            want = [
                marks.get(o) or o.removeprefix("error: ")[0]
                for o in (cells[holding][r.name] for r in C.ROWS)
            ]
            assert got == want, holding


def test_the_suite_runs_every_cell_of_the_page():
    ran = {(c, r) for c, r in test_contract.HERE}
    ran |= {
        tuple(p.values)
        for name in ("fresh", "devices")
        for p in test_fresh_and_devices._cells(name)
    }
    assert ran == set(C.cells())
