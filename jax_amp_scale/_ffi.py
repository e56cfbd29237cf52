"""The XLA FFI lowering: target registration and the `ffi_call` wrapper.

Native handlers come from optional extension modules that each hand out
capsules (``_native_cpu`` always builds; CUDA and Ascend handlers register
themselves here when present).  `platforms()` says which lowering platforms
have a handler; `update_scale_ffi` lowers to the custom call on those and
to a clear error on the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching, mlir

try:  # jax >= 0.4.36 exposes Primitive through jax.extend
    from jax.extend.core import Primitive
except ImportError:  # pragma: no cover
    from jax.core import Primitive  # type: ignore[attr-defined,no-redef]

TARGET = "jas_update_scale"
# The fused gradient pass (`unscale_and_check`); CPU only for now.
UNSCALE_TARGET = "jas_unscale_and_check"

# Lowering platform name (as `lax.platform_dependent` and `jax.export` spell
# it) -> the name `jax.ffi.register_ffi_target` wants.
_XLA_PLATFORM = {"cpu": "cpu", "cuda": "CUDA", "rocm": "ROCM"}

_registered: set[str] = set()
_unscale_registered: set[str] = set()
_load_errors: dict[str, str] = {}


def register_target(platform: str, capsule: Any, *, xla_platform: str | None = None) -> None:
    """Registers the update-scale handler `capsule` for a lowering platform.

    Idempotent per platform.  Used by the native modules here and by
    `jax_amp_scale.plugin` for PJRT plugin platforms.
    """
    platform = platform.lower()
    if platform in _registered:
        return
    jax.ffi.register_ffi_target(
        TARGET, capsule, platform=xla_platform or _XLA_PLATFORM.get(platform, platform)
    )
    _registered.add(platform)


def mark_registered(platform: str) -> None:
    """Records a platform whose handler was registered by other means (PJRT C API)."""
    _registered.add(platform.lower())


def _load_native(module: str, platform: str) -> None:
    try:
        mod = importlib.import_module(f"jax_amp_scale.{module}")
    except ImportError as e:
        _load_errors[platform] = f"{module}: {e}"
        return
    for name, capsule in mod.registrations().items():
        if name == TARGET:
            register_target(platform, capsule)
        elif name == UNSCALE_TARGET and platform not in _unscale_registered:
            jax.ffi.register_ffi_target(name, capsule, platform=_XLA_PLATFORM[platform])
            _unscale_registered.add(platform)


_load_native("_native_cpu", "cpu")
# Optional: built only where CMake found a working CUDA compiler.
_load_native("_native_cuda", "cuda")


def platforms() -> frozenset[str]:
    """Lowering platforms that have a native update-scale handler."""
    return frozenset(_registered)


def unscale_platforms() -> frozenset[str]:
    """Lowering platforms that have a native fused unscale-and-check handler."""
    return frozenset(_unscale_registered)


def load_errors() -> dict[str, str]:
    """Why an optional native module did not load, per platform."""
    return dict(_load_errors)


# A primitive whose only job is to fail, at lowering time and with a clear
# message, when backend="ffi" is lowered for a platform with no handler for
# `target`.  It passes its operands through.  `lax.platform_dependent`
# traces every branch but lowers only the chosen one, so this costs nothing
# where a handler exists.
_unavailable_p = Primitive("jas_ffi_unavailable")
_unavailable_p.multiple_results = True
_unavailable_p.def_abstract_eval(lambda *args, target: args)
batching.primitive_batchers[_unavailable_p] = lambda args, dims, target: (
    _unavailable_p.bind(*args, target=target),
    dims,
)


def _unavailable_lowering(ctx: Any, *args: Any, target: str) -> Any:
    registered = _registered if target == TARGET else _unscale_registered
    missing = [p for p in ctx.module_context.platforms if p.lower() not in registered]
    if not missing:
        # Older jax lowers every platform_dependent branch; this one is dead
        # code for the platforms being lowered, so an identity is enough.
        return list(args)
    have = ", ".join(sorted(registered)) or "none"
    hint = (
        "register one with jax_amp_scale.plugin.register(platform=...)"
        if target == TARGET
        else "the fused pass has a native handler on CPU only"
    )
    what = "" if target == TARGET else "fused unscale-and-check "
    raise NotImplementedError(
        f"jax_amp_scale: backend='ffi' has no native {what}handler for platform "
        f"'{','.join(missing)}' (handlers: {have}). Use backend='reference' or "
        f"'auto'; {hint}."
    )


mlir.register_lowering(_unavailable_p, _unavailable_lowering)


def _varying_axes(x: jax.Array) -> frozenset[Any]:
    """Manual mesh axes `x` varies over inside `shard_map` (empty elsewhere)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)  # jax >= 0.10
    return frozenset(getattr(mat, "varying", None) or getattr(aval, "vma", None) or ())


