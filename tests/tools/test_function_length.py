"""No function in the package is over 60 lines (def line through last line,
docstring included): a longer one is split into named private helpers."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "jax_amp_scale"
LIMIT = 60


def long_functions(root: pathlib.Path, limit: int = LIMIT) -> list[str]:
    """``path:line name (n lines)`` for each function under `root` over `limit` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > limit:
                    rel = path.relative_to(root.parent)
                    found.append(f"{rel}:{node.lineno} {node.name} ({n} lines)")
    return found


def test_no_function_in_the_package_is_over_60_lines():
    assert PACKAGE.is_dir()
    found = long_functions(PACKAGE)
    assert not found, f"over {LIMIT} lines (split into private helpers):\n" + "\n".join(found)


def test_the_check_finds_a_long_function_nested_or_async(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    body = "".join(f"    x{i} = {i}\n" for i in range(59))  # def + 59 lines: 60, allowed
    (pkg / "ok.py").write_text(f"def fine():\n{body}")
    nested = "class C:\n    async def slow(self):\n" + "".join(
        f"        x{i} = {i}\n" for i in range(60)
    )
    (pkg / "sub" / "long.py").write_text(nested)
    inner = "def outer():\n    def inner():\n" + "".join(f"        y{i} = {i}\n" for i in range(61))
    (pkg / "sub" / "inner.py").write_text(inner)
    assert long_functions(pkg) == [
        "pkg/sub/inner.py:1 outer (63 lines)",
        "pkg/sub/inner.py:2 inner (62 lines)",
        "pkg/sub/long.py:2 slow (61 lines)",
    ]
