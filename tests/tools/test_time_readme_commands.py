"""tools/time_readme_commands.py reads README's two commands and pytest's counts."""

from __future__ import annotations

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import time_readme_commands as t  # noqa: E402


def test_finds_readmes_demo_and_test_commands():
    got = t.readme_commands((ROOT / "README.md").read_text())
    assert got["demo"].endswith("&& python -m jax_amp_scale.demo")
    assert got["tests"].endswith("&& python -m pytest -n auto")
    for command in got.values():
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install")


def test_a_missing_or_doubled_command_is_an_error():
    one = "python3 -m venv .venv && pip install -e . && python -m pytest\n"
    with pytest.raises(SystemExit, match="demo"):
        t.readme_commands(one)
    demo = "python3 -m venv .venv && python -m jax_amp_scale.demo\n"
    with pytest.raises(SystemExit, match="tests"):
        t.readme_commands(demo + one + one)


def test_reads_pytests_last_summary_line():
    out = "== 3 failed in 1s ==\n...\n== 1350 passed, 21 skipped, 10 warnings in 246.48s (0:04:06) ==\n"
    assert t.pytest_counts(out) == {"passed": 1350, "skipped": 21}
    with pytest.raises(SystemExit):
        t.pytest_counts("no summary here")


def test_json_needs_both_commands(tmp_path):
    with pytest.raises(SystemExit):
        t.main(["--only", "demo", "--json", str(tmp_path / "x.json")])


def test_the_recorded_commands_are_readmes_commands_now():
    # README.md is left out of the result's sources (its figures block shows
    # the result); its two commands are what the recorded timings must match.
    import json

    recorded = json.loads((ROOT / "results" / "readme_commands.json").read_text())["data"][
        "commands"
    ]
    now = t.readme_commands((ROOT / "README.md").read_text())
    assert {k: recorded[k]["command"] for k in now} == now
