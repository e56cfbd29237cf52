"""tools/check_site.py, the headless-Chromium page check `.ci/run` runs on the site.

Each case is a small page in Furo's layout (a 736 px content column, code
blocks that scroll inside it), measured by the tool's own probe.
"""

from __future__ import annotations

import importlib.util
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

spec = importlib.util.spec_from_file_location("check_site", ROOT / "tools" / "check_site.py")
check_site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_site)

pytestmark = pytest.mark.skipif(
    not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")),
    reason="no chromium on PATH",
)

PAGE = """<!doctype html><html><head><style>
body {{ margin: 0; font: 16px sans-serif; }}
div.content {{ width: 736px; margin-left: 300px; }}
div.highlight pre {{ overflow: auto; margin: 0; padding: 12px;
  font: 13px/1.4 monospace; background: #eee; }}
div.table-wrapper {{ overflow-x: auto; }}
</style></head><body><div class="content"><article role="main">
{body}
</article></div></body></html>"""
LONG = "x = " + " + ".join(["value"] * 20)  # about 160 characters: scrolls
SHORT = "y = 1"


def _code(*lines: str) -> str:
    return (
        '<div class="highlight-python notranslate"><div class="highlight"><pre><span></span>'
        + "\n".join(lines)
        + "\n</pre></div></div>"
    )


def _problems(tmp_path: pathlib.Path, body: str) -> list[str]:
    page = tmp_path / "page.html"
    page.write_text(PAGE.format(body=body))
    return check_site.check_page(check_site.chromium(), tmp_path, page)["problems"]


def test_a_code_block_that_fits_passes(tmp_path):
    assert _problems(tmp_path, _code(SHORT, SHORT)) == []


def test_a_code_block_wider_than_the_column_fails(tmp_path):
    (problem,) = _problems(tmp_path, _code(SHORT, LONG))
    assert "a code block is" in problem and "marks no line" in problem


def test_a_scrolling_block_passes_when_its_marked_lines_are_visible(tmp_path):
    marked = _code(LONG, "tx = wrap(tx)  # (1)", '<span class="hll">z = 2\n</span>' + SHORT)
    assert _problems(tmp_path, marked) == []


def test_a_marked_line_past_the_visible_edge_fails(tmp_path):
    by_marker = _code(SHORT, LONG + "  # (1)")
    by_emphasis = _code(SHORT, f'<span class="hll">{LONG}\n</span>' + SHORT)
    for body in (by_marker, by_emphasis):
        (problem,) = _problems(tmp_path, body)
        assert "a marked line of a code block runs" in problem, problem


def test_a_wide_table_fails_even_folded_in_details(tmp_path):
    cells = "".join(f"<td>column {i} works (oracle)</td>" for i in range(24))
    table = f'<div class="table-wrapper"><table><tr>{cells}</tr></table></div>'
    (problem,) = _problems(tmp_path, f"<details><summary>all</summary>{table}</details>")
    assert "a table is" in problem, problem
