"""Export library steps with `jax.export`: ``jax_amp_scale.export.export(step)``.

See `jax_amp_scale.lowering.exporting` and docs/guide/export.md.
Importing this module also imports the optax layer (when optax is
installed), whose state types register their serialization names there:
a process that only deserializes then knows every library pytree.
"""

import importlib.util as _util

from jax_amp_scale.lowering.exporting import (
    deserialize,
    export,
    exportable_targets,
    register_handlers,
)

if _util.find_spec("optax") is not None:
    import jax_amp_scale.optax  # noqa: F401  (registers LossScaledState & co.)

__all__ = ["deserialize", "export", "exportable_targets", "register_handlers"]
