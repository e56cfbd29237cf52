"""Sphinx configuration for jax-amp-scale's documentation.

Build (warnings are errors, as in CI)::

    python -m sphinx -n -W --keep-going -b html docs docs/_build/html

The pages' ```python blocks run as tests: ``python -m pytest tests/test_docs.py``.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

# autodoc imports the package; keep JAX on the host CPU and quiet.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import local_inventories  # noqa: E402
from public_api_coverage import PUBLIC_API_MODULES  # noqa: E402

import jax_amp_scale  # noqa: E402

project = "jax-amp-scale"
author = "The jax-amp-scale authors"
copyright = "2026, the jax-amp-scale authors"
release = version = jax_amp_scale.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "docstring_style",
    "public_api_coverage",
    "api_pages",
    "figures_role",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "Thumbs.db", ".DS_Store", "_facts.toml"]

# `name` in docstrings (single backticks) is a cross-reference when it
# resolves (also by its last component: `Trainer`), plain code when it does
# not (a parameter name): docs/_ext/api_pages.py.
default_role = "py:softobj"

# CI builds with -n (nitpicky): every explicit cross-reference must resolve.
nitpicky = True

# jax, optax, numpy, flax and Python: the build machines cannot fetch their
# objects.inv, so small local inventories of the names these pages use, with
# the real URLs, are written at build time (docs/_ext/local_inventories.py).
intersphinx_mapping = local_inventories.write(Path(tempfile.mkdtemp(prefix="jas-inv-")))

# Every parameter of a documented function has words (docs/_ext/api_pages.py):
# a parameter missing from its docstring's Args: is a build warning (an error
# under -W).
api_pages_require_parameter_words = True

# External names with no entry in the local inventories: dtype defaults shown
# as written in code (jnp.float32), whose jax page has no stable anchor.
nitpick_ignore = [("py:class", "jax.numpy.float32")]

# Markdown pages (MyST): ::: fences, definition lists, heading anchors for
# links such as operator.md#whose-arithmetic.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The API reference: the public names are documented where the package's
# __init__ re-exports them, not where they are defined.
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "description"
# Types go beside the parameters the docstring describes (a named tuple's
# fields, described under Attributes:, are not listed again as Parameters).
autodoc_typehints_description_target = "documented"
autodoc_typehints_format = "short"
# Defaults as written in the code (jnp.float32, 2.0**-24), not their repr
# (<class jax.numpy.float32>); except a named constant (DEFAULT_INIT_SCALE),
# shown by its value (65536.0): docs/_ext/api_pages.py.
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes:" as fields: autodoc lists the members itself

# The check that fails the build when a public name has no entry in the API
# reference (docs/_ext/public_api_coverage.py).
public_api_modules = PUBLIC_API_MODULES

html_theme = "furo"
html_title = f"jax-amp-scale {release}"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": True,
}


# A dataclass's generated __init__ has no source for autodoc_preserve_defaults
# to read, so its defaults print as repr(): "<class 'jax.numpy.float32'>".
# Show them as written in code.
_DTYPE_REPR = re.compile(r"<class '(?:jax\.numpy|numpy)\.(\w+)'>")


def _dtypes_as_written(app, what, name, obj, options, signature, return_annotation):
    if signature:
        signature = _DTYPE_REPR.sub(r"jnp.\1", signature)
    return signature, return_annotation


def setup(app):
    app.connect("autodoc-process-signature", _dtypes_as_written)
