"""The layering check on the package's own source (it reads, never imports, it).

Usage: ``python tools/layering.py [ROOT]`` (ROOT holds ``jax_amp_scale/``;
default ``.``).  ``.ci/run`` runs it in the lint step.

Counts, over every module of jax_amp_scale/ (recursively):

- private names taken from another module of the package:
  ``from jax_amp_scale.x import _y`` where ``_y`` is not itself a module, or
  ``mod._y`` where ``mod`` is an imported module of the package (importing a
  private module is fine; taking its private names is not);
- test hooks defined in the package (functions or classes whose name says
  test).

- imports against the order of the layers: a module imports only modules of
  its own layer or of the layers below (`LAYERS`, bottom first; a top-level
  module or folder not listed is the public layer, on top);
- import cycles between the package's modules (function-level imports
  included).

Imports of JAX's private modules (``jax._src``) are printed as informational,
not counted: reading JAX internals may be unavoidable (say, to find the
plugin library JAX loaded); patching them at import is what the project
forbids, and those lines are read by hand.

Prints each finding, then ``layering: N findings`` last; exits 1 when N > 0.
The package's folders are its layers (ARCHITECTURE.md).
"""

from __future__ import annotations

import ast
import pathlib
import sys

PACKAGE = "jax_amp_scale"
# The layers, bottom first: the package's folders (ARCHITECTURE.md).  Every
# other module (the top-level ones, interop/) is the public layer, on top.
LAYERS = ("mechanisms", "operators", "training")


def _is_package_module(root: pathlib.Path, module: str, name: str) -> bool:
    sub = root.joinpath(*module.split("."), name)
    return sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _says_test(name: str) -> bool:
    return "test" in name.lower() and not name.startswith("__")


def _imports(node: ast.AST, root: pathlib.Path, rel: pathlib.Path, aliases: set[str]) -> list[str]:
    """Findings of one import statement; adds the package modules it binds to `aliases`."""
    found = []
    if isinstance(node, ast.ImportFrom) and node.module:
        mod = node.module
        if node.level and not mod.startswith(PACKAGE):
            mod = f"{PACKAGE}.{mod}"
        if mod.startswith(PACKAGE):
            for a in node.names:
                if _is_package_module(root, mod, a.name):
                    aliases.add(a.asname or a.name)  # a module of the package: fine
                elif _private(a.name):
                    found.append(f"{rel}:{node.lineno}: from {node.module} import {a.name}")
        if mod.startswith("jax._src"):
            found.append(f"{rel}:{node.lineno}: imports JAX private {mod}")
    elif isinstance(node, ast.Import):
        for a in node.names:
            if a.name.startswith("jax._src"):
                found.append(f"{rel}:{node.lineno}: imports JAX private {a.name}")
            if a.name.startswith(PACKAGE):
                aliases.add(a.asname or a.name.split(".")[0])
    elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and _says_test(node.name):
        found.append(f"{rel}:{node.lineno}: test hook '{node.name}' ships in the package")
    return found


def _attributes(tree: ast.AST, rel: pathlib.Path, aliases: set[str]) -> list[str]:
    """``mod._name`` on a package module, and ``jax._src``."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            continue
        owner = node.value.id
        if _private(node.attr) and owner in aliases and owner != "self":
            found.append(f"{rel}:{node.lineno}: {owner}.{node.attr}")
        if node.attr == "_src" and owner == "jax":
            found.append(f"{rel}:{node.lineno}: uses jax._src")
    return found


def _module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    """The layer of a package module: its index in `LAYERS`, else the public layer."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return len(LAYERS)


def _imported_modules(tree: ast.AST, root: pathlib.Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every package module an import statement names."""
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                names.append(sub if _is_package_module(root, node.module, a.name) else node.module)
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith(PACKAGE + ".")]
        for name in names:
            if (root / name.replace(".", "/")).with_suffix(".py").exists() or (
                root / name.replace(".", "/") / "__init__.py"
            ).exists():
                out.append((node.lineno, name))
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`, each once, as module lists."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycle = path[path.index(nxt) :]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    found.append([*cycle, nxt])
            elif len(path) < 12:
                walk(nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, [start])
    return found


def findings(root: pathlib.Path) -> list[str]:
    """Every finding under `root`/jax_amp_scale, informational ones included."""
    package = root / PACKAGE
    out = []
    graph: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(root)
        tree = ast.parse(path.read_text(), str(rel))
        aliases: set[str] = set()
        for node in ast.walk(tree):
            out += _imports(node, root, rel, aliases)
        out += _attributes(tree, rel, aliases)
        me = _module_name(root, path)
        for line, other in _imported_modules(tree, root):
            if other in (me, PACKAGE):
                continue
            if me != PACKAGE:  # __init__ of the package: the public surface, may import anything
                graph.setdefault(me, set()).add(other)
            if _layer(other) > _layer(me):
                out.append(f"{rel}:{line}: imports {other}, a layer above {me}")
    for cycle in _cycles(graph):
        out.append("import cycle: " + " -> ".join(cycle))
    return out


def main(argv: list[str]) -> int:
    root = pathlib.Path(argv[1] if len(argv) > 1 else ".")
    every = findings(root)
    info = [f for f in every if "JAX private" in f or "jax._src" in f]
    counted = [f for f in every if f not in info]
    for f in info:
        print("(informational)", f)
    for f in counted:
        print(f)
    print(f"layering: {len(counted)} findings")
    return 0 if not counted else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
