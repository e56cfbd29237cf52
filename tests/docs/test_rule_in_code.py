"""docs/rule-in-code.md names real places: every `file::name` on the page exists.

The page says which Python function and which C++ header must change
together, and which tests bind them; a rename or a move that forgets the
page fails here.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "rule-in-code.md"
NAMED = re.compile(r"`([\w./]+\.(?:py|h|cc|cu))::(\w+)`")


def _python_names(path: pathlib.Path) -> set[str]:
    """Module-level functions, classes and assigned names (constants)."""
    tree = ast.parse(path.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for n in tree.body:
        targets = n.targets if isinstance(n, ast.Assign) else [getattr(n, "target", None)]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _cpp_defines(text: str, name: str) -> bool:
    # A function definition (its name, then its parameters and a body) or a
    # struct/class of that name.
    function = rf"\b{name}\s*\([^;{{]*\)\s*(?:const\s*)?\{{"
    kind = rf"\b(struct|class)\s+{name}\b"
    return re.search(function, text) is not None or re.search(kind, text) is not None


def _defines(path: pathlib.Path, name: str) -> bool:
    if path.suffix == ".py":
        return name in _python_names(path)
    return bool(_cpp_defines(path.read_text(), name))


def _references() -> list[tuple[str, str]]:
    return NAMED.findall(PAGE.read_text())


def test_the_page_names_both_languages_and_tests():
    files = {f for f, _ in _references()}
    assert any(f.startswith("jax_amp_scale/") and f.endswith(".py") for f in files)
    assert any(f.startswith("ffi/") for f in files)
    assert any(f.startswith("tests/") for f in files)


def test_every_named_place_exists():
    missing = []
    for file, name in _references():
        path = ROOT / file
        if not path.is_file():
            missing.append(f"{file} (no such file)")
        elif not _defines(path, name):
            missing.append(f"{file}::{name}")
    assert not missing, "docs/rule-in-code.md names what is not there:\n" + "\n".join(missing)


def test_the_checker_finds_a_missing_name(tmp_path):
    # The check above can fail: a name that is not defined is not found.
    text = (ROOT / "ffi" / "torch_rule.h").read_text()
    assert _cpp_defines(text, "MulByFactor")
    assert not _cpp_defines(text, "MulByFactorX")
    python = _python_names(ROOT / "jax_amp_scale/mechanisms/floats.py")
    assert "torch_product" in python and "torch_product_x" not in python
