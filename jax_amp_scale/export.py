"""`jax.export` of steps that call the library's native handlers: `export`, `deserialize`.

The library gives its custom calls the compatibility guarantee JAX asks for
(every target name is versioned, ffi/targets.h, and stays served;
docs/guide/export.md), so `export` disables JAX's check for exactly those names
(`exportable_targets`), and `deserialize` registers the handlers first (a fresh
process has not).  Serializing needs ``flatbuffers`` (the ``export`` extra).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import export as jax_export

from jax_amp_scale.mechanisms import custom_call, handlers

__all__ = ["deserialize", "export", "exportable_targets", "register_handlers"]

# The optax layer's state types register their serialization names on import:
# a process that only deserializes then knows every library pytree.
if importlib.util.find_spec("optax") is not None:
    import jax_amp_scale.optax  # noqa: F401


def exportable_targets() -> tuple[str, ...]:
    """Every FFI target name of this library that a serialized program may
    call, sorted."""
    return tuple(sorted(handlers.served_targets()))


def register_handlers() -> None:
    """Registers the native handlers with XLA (idempotent).

    Running a deserialized artifact that calls them needs this first in a
    process that has not run a library step yet; `deserialize` does it.
    """
    for op in handlers.OPERATORS:
        handlers.platforms(op)


def export(
    fun: Callable[..., Any],
    *,
    platforms: Sequence[str] | None = None,
    disabled_checks: Sequence[jax_export.DisabledSafetyCheck] = (),
    **kwargs: Any,
) -> Callable[..., jax_export.Exported]:
    """`jax.export.export(fun, ...)` with the library's custom calls allowed.

    `loss_scaled`'s host reports do not serialize (a ValueError says so):
    build the step with ``host_reports=False``.  With several devices the
    native calls are exported unpartitioned (the same bits), and jit's caches
    are cleared (`jax.clear_caches`) before and after tracing
    (docs/guide/export.md).

    Args:
      fun: the function to export; jitted here unless it is already (has
        ``.lower``).
      platforms: the lowering platforms to export for (``"cpu"``,
        ``"cuda"``, ...), passed to :func:`jax.export.export`; None (default):
        JAX's default backend.
      disabled_checks: more ``jax.export.DisabledSafetyCheck`` entries,
        added to the library's own (one per `exportable_targets` name).
      **kwargs: other keywords, passed to :func:`jax.export.export` as they are.

    Returns:
      A function of `fun`'s arguments that returns the :class:`jax.export.Exported`.
    """
    checks = [jax_export.DisabledSafetyCheck.custom_call(t) for t in exportable_targets()]
    if not hasattr(fun, "lower"):
        fun = jax.jit(fun)
    exporter = jax_export.export(
        fun,  # type: ignore[arg-type]
        platforms=platforms,
        disabled_checks=[*checks, *disabled_checks],
        **kwargs,
    )
    whole = jax.device_count() > 1

    def export_checked(*args: Any, **kw: Any) -> jax_export.Exported:
        try:
            return _traced(exporter, whole, *args, **kw)
        except (ValueError, NotImplementedError) as e:
            # JAX raises either, by version and by how the report lowers (it
            # names the report's target or its host callbacks): ValueError always.
            # Every version of the host report's target name starts so (ffi/targets.h).
            if "jas_host_report" not in str(e) and "host_callbacks" not in str(e):
                raise
            raise ValueError(
                "jax_amp_scale.export: the step holds host reports or callbacks, which do not "
                "serialize; build loss_scaled with host_reports=False "
                f"(docs/guide/export.md).  jax.export said: {e}"
            ) from e

    return export_checked


def _traced(exporter: Callable[..., Any], whole: bool, *args: Any, **kw: Any) -> Any:
    if not whole:
        return exporter(*args, **kw)
    # With several devices the native calls are wrapped in custom_partitioning,
    # whose Python partitioner cannot be serialised: trace them unwrapped.
    # jit's trace cache does not know that switch, so it is cleared before (a
    # partitioned trace of `fun` may be cached) and after (so later steps
    # partition again).
    jax.clear_caches()
    try:
        with custom_call.whole_arrays():
            return exporter(*args, **kw)
    finally:
        jax.clear_caches()


def deserialize(blob: bytes | bytearray) -> jax_export.Exported:
    """`jax.export.deserialize(blob)` after `register_handlers()`.

    Args:
      blob: a serialized artifact, as ``Exported.serialize()`` returns it
        (bytes or bytearray).
    """
    register_handlers()
    return jax_export.deserialize(blob)  # type: ignore[arg-type]
