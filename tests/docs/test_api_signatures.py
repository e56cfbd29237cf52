"""The API pages' signatures show default values, not the names of constants.

``autodoc_preserve_defaults`` (docs/conf.py) keeps each default as written in
the source, which for ``dynamic_scaler`` was ``init_scale=DEFAULT_INIT_SCALE``:
a reader learns nothing from it.  docs/_ext/api_pages.py turns a constant's
name back into its value.  This builds every public function and class of
the API reference with the site's own conf.py (text builder, one page) and
reads the signatures Sphinx produces.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _public_callables() -> list[str]:
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        from public_api_coverage import PUBLIC_API_MODULES, public_names
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    names = public_names(PUBLIC_API_MODULES)
    seen, found = set(), []
    for qualname, obj in names.items():
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and id(obj) not in seen:
            seen.add(id(obj))
            found.append(qualname)
    return found


@pytest.fixture(scope="module")
def signatures(tmp_path_factory) -> str:
    sphinx = pytest.importorskip("sphinx.application")
    pytest.importorskip("myst_parser")
    pytest.importorskip("furo")
    src = tmp_path_factory.mktemp("src")
    out = tmp_path_factory.mktemp("out")
    lines = ["API", "===", ""]
    for qualname in _public_callables():
        obj = eval_name(qualname)
        directive = "autoclass" if inspect.isclass(obj) else "autofunction"
        lines += [f".. {directive}:: {qualname}", "   :no-index:", ""]
    (src / "index.rst").write_text("\n".join(lines))
    app = sphinx.Sphinx(
        srcdir=str(src),
        confdir=str(DOCS),
        outdir=str(out),
        doctreedir=str(out / ".doctrees"),
        buildername="text",
        confoverrides={"public_api_modules": [], "nitpicky": False},
        status=None,
        warning=None,
        freshenv=True,
    )
    app.build(force_all=True)
    return (out / "index.txt").read_text()


def eval_name(qualname: str):
    import importlib

    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_constant_defaults_render_as_values(signatures):
    import jax_amp_scale as jas

    sig = re.search(r"^jax_amp_scale\.dynamic_scaler\((.*?)\)$", signatures, re.M | re.S)
    assert sig, signatures[:2000]
    text = " ".join(sig.group(1).split())
    state = jas.init_scale_state()
    assert f"init_scale={float(state.scale)!r}" in text, text
    assert f"growth_interval={int(state.growth_interval)!r}" in text, text
    assert "rule='torch'" in text, text
    assert "jnp.float32" in text, text  # dtypes stay as written


def test_no_signature_shows_a_constant_s_name(signatures):
    # Every signature line: the functions and classes, and their methods (indented).
    heads = [x for x in signatures.splitlines() if re.match(r"^\s*(class )?[\w.]+\(.*\)", x)]
    assert len(heads) >= 20, heads
    named = [x for x in heads if re.search(r"=\s*[A-Z][A-Z0-9_]{2,}\b", x)]
    assert not named, "\n".join(named)
