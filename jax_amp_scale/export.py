"""Export library steps with `jax.export`: ``jax_amp_scale.export.export(step)``.

See `jax_amp_scale.lowering.exporting` and docs/guide/export.md.
"""

from jax_amp_scale.lowering.exporting import (
    deserialize,
    export,
    exportable_targets,
    register_handlers,
)

__all__ = ["deserialize", "export", "exportable_targets", "register_handlers"]
