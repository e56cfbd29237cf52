"""Small intersphinx inventories for jax, optax, numpy, flax and Python, written locally.

The build machines have no network to those sites, so the real
``objects.inv`` files cannot be fetched.  Instead this module lists, by
hand, the few external names the API pages refer to, each with the public
URL of its entry in that project's documentation, and writes them as
Sphinx inventories (the format ``objects.inv`` uses) for
``intersphinx_mapping``.  A name missing here is not linked, and the
nitpicky build (``sphinx -n``) names it: add it here with its real URL, or
to ``nitpick_ignore`` in conf.py if it has no public entry.

Kept small on purpose: only names the pages use, only URLs whose page and
anchor follow each project's published scheme (autosummary pages for jax,
``api/*.html`` for optax, ``reference/generated`` for numpy).
"""

from __future__ import annotations

import pathlib
import zlib

# project -> (base URL of its documentation, {name: (role, path#anchor)})
INVENTORIES: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "jax": (
        "https://docs.jax.dev/en/latest/",
        {
            "jax.Array": ("py:class", "_autosummary/jax.Array.html#jax.Array"),
            "jax.jit": ("py:function", "_autosummary/jax.jit.html#jax.jit"),
            "jax.grad": ("py:function", "_autosummary/jax.grad.html#jax.grad"),
            "jax.value_and_grad": (
                "py:function",
                "_autosummary/jax.value_and_grad.html#jax.value_and_grad",
            ),
            "jax.vmap": ("py:function", "_autosummary/jax.vmap.html#jax.vmap"),
            "jax.clear_caches": (
                "py:function",
                "_autosummary/jax.clear_caches.html#jax.clear_caches",
            ),
            "jax.export": ("py:module", "jax.export.html#module-jax.export"),
            "jax.export.export": (
                "py:function",
                "_autosummary/jax.export.export.html#jax.export.export",
            ),
            "jax.export.Exported": (
                "py:class",
                "_autosummary/jax.export.Exported.html#jax.export.Exported",
            ),
            "jax.export.DisabledSafetyCheck": (
                "py:class",
                "_autosummary/jax.export.DisabledSafetyCheck.html#jax.export.DisabledSafetyCheck",
            ),
            "jax.export.deserialize": (
                "py:function",
                "_autosummary/jax.export.deserialize.html#jax.export.deserialize",
            ),
            "jax.errors.JaxRuntimeError": (
                "py:class",
                "errors.html#jax.errors.JaxRuntimeError",
            ),
        },
    ),
    "optax": (
        "https://optax.readthedocs.io/en/latest/",
        {
            "optax.GradientTransformation": (
                "py:class",
                "api/transformations.html#optax.GradientTransformation",
            ),
            "optax.GradientTransformationExtraArgs": (
                "py:class",
                "api/transformations.html#optax.GradientTransformationExtraArgs",
            ),
            "optax.TransformInitFn": (
                "py:class",
                "api/transformations.html#optax.TransformInitFn",
            ),
            "optax.TransformUpdateFn": (
                "py:class",
                "api/transformations.html#optax.TransformUpdateFn",
            ),
            "optax.TransformUpdateExtraArgsFn": (
                "py:class",
                "api/transformations.html#optax.TransformUpdateExtraArgsFn",
            ),
            "optax.MultiSteps": ("py:class", "api/optimizer_wrappers.html#optax.MultiSteps"),
            "optax.apply_if_finite": (
                "py:function",
                "api/optimizer_wrappers.html#optax.apply_if_finite",
            ),
        },
    ),
    "numpy": (
        "https://numpy.org/doc/stable/",
        {
            "numpy.ndarray": ("py:class", "reference/generated/numpy.ndarray.html#numpy.ndarray"),
            "numpy.dtype": ("py:class", "reference/generated/numpy.dtype.html#numpy.dtype"),
        },
    ),
    "flax": (
        "https://flax.readthedocs.io/en/latest/",
        {
            "flax.nnx.Optimizer": (
                "py:class",
                "api_reference/flax.nnx/training/optimizer.html#flax.nnx.optimizer.Optimizer",
            ),
            "flax.training.train_state.TrainState": (
                "py:class",
                "api_reference/flax.training.html#flax.training.train_state.TrainState",
            ),
        },
    ),
    "python": (
        "https://docs.python.org/3/",
        {
            f"collections.abc.{name}": (
                "py:class",
                f"library/collections.abc.html#collections.abc.{name}",
            )
            for name in ("Callable", "Hashable", "Iterable", "Mapping", "Sequence")
        }
        | {
            "os.PathLike": ("py:class", "library/os.html#os.PathLike"),
            "typing.Any": ("py:data", "library/typing.html#typing.Any"),
            "FloatingPointError": ("py:exception", "library/exceptions.html#FloatingPointError"),
            "RuntimeWarning": ("py:exception", "library/exceptions.html#RuntimeWarning"),
            "TypeError": ("py:exception", "library/exceptions.html#TypeError"),
            "ValueError": ("py:exception", "library/exceptions.html#ValueError"),
        },
    ),
}


def write(directory: pathlib.Path) -> dict[str, tuple[str, str]]:
    """Writes one inventory per project into `directory`; returns the
    ``intersphinx_mapping`` that reads them."""
    directory.mkdir(parents=True, exist_ok=True)
    mapping = {}
    for project, (base, names) in INVENTORIES.items():
        lines = [f"{name} {role} 1 {uri} -" for name, (role, uri) in sorted(names.items())]
        header = (
            "# Sphinx inventory version 2\n"
            f"# Project: {project}\n"
            "# Version: \n"
            "# The remainder of this file is compressed using zlib.\n"
        ).encode()
        path = directory / f"{project}.inv"
        path.write_bytes(header + zlib.compress(("\n".join(lines) + "\n").encode()))
        mapping[project] = (base, str(path))
    return mapping
