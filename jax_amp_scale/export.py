"""Export library steps with `jax.export`: ``jax_amp_scale.export.export(step)``
(docs/guide/export.md)."""

import importlib.util as _util

from jax_amp_scale.lowering.exporting import (
    deserialize,
    export,
    exportable_targets,
    register_handlers,
)

# The optax layer's state types register their serialization names on import:
# a process that only deserializes then knows every library pytree.
if _util.find_spec("optax") is not None:
    import jax_amp_scale.optax  # noqa: F401

__all__ = ["deserialize", "export", "exportable_targets", "register_handlers"]
