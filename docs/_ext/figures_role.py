"""The ``{fig}`NAME``` role: a measured figure, by name, from tools/figures.py.

Every figure on the pages comes from a results file that a script wrote
(tools/figures.py says which); a name that no results file gives is a build
error, so deleting a number from a results file fails the docs build.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from docutils import nodes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import figures


def fig_role(name: str, rawtext: str, text: str, lineno: int, inliner: Any, options=None,
             content=None):  # fmt: skip
    try:
        value = figures.fig(text.strip())
    except KeyError as e:
        msg = inliner.reporter.error(str(e), line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    # A provenance line holds `code` spans (a path, a command): literal nodes.
    parts = value.split("`")
    out = [nodes.literal(p, p) if i % 2 else nodes.Text(p) for i, p in enumerate(parts) if p]
    return out, []


def setup(app: Any) -> dict[str, Any]:
    app.add_role("fig", fig_role)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
