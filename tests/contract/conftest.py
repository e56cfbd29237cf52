"""Records each contract cell's outcome for tools/contract_matrix.py.

With ``JAS_CONTRACT_RESULTS=path.json`` in the environment, the session
writes ``{"column|row": {"column", "row", "outcome"}}`` for every cell it
ran (outcome: "passed", "failed" or "skipped"; a failure in setup counts).
Without it, nothing is written.
"""

from __future__ import annotations

import json
import os

import pytest

RESULTS = pytest.StashKey[dict]()
ENV = "JAS_CONTRACT_RESULTS"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "column" not in params or "row" not in params:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        cells = item.config.stash.setdefault(RESULTS, {})
        cells[f"{params['column']}|{params['row']}"] = {
            "column": params["column"],
            "row": params["row"],
            "outcome": report.outcome,
            "message": _first_line(report) if report.failed else "",
        }


def _first_line(report) -> str:
    """The failure's message, first line (the exception, or what pytest.fail said)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    line = next((x for x in text.splitlines() if x.strip()), "")
    return line.strip()[:200]


def pytest_sessionfinish(session):
    path = os.environ.get(ENV)
    if path:
        with open(path, "w") as f:
            json.dump(session.config.stash.get(RESULTS, {}), f, indent=1, sort_keys=True)
