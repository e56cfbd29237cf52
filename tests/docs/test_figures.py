"""Every figure on the pages comes from a results file that a script wrote.

tools/figures.py derives the figures from bench/results.json and
results/*.json; the pages cite them with the ``{fig}`` role or hold blocks it
generates.  These tests fail when a page holds a figure typed by hand, a
block that a fresh render would change, a role naming no figure, or a
status that is not the computed one, and they show that deleting a number
from a results file fails.
"""

from __future__ import annotations

import copy
import json
import re
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import figures  # noqa: E402

ROLE = re.compile(r"\{fig\}`([^`]+)`")
# A measured figure: a ratio (0.78x), a percentage, a time (0.7 s, 3
# minutes, 2 hours), a number with 3+ decimals (a loss), or a target's
# status.  A threshold ("at most 1.0x", "within 10%") is a target, not a
# measurement.
FIGURE = re.compile(
    r"(?<![\w.*^/=+-])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:x|\u00d7|%|ms|us|\u00b5s)(?!\w)"
    r"|(?<![\w.*^/=+-])\d+(?:\.\d+)?\s?(?:s|seconds?|min|minutes?|hours?)\b(?![-\w])"
    r"|(?<![\w.])\d\.\d{3,}(?!\w)"
    r"|\bnot met\b|\bmet\b|\bmissed\b"
)
THRESHOLD = re.compile(r"(at most|within|under|below|above|at least)\s*$")


def _scrub(text: str) -> str:
    """The page's prose: no code blocks, no generated blocks, no roles, no code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = figures.BLOCK.sub("", text)
    text = ROLE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def typed_figures(text: str) -> list[str]:
    found = []
    for para in re.split(r"\n\s*\n", _scrub(text)):
        line = " ".join(para.split())
        for m in FIGURE.finditer(line):
            if not THRESHOLD.search(line[: m.start()]):
                found.append(f"{m.group(0)!r} in: {line.strip()[:100]}")
    return found


@pytest.mark.parametrize("page", figures.PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_figure_is_typed_by_hand(page):
    assert typed_figures(page.read_text()) == []


def test_the_scan_finds_a_typed_figure():
    assert typed_figures("a step costs 0.78x the plain one") == [
        "'0.78x' in: a step costs 0.78x the plain one"
    ]
    assert typed_figures("eval loss 2.1807; target **not met**") != []
    assert typed_figures("it compiles in about 0.7 s") != []
    assert typed_figures("3 minutes of install and 5 of tests") != []
    assert typed_figures("within 5 minutes on two cores") == []
    assert typed_figures("the target of at most 1.0x; {fig}`step.f32.auto`; `1.03x`") == []
    assert typed_figures("<!-- figures: targets -->\n| 1.03x | met |\n<!-- /figures -->") == []


@pytest.mark.parametrize("page", figures.PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_is_current(page):
    text = page.read_text()
    assert figures.render(text) == text, "python tools/figures.py write"


def test_every_role_names_a_figure():
    known = figures.figures()
    used = {m for p in figures.PAGES for m in ROLE.findall(p.read_text())}
    assert used, "no page cites a figure"
    assert sorted(used - set(known)) == []


def test_every_block_is_used_and_every_used_block_exists():
    used = {m.group(2) for p in figures.PAGES for m in figures.BLOCK.finditer(p.read_text())}
    assert used == set(figures.BLOCKS)


def _all_pages_render() -> list[str]:
    """The pages whose blocks or roles change (or fail) against the results now loaded."""
    figures.figures.cache_clear()
    stale = []
    for page in figures.PAGES:
        text = page.read_text()
        try:
            same = figures.render(text) == text
            for name in ROLE.findall(text):
                figures.fig(name)
        except (KeyError, IndexError, ValueError, statistics.StatisticsError):
            same = False
        if not same:
            stale.append(page.name)
    return stale


def _without(path: Path, drop) -> dict:
    data = copy.deepcopy(json.loads(path.read_text()))
    drop(data)
    return data


@pytest.mark.parametrize(
    ("where", "drop"),
    [
        ("results/demo.json", lambda d: d["data"].pop("eval_loss")),
        ("results/transformer_lm.json", lambda d: d["data"]["modes"]["float16"].pop("eval_loss")),
        ("results/amax_study.json", lambda d: d["data"]["runs"][0].pop("skipped")),
        ("bench/results.json", lambda d: d["runs"]["step"]["tables"][0]["rows"][1]["times"].pop()),
        ("bench/results.json", lambda d: d["runs"]["compile"]["tables"][0]["rows"].pop(1)),
    ],
    ids=["demo", "transformer", "amax-study", "step-time", "compile-row"],
)
def test_deleting_a_number_fails_a_page(monkeypatch, where, drop):
    path = ROOT / where
    broken = _without(path, drop)
    real = figures._json.__wrapped__

    def patched(p: Path):
        return copy.deepcopy(broken) if Path(p) == path else real(p)

    monkeypatch.setattr(figures, "_json", patched)
    try:
        assert _all_pages_render() != []
    finally:
        figures.figures.cache_clear()


def test_a_status_is_the_default_paths_figure():
    """Recomputed here from the raw times: met exactly when the default's median is within."""
    runs = json.loads(figures.BENCH.read_text())["runs"]
    for short, dtype in figures.DTYPES.items():
        t = next(t for t in runs["step"]["tables"] if t["title"].endswith(f"{dtype} compute"))
        rows = {r["name"]: r["times"] for r in t["rows"]}
        auto = [a / b for a, b in zip(rows["ours loss_scaled[auto]"], rows["plain"], strict=True)]
        want = "met" if statistics.median(auto) <= 1.0 else "not met"
        assert figures.fig(f"target.step.{short}") == want


def test_every_results_file_says_where_it_came_from():
    for path in sorted(figures.RESULTS.glob("*.json")):
        p = json.loads(path.read_text())["provenance"]
        for key in (
            "jax",
            "jaxlib",
            "cores (os.cpu_count)",
            "load average at start",
            "command",
            "date (UTC)",
        ):
            assert p.get(key), (path.name, key)
    for w, run in figures.bench_runs().items():
        for key in ("jax", "jaxlib", "load average at start", "date (UTC)"):
            assert run["machine"].get(key), (w, key)


@pytest.mark.parametrize(
    ("values", "text"),
    [
        ([1.0, 1.0, 1.0], "1.00x"),  # no spread: three significant digits
        ([150.0, 157.0, 160.0], "157x (±2)"),  # half the IQR, 2.5, at its own digit
        ([0.95, 1.0, 1.05, 1.1, 0.9], "1.00x (±0.05)"),
        ([0.7, 1.0, 1.3, 1.6, 0.4], "1.0x (±0.3)"),
        ([1.029, 1.031, 1.030, 1.032, 1.028], "1.03x (±0.001)"),
    ],
)
def test_a_timing_has_no_more_digits_than_its_spread(values, text):
    assert figures.ratio_text(values) == text
