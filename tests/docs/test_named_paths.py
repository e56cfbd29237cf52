"""Every path of this repository named in the package's comments and
docstrings, the C++ sources, the tools, the tests, the examples, bench/,
the docs pages, README.md and ARCHITECTURE.md exists.  CHANGELOG.md is
history and may name old paths.

A path is a run of ``name/`` parts ending in a file with a known suffix,
whose first part is a folder of the repository (or of the package: the
package's own modules are often named from inside it, ``operators/...``).
"""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "jax_amp_scale"
TOP = ("jax_amp_scale", "ffi", "plugin", "tests", "bench", "docs", "tools", "examples", ".ci")
INSIDE = ("mechanisms", "operators", "training", "interop")
# Files the repository's programs write (the GPU check's results), named
# before they exist.
WRITTEN = {
    "bench/RESULTS-gpu.md",
    "results/gpu/bench.json",
    "bench/gpu/log.txt",
}
PATH = re.compile(
    r"(?<![\w./-])((?:" + "|".join(re.escape(t) for t in TOP + INSIDE) + r")/[\w./-]*?"
    r"\.(?:py|h|cc|cu|md|sh|txt|png|json|toml|rst|cfg))(?![\w])"
)


def _sources() -> list[pathlib.Path]:
    files = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "pyproject.toml"]
    files += sorted(p for p in (ROOT / ".ci").glob("*") if p.is_file())
    for folder, pattern in (
        ("jax_amp_scale", "**/*.py"),
        ("ffi", "*"),
        ("plugin", "*"),
        ("tools", "*.py"),
        ("tests", "**/*.py"),
        ("examples", "*.py"),
        ("bench", "*.py"),
        ("bench", "*.sh"),
        ("bench", "*.md"),
        ("docs", "**/*.md"),
        ("docs", "**/*.rst"),
    ):
        files += sorted(p for p in (ROOT / folder).glob(pattern) if p.is_file())
    return [f for f in files if "_build" not in f.parts]


def _exists(named: str) -> bool:
    named = named.rstrip(".")
    if named in WRITTEN or (ROOT / named).exists():
        return True
    return named.split("/")[0] in INSIDE and (PACKAGE / named).exists()


def named_paths(text: str) -> list[str]:
    return [m.rstrip(".") for m in PATH.findall(text)]


def prose(path: pathlib.Path) -> str:
    """What a reader reads as words: a page whole; of code, its comments and
    docstrings (a string a program builds, say a temporary path, is not a
    claim about the repository)."""
    text = path.read_text()
    if path.suffix == ".py":
        parts = [
            t.string
            for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type == tokenize.COMMENT
        ]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                parts.append(ast.get_docstring(node) or "")
        return "\n".join(parts)
    if path.suffix in (".sh", ".toml") or path.parent.name == ".ci":
        return "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
    return text


def test_the_pattern_finds_paths():
    text = "see `ffi/update_scale.h`, operators/update_scale.py and tests/x/y_test.py."
    assert named_paths(text) == [
        "ffi/update_scale.h",
        "operators/update_scale.py",
        "tests/x/y_test.py",
    ]
    assert not _exists("tests/x/y_test.py")
    assert _exists("operators/update_scale.py")


def test_code_counts_by_its_comments_and_docstrings(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""Reads ffi/a.h."""\n# and ffi/b.h\nx = "ffi/c.h"\n')
    assert sorted(named_paths(prose(src))) == ["ffi/a.h", "ffi/b.h"]


@pytest.mark.parametrize("source", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_exists(source):
    missing = sorted({p for p in named_paths(prose(source)) if not _exists(p)})
    assert not missing, f"{source.relative_to(ROOT)} names paths that do not exist: {missing}"
