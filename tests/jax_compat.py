"""What differs across the supported jax range (0.6.0 ... 0.10), for tests."""

from __future__ import annotations

import jax
from jax import export

# jax < 0.7 lowers every lax.platform_dependent branch, the ones for other
# platforms included (dead code there), so a custom call of the CPU branch
# appears in a program exported for other platforms.
LOWERS_EVERY_BRANCH = tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 7)


def set_mesh(mesh):
    """`jax.set_mesh` (jax >= 0.7) or `jax.sharding.use_mesh` before it."""
    if hasattr(jax, "set_mesh"):
        return jax.set_mesh(mesh)
    return jax.sharding.use_mesh(mesh)


def shard_map(f, *, mesh, in_specs, out_specs, check_vma=True, **kwargs):
    """`jax.shard_map` (jax >= 0.7) or the experimental one before it (check_rep)."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(
            f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma, **kwargs
        )
    from jax.experimental.shard_map import shard_map as experimental_shard_map

    return experimental_shard_map(
        f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=check_vma, **kwargs
    )


def export_for(fn, platforms, *args):
    """`jax.export` of `fn` for `platforms`, our custom calls allowed in dead branches."""
    checks = [
        export.DisabledSafetyCheck.custom_call(t)
        for t in ("jas_update_scale", "jas_unscale_and_check")
    ]
    return export.export(jax.jit(fn), platforms=platforms, disabled_checks=checks)(*args)
