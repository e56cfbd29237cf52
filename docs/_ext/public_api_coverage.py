"""Fail the docs build when a public name has no entry in the API reference.

Every name in the ``__all__`` of the modules listed in ``public_api_modules``
(conf.py) must be documented by an autodoc (or ``py:``) directive, under its
public name or under another public name bound to the same object (a
re-export documented once).  Each missing name is a Sphinx warning, so
``sphinx -W`` fails and ``--keep-going`` lists them all.  optax's docs run
the same kind of check.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Sphinx is imported only by the build (tests import this without it)
    from sphinx.application import Sphinx
    from sphinx.environment import BuildEnvironment

# The public modules: the package and the submodules a user imports.  conf.py
# passes this list as ``public_api_modules``; tests/test_docs.py reads it too.
PUBLIC_API_MODULES = [
    "jax_amp_scale",
    "jax_amp_scale.optax",
    "jax_amp_scale.plugin",
    "jax_amp_scale.interop",
    "jax_amp_scale.policy",
]


def public_names(modules: list[str]) -> dict[str, Any]:
    """``{"module.name": object}`` for every name in each module's ``__all__``."""
    names: dict[str, Any] = {}
    for modname in modules:
        module = importlib.import_module(modname)
        exported = getattr(module, "__all__", None)
        if exported is None:
            raise ValueError(f"public_api_modules: {modname} has no __all__")
        for name in exported:
            names[f"{modname}.{name}"] = getattr(module, name)
    return names


def undocumented(modules: list[str], documented: set[str]) -> list[str]:
    """The public names (``module.name``) with no documented alias, sorted."""
    names = public_names(modules)
    by_object: dict[int, set[str]] = {}
    for qualname, obj in names.items():
        by_object.setdefault(id(obj), set()).add(qualname)
    return sorted(
        qualname for qualname, obj in names.items() if not (by_object[id(obj)] & documented)
    )


def check(app: Sphinx, env: BuildEnvironment) -> None:
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    modules = list(app.config.public_api_modules)
    if not modules:
        return
    documented = set(env.get_domain("py").objects)  # type: ignore[attr-defined]
    missing = undocumented(modules, documented)
    for qualname in missing:
        logger.warning(
            "public name %s is not documented in the API reference "
            "(add an autodoc directive for it under docs/api/)",
            qualname,
            type="public_api",
            subtype="undocumented",
        )
    total = len(public_names(modules))
    logger.info("public API coverage: %d of %d names documented", total - len(missing), total)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("public_api_modules", [], "env")
    app.connect("env-check-consistency", check)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
