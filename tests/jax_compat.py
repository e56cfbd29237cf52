"""What differs across the supported jax range (0.6.0 and later; CI runs 0.6.0, 0.10 and the newest), for tests."""

from __future__ import annotations

import jax
from jax import export

# jax < 0.7 lowers every lax.platform_dependent branch, the ones for other
# platforms included (dead code there), so a custom call of the CPU branch
# appears in a program exported for other platforms.
BEFORE_0_7 = tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 7)
LOWERS_EVERY_BRANCH = BEFORE_0_7

# jax 0.6 refuses to call an artifact serialized by a newer jax for any
# number of devices (nr_devices 0): "exported for 0 devices and is called in
# a context with 1 devices".
CALLS_ARTIFACTS_OF_NEWER_JAX = not BEFORE_0_7
ARTIFACT_DEVICES = (
    "jax < 0.7 cannot call the committed artifacts, which a newer jax serialized "
    "for any number of devices (ValueError: exported for 0 devices)"
)

# What jax 0.6 itself cannot do, found running tests/multidevice against it.
GRAD_OF_VARYING_LOSS = (
    "jax < 0.7: jax.grad of a loss typed as varying inside shard_map fails in jax "
    "itself (ValueError: unexpected JAX type for argument to vjp function), "
    "library or not"
)
VMAP_SELECT_EXPLICIT = (
    "jax < 0.7 (explicit sharding experimental): vmap of a select over an "
    "explicitly sharded population raises ShardingTypeError (select cases must "
    "have the same shardings)"
)


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
        for t in ("jas_update_scale_v2", "jas_unscale_and_check_v1")
    ]
    return export.export(jax.jit(fn), platforms=platforms, disabled_checks=checks)(*args)


def reshard(x, spec):
    """`jax.sharding.reshard` (jax >= 0.7) or `jax.experimental.shard.reshard`."""
    if hasattr(jax.sharding, "reshard"):
        return jax.sharding.reshard(x, spec)
    from jax.experimental.shard import reshard as experimental_reshard

    return experimental_reshard(x, spec)


def pcast_varying(x, axes):
    """`x` typed as varying over `axes` inside shard_map: `lax.pcast(to="varying")`
    (jax >= 0.8) or `lax.pvary` before it."""
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, axes, to="varying")
    return jax.lax.pvary(x, axes)


EXPLICIT_NATIVE_PASS = (
    "jax < 0.7 (explicit sharding experimental): the partitioned native pass's "
    "flag all-reduce lowers with sharding constraints XLA cannot translate when a "
    "mesh with explicit axes is set; there 'auto' takes the reference and 'ffi' "
    "refuses explicitly sharded leaves"
)


def enable_x64(enabled=True):
    """`jax.enable_x64` (jax >= 0.8) or `jax.experimental.enable_x64` before it."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(enabled)
    from jax.experimental import enable_x64 as experimental_enable_x64

    return experimental_enable_x64(enabled)
