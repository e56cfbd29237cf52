"""Read the package's docstring style as reStructuredText.

The docstrings are Google style (napoleon reads ``Args:``/``Returns:``) and
also use free-form labelled lists, which are not valid reStructuredText as
written::

    Leaves (arrays, change every step):
      scale: the loss scale, ...
      growth_tracker: int32 count ...

This hook runs before napoleon and turns such a block into a paragraph and
a bullet list (``- ``scale``: the loss scale, ...``).  It also joins an
``Args:`` entry whose list of names is wrapped over two lines
(``a, b, c,`` / ``d: text``), which napoleon would otherwise misread.
Docstrings that are already valid are left as they are.
"""

from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx

# napoleon's own section headers: left to napoleon.
NAPOLEON_SECTIONS = {
    "args", "arguments", "parameters", "params", "keyword args", "keyword arguments",
    "other parameters", "kwargs", "returns", "return", "yields", "yield", "raises",
    "raise", "exceptions", "except", "attributes", "methods", "note", "notes", "example",
    "examples", "see also", "references", "todo", "warning", "warnings", "warns",
    "caution", "danger", "error", "hint", "important", "tip", "attention", "seealso",
    "receives", "receive",
}  # fmt: skip

ENTRY = re.compile(r"^(?P<names>[A-Za-z_*][\w*]*(?:, ?[A-Za-z_*][\w*]*)*):\s(?P<text>.*)$")
NAME_LIST_HEAD = re.compile(r"^[A-Za-z_][\w]*(?:, ?[A-Za-z_][\w]*)*,$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _is_section(line: str) -> bool:
    return line.strip().rstrip(":").strip().lower() in NAPOLEON_SECTIONS


def _join_wrapped_names(lines: list[str]) -> list[str]:
    """``a, b,`` followed by a deeper ``c: text`` becomes ``a, b, c: text``."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if (
            NAME_LIST_HEAD.match(line.strip())
            and nxt.strip()
            and _indent(nxt) > _indent(line)
            and ENTRY.match(nxt.strip())
        ):
            out.append(line.rstrip() + " " + nxt.strip())
            i += 2
            continue
        out.append(line)
        i += 1
    return out


def _labelled_lists(lines: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    in_section = False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            out.append(line)
            i += 1
            continue
        if _indent(line) == 0:
            in_section = _is_section(line)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        label_ends = (
            not in_section
            and stripped.endswith(":")
            and not stripped.endswith("::")
            and nxt.strip()
            and _indent(nxt) > _indent(line)
        )
        if not label_ends:
            out.append(line)
            i += 1
            continue
        # The indented block under the label.
        base = _indent(line)
        block: list[str] = []
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > base):
            block.append(lines[j])
            j += 1
        while block and not block[-1].strip():
            block.pop()
        entry_indent = _indent(block[0])
        entries = [ln for ln in block if ln.strip() and _indent(ln) == entry_indent]
        if not all(ENTRY.match(ln.strip()) for ln in entries):
            out.append(line)
            i += 1
            continue
        pad = " " * base
        out.append(line)
        out.append("")
        for ln in block:
            if not ln.strip():
                out.append("")
            elif _indent(ln) == entry_indent:
                m = ENTRY.match(ln.strip())
                assert m is not None
                names = ", ".join(f"``{n.strip()}``" for n in m["names"].split(","))
                out.append(f"{pad}- {names}: {m['text']}")
            else:
                out.append(f"{pad}  {ln.strip()}")
        out.append("")
        i = j
    return out


def normalise(lines: list[str]) -> list[str]:
    return _labelled_lists(_join_wrapped_names(lines))


def process(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    lines[:] = normalise(lines)


def setup(app: Sphinx) -> dict[str, Any]:
    # Before napoleon (priority 500), which reads the joined Args entries.
    app.connect("autodoc-process-docstring", process, priority=400)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
