"""What the API pages show: public type names, each field once, words for every parameter.

- Types whose class lives in a private module (``jaxlib._jax.Array``,
  ``optax._src.base.GradientTransformation``, ...) are shown and linked
  under their public name (``jax.Array``, ``optax.GradientTransformation``).
- A named tuple's fields are described once, by its docstring's
  ``Attributes:``; the "Alias for field number N" entries namedtuple
  generates are left out.
- `name` in a docstring (the default role) links when it names a
  documented object, by its full name or by its last component
  (`Trainer`, `ScaleState`), and is plain code otherwise (a parameter, an
  expression): that is not a broken link, and the nitpicky build does not
  report it.  Explicit roles (:class:`...`) are still reported.
- Every parameter of a documented function has words: from its docstring's
  ``Args:``, or, until the docstring has them, from `PARAMETER_WORDS`
  below.  A parameter with neither fails the build (a warning under -W).
- A default that is a named constant shows its value: ``init_scale=65536.0``,
  not ``init_scale=DEFAULT_INIT_SCALE`` (``autodoc_preserve_defaults``
  keeps the other defaults as written: ``jnp.float32``, ``2.0**-24``).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from sphinx.domains.python import PyXRefRole
from sphinx.util import logging

logger = logging.getLogger(__name__)

# Words for parameters whose docstrings have none yet (each a docstring
# defect of the package, reported upstream); the build uses them and says
# nothing, so they stay honest only while they match the code.
PARAMETER_WORDS: dict[str, dict[str, str]] = {
    "jax_amp_scale.optax.optimizer_step": {
        "tx": "the optax transformation to apply (any optimizer or chain).",
        "grads": "the unscaled gradients, a pytree like ``params``.",
        "opt_state": "``tx``'s state, returned unchanged on a skipped step.",
        "params": "the parameters, returned unchanged on a skipped step.",
        "found_inf": "a scalar bool (or 0/1) array: True skips the step.",
        "extra_args": "forwarded to ``tx.update`` (optax's extra arguments).",
    },
}


def _public_type_names() -> dict[tuple[str, str], str]:
    """(__module__, __qualname__) of classes defined privately -> public name."""
    import jax
    import jax.export

    names = {
        (jax.Array.__module__, jax.Array.__qualname__): "jax.Array",
        (jax.export.Exported.__module__, jax.export.Exported.__qualname__): "jax.export.Exported",
        (
            jax.export.DisabledSafetyCheck.__module__,
            jax.export.DisabledSafetyCheck.__qualname__,
        ): "jax.export.DisabledSafetyCheck",
    }
    try:
        import optax
    except ImportError:
        return names
    for public in dir(optax):
        obj = getattr(optax, public)
        module = getattr(obj, "__module__", "") or ""
        if inspect.isclass(obj) and module.startswith("optax._src"):
            names[module, obj.__qualname__] = f"optax.{public}"
    return names


def _register_public_type_names() -> None:
    import sphinx.util.typing as typing_util

    table = getattr(typing_util, "_INVALID_BUILTIN_CLASSES", None)
    if isinstance(table, dict):
        table.update(_public_type_names())


class SoftPyXRefRole(PyXRefRole):
    """py:obj that falls back to plain code (see the module docstring)."""

    def result_nodes(self, document, env, node, is_ref):  # type: ignore[override]
        node["jas_soft"] = True
        return super().result_nodes(document, env, node, is_ref)


def _resolve_soft(app, env, node, contnode) -> Any:
    if not node.get("jas_soft") or node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    target = node.get("reftarget", "")
    # By its last component, among the documented objects of this package;
    # the top-level re-export first (jax_amp_scale.Trainer), then the shortest.
    last = target.rsplit(".", 1)[-1]
    candidates = sorted(
        (
            name
            for name in domain.objects
            if name.startswith("jax_amp_scale") and name.rsplit(".", 1)[-1] == last
        ),
        key=lambda n: (n.count("."), n),
    )
    if candidates:
        found = domain.resolve_xref(
            env, node.get("refdoc", ""), app.builder, "obj", candidates[0], node, contnode
        )
        if found is not None:
            return found
    return contnode  # plain code: a parameter, an expression, an external name


def _skip_namedtuple_fields(app, what, name, obj, skip, options) -> bool | None:
    doc = getattr(obj, "__doc__", None) or ""
    if doc.startswith("Alias for field number"):
        return True
    return None


def _documented_params(lines: list[str]) -> set[str]:
    found = set()
    for line in lines:
        stripped = line.strip()
        for tag in (":param ", ":keyword ", ":ivar ", ":var "):
            if stripped.startswith(tag):
                name = stripped[len(tag) :].split(":", 1)[0].split()[-1]
                found.add(name.replace("\\", "").lstrip("*"))
    return found


def _words_for_every_parameter(app, what, name, obj, options, lines) -> None:
    if what not in ("function", "method") or not callable(obj):
        return
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return
    wanted = [p.name for p in signature.parameters.values() if p.name not in ("self", "cls")]
    documented = _documented_params(lines)
    extra = PARAMETER_WORDS.get(name, {})
    missing = []
    for param in wanted:
        if param in documented:
            continue
        if param in extra:
            kind = signature.parameters[param].kind
            star = {inspect.Parameter.VAR_KEYWORD: r"\*\*", inspect.Parameter.VAR_POSITIONAL: r"\*"}
            star = star.get(kind, "")
            lines.append(f":param {star}{param}: {extra[param]}")
        else:
            missing.append(param)
    if missing and app.config.api_pages_require_parameter_words:
        logger.warning(
            "%s: no words for parameter(s) %s (add Args: to the docstring, or to "
            "docs/_ext/api_pages.py PARAMETER_WORDS meanwhile)",
            name,
            ", ".join(missing),
            type="api_pages",
            subtype="parameter_words",
        )


# A default written as a module constant's name (DEFAULT_INIT_SCALE, UPDATE_SCALE).
_CONSTANT_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def _actual_defaults(func: Any) -> dict[str, Any]:
    """``{parameter: default value}`` of a plain function, read from the
    function itself (its ``__signature__`` may hold preserved source text)."""
    code = getattr(func, "__code__", None)
    if code is None:
        return {}
    positional = code.co_varnames[: code.co_argcount]
    values = tuple(getattr(func, "__defaults__", None) or ())
    found = dict(zip(positional[len(positional) - len(values) :], values, strict=True))
    found.update(getattr(func, "__kwdefaults__", None) or {})
    return found


def _values_for_named_defaults(app, obj, bound_method) -> None:
    """After ``autodoc_preserve_defaults`` has put the source text of each
    default in ``obj.__signature__``: a constant's name becomes its value."""
    signature = getattr(obj, "__signature__", None)
    if not isinstance(signature, inspect.Signature):
        return
    from sphinx.ext.autodoc.preserve_defaults import DefaultValue

    actual = _actual_defaults(inspect.unwrap(getattr(obj, "__func__", obj)))
    params = []
    for param in signature.parameters.values():
        default = param.default
        if (
            isinstance(default, DefaultValue)
            and _CONSTANT_NAME.fullmatch(repr(default))
            and param.name in actual
        ):
            param = param.replace(default=DefaultValue(repr(actual[param.name])))
        params.append(param)
    signature = signature.replace(parameters=params)
    try:
        obj.__signature__ = signature
    except AttributeError:  # a bound method: as autodoc itself does
        obj.__dict__["__signature__"] = signature


def setup(app):
    _register_public_type_names()
    app.add_role_to_domain("py", "softobj", SoftPyXRefRole())
    app.add_config_value("api_pages_require_parameter_words", True, "env")
    app.connect("autodoc-skip-member", _skip_namedtuple_fields)
    app.connect("autodoc-before-process-signature", _values_for_named_defaults)
    # After napoleon (priority 500) has turned Args: into :param: fields.
    app.connect("autodoc-process-docstring", _words_for_every_parameter, priority=600)
    app.connect("missing-reference", _resolve_soft, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