def explicitly_sharded(x: Any) -> bool:
    """Whether `x`'s type carries an explicit-mode sharding (AxisType.Explicit).

    A custom call's results cannot carry one, so such inputs take the reference.
    """
    spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", None)
    return spec is not None and any(p is not None for p in spec)


def _vary(x: jax.Array, axes: frozenset[Any]) -> jax.Array:
    """`x`, typed as varying over `axes` too (values unchanged)."""
    missing = tuple(a for a in sorted(axes, key=str) if a not in _varying_axes(x))
    if not missing:
        return x
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, missing, to="varying")
    return jax.lax.pvary(x, missing)  # type: ignore[attr-defined]  # jax < 0.8


def _ffi_call(
    scale: jax.Array,
    tracker: jax.Array,
    found: jax.Array,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    target: str = TARGET,
) -> tuple[jax.Array, jax.Array]:
    # The operator's dtype rule: found_inf has the scale's dtype (1 or 0).
    found_inf = found.astype(scale.dtype)
    call = jax.ffi.ffi_call(
        target,
        (
            jax.ShapeDtypeStruct(scale.shape, scale.dtype),
            jax.ShapeDtypeStruct(tracker.shape, jnp.int32),
        ),
        # A vmapped batch of states goes to the handler in one call.
        vmap_method="broadcast_all",
        # In place, as torch_npu calls aclnnAmpUpdateScale.
        input_output_aliases={0: 0, 1: 1},
    )
    new_scale, new_tracker = call(
        scale,
        tracker,
        found_inf,
        growth_factor=np.float64(growth_factor),
        backoff_factor=np.float64(backoff_factor),
        growth_interval=np.int64(growth_interval),
    )
    # ffi_call types its results from the ShapeDtypeStructs above, which say
    # nothing of shard_map's varying axes; the state varies wherever an input
    # does, and shard_map's replication check relies on knowing that.
    axes = _varying_axes(scale) | _varying_axes(tracker) | _varying_axes(found)
    return _vary(new_scale, axes), _vary(new_tracker, axes)


def update_scale_ffi(
    scale: jax.Array,
    growth_tracker: jax.Array,
    found: jax.Array,
    *,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    fallback: Callable[..., tuple[jax.Array, jax.Array]] | None = None,
    use_ffi_on: frozenset[str] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Lowers to the custom call per platform.

    On platforms in `use_ffi_on` (default: every platform with a handler) the
    custom call is used; elsewhere `fallback` (same signature as
    `update_scale_ffi` without the keyword-only tail) or, when it is None, a
    lowering-time error.
    """
    attrs = dict(
        growth_factor=growth_factor,
        backoff_factor=backoff_factor,
        growth_interval=growth_interval,
    )
    targets = platforms() if use_ffi_on is None else use_ffi_on & platforms()

    def native(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        return _ffi_call(s, t, f, growth_factor, backoff_factor, growth_interval)

    def other(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        if fallback is not None:
            return fallback(s, t, f, **attrs)
        out = _unavailable_p.bind(s, t, target=TARGET)
        return out[0], out[1]

    # Every branch must return the same type, varying axes included.
    axes = _varying_axes(scale) | _varying_axes(growth_tracker) | _varying_axes(found)
    scale, growth_tracker, found = (_vary(x, axes) for x in (scale, growth_tracker, found))
    branches = {p: native for p in sorted(targets)}
    return jax.lax.platform_dependent(scale, growth_tracker, found, default=other, **branches)
