"""What a release promises, read from pyproject.toml and tools/build_wheel.py.

One source for each fact: the jaxlib the build pins is the oldest the
package accepts and the one whose FFI API version the modules carry
(tests/public/test_installed_wheel.py checks the stamp itself); the Python
versions the classifiers name are the wheels tools/build_wheel.py builds;
the extras hold what the examples and the docs build import.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.public.test_installed_wheel import OLDEST_JAXLIB

tomllib = pytest.importorskip("tomllib")
ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def _requirements(names: list[str]) -> dict[str, Requirement]:
    return {(r := Requirement(n)).name: r for n in names}


def _build_wheel_module():
    spec = importlib.util.spec_from_file_location("build_wheel", ROOT / "tools" / "build_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_pins_the_oldest_supported_jaxlib():
    build = _requirements(PYPROJECT["build-system"]["requires"])
    assert str(build["jaxlib"].specifier) == f"=={OLDEST_JAXLIB}"
    deps = _requirements(PROJECT["dependencies"])
    for name in ("jax", "jaxlib"):
        # The floor is the pinned build jaxlib; no ceiling: any later jax.
        assert str(deps[name].specifier) == f">={OLDEST_JAXLIB}", deps[name]


def test_any_current_jax_satisfies_the_requirements():
    deps = _requirements(PROJECT["dependencies"])
    for version in ("0.6.0", "0.10.2", "0.11.2", "0.12.0", "1.0.0"):
        assert deps["jax"].specifier.contains(version) and deps["jaxlib"].specifier.contains(
            version
        )
    assert not deps["jax"].specifier.contains("0.5.3")


def test_classifiers_name_the_pythons_the_wheels_are_built_for():
    pythons = _build_wheel_module().PYTHONS
    named = sorted(
        c.rsplit(":: ", 1)[1]
        for c in PROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert named == sorted(pythons, key=lambda v: tuple(map(int, v.split("."))))
    # The range the build can honour: the built Pythons, and no later one
    # (jaxlib 0.6.0, the oldest supported, has no wheel past them).
    last = pythons[-1].split(".")
    assert PROJECT["requires-python"] == f">={pythons[0]},<{last[0]}.{int(last[1]) + 1}"
    assert "Operating System :: POSIX :: Linux" in PROJECT["classifiers"]
    assert any(c.startswith("Development Status ::") for c in PROJECT["classifiers"])
    # SPDX expression (PEP 639), not the legacy table; no license classifier beside it.
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert not any(c.startswith("License ::") for c in PROJECT["classifiers"])


def _third_party_imports(paths: list[Path]) -> set[str]:
    local = {p.stem for p in paths} | {"jax_amp_scale"}
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - local - set(sys.stdlib_module_names)


def test_the_examples_extra_holds_what_the_examples_import():
    extra = _requirements(PROJECT["optional-dependencies"]["examples"])
    base = _requirements(PROJECT["dependencies"])
    imports = _third_party_imports(sorted((ROOT / "examples").glob("*.py")))
    assert imports, "no imports found in examples/"
    assert imports <= set(extra) | set(base), imports - set(extra) - set(base)
    assert str(extra["torch"].specifier) == "==2.13.0"  # the version the examples' numbers are from


def test_the_docs_extra_holds_what_the_docs_build_imports():
    """autodoc and docs/_ext/public_api_coverage.py import every public module."""
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        from public_api_coverage import PUBLIC_API_MODULES
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    docs = _requirements(PROJECT["optional-dependencies"]["docs"])
    assert {"sphinx", "furo", "myst-parser"} <= set(docs)
    if "jax_amp_scale.optax" in PUBLIC_API_MODULES:
        assert "optax" in docs
