"""`amp_update_scale` and `update_scale`: validate, pick a lowering, call it."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Hashable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from jax_amp_scale import _ffi
from jax_amp_scale._reference import update_scale_reference
from jax_amp_scale._state import (
    SCALE_DTYPES,
    ScaleState,
    check_factor,
    check_growth_interval,
)

Backend = Literal["auto", "reference", "ffi"]
BACKENDS: tuple[str, ...] = ("auto", "reference", "ffi")

# Platforms on which "auto" picks the native handler, when one is registered.
# On Ascend the native operator is the point of the library.
AUTO_PREFERS_FFI: frozenset[str] = frozenset({"ascend", "npu"})
# Platforms on which "auto" picks it only in a one-device process (XLA cannot
# partition a custom call, so with several devices a sharded state would be
# gathered around it).  On CPU the custom call costs about 1 us per step
# more than the reference at run time, but the reference's exact integer
# product takes ~0.5 s to compile, the largest part of loss_scaled's compile
# time (bench/RESULTS.md, workloads 3 and 4).
AUTO_PREFERS_FFI_ONE_DEVICE: frozenset[str] = frozenset({"cpu"})


def _auto_prefers_ffi(platform: str) -> bool:
    if platform in AUTO_PREFERS_FFI:
        return True
    return platform in AUTO_PREFERS_FFI_ONE_DEVICE and jax.device_count() == 1


_SHAPES = ((), (1,))


def available_backends(platform: str | None = None) -> tuple[str, ...]:
    """Backends that run on `platform` (default: JAX's default backend).

    ``"reference"`` runs everywhere; ``"ffi"`` where a native handler is
    registered (see `jax_amp_scale.plugin.register` for plugin platforms).
    """
    platform = (platform or jax.default_backend()).lower()
    if platform == "gpu":
        platform = "cuda"
    if platform in _ffi.platforms():
        return ("reference", "ffi")
    return ("reference",)


def auto_backend(platform: str | None = None) -> str:
    """The backend ``"auto"`` picks on `platform` in this process.

    ``"ffi"`` on Ascend, and on CPU in a one-device process (when the state
    is not explicitly sharded); ``"reference"`` elsewhere.
    """
    platform = (platform or jax.default_backend()).lower()
    if _auto_prefers_ffi(platform) and "ffi" in available_backends(platform):
        return "ffi"
    return "reference"


def _check_backend(backend: Any) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return str(backend)


def _check_scale(x: Any, name: str) -> jax.Array:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        raise TypeError(
            f"{name} must be a float32/float16/bfloat16 array of shape () or (1,), "
            f"got {type(x).__name__}"
        )
    if jnp.dtype(dtype) not in SCALE_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {jnp.dtype(dtype).name}")
    if tuple(x.shape) not in _SHAPES:
        raise ValueError(f"{name} must have shape () or (1,), got {tuple(x.shape)}")
    return jnp.asarray(x)


def _check_tracker(x: Any, shape: tuple[int, ...], name: str) -> jax.Array:
    dtype = getattr(x, "dtype", None)
    if dtype is None or jnp.dtype(dtype) != jnp.int32:
        got = jnp.dtype(dtype).name if dtype is not None else type(x).__name__
        raise TypeError(f"{name} must be an int32 array, got {got}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have the shape of the scale {shape}, got {tuple(x.shape)}")
    return jnp.asarray(x)


def _found_to_bool(found_inf: Any, shape: tuple[int, ...]) -> jax.Array:
    """found_inf (any bool/int/float scalar) -> bool array of `shape`.

    Nonzero and NaN mean overflow; +0.0 and -0.0 do not.
    """
    if isinstance(found_inf, bool | numbers.Number) and not isinstance(found_inf, complex):
        return jnp.full(shape, bool(found_inf != 0))
    dtype = getattr(found_inf, "dtype", None)
    if dtype is None:
        raise TypeError(
            f"found_inf must be a bool, int or float scalar, got {type(found_inf).__name__}"
        )
    dtype = jnp.dtype(dtype)
    if not (
        dtype == jnp.bool_
        or jnp.issubdtype(dtype, jnp.integer)
        or jnp.issubdtype(dtype, jnp.floating)
    ):
        raise TypeError(f"found_inf must have a bool, integer or float dtype, got {dtype.name}")
    if tuple(found_inf.shape) not in _SHAPES:
        raise ValueError(
            f"found_inf must be a scalar (shape () or (1,)), got shape {tuple(found_inf.shape)}"
        )
    found_inf = jnp.asarray(found_inf)
    found = found_inf if dtype == jnp.bool_ else found_inf != 0  # NaN != 0 is True
    return found.reshape(shape)


def amp_update_scale(
    current_scale: jax.Array,
    growth_tracker: jax.Array,
    found_inf: Any,
    *,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    backend: Backend = "auto",
    axis_name: Hashable | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One dynamic loss-scale update, with the arguments of ``aclnnAmpUpdateScale``.

    Args:
      current_scale: float32, float16 or bfloat16 array of shape ``()`` or ``(1,)``.
      growth_tracker: int32 array of the same shape.
      found_inf: bool/int/float scalar (Python, NumPy or JAX; shape ``()`` or
        ``(1,)``). Nonzero or NaN means this step overflowed.
      growth_factor, backoff_factor: Python numbers, finite and > 0 (static).
      growth_interval: Python int in [1, 2**31 - 1] (static).
      backend: ``"reference"`` (pure JAX, every platform), ``"ffi"`` (the
        native custom call; lowering fails clearly on a platform without a
        handler) or ``"auto"`` (per lowering platform, the faster one measured
        in ``bench/``).
      axis_name: optional mapped axis name, or tuple of names, of
        ``shard_map``/``pmap``/``vmap``; found_inf is OR-reduced across it so
        every replica takes one decision.

    Returns:
      ``(updated_scale, updated_growth_tracker)``, shapes and dtypes of the inputs.
      The state is not differentiable: gradients through it are zero.
    """
    chosen = _check_backend(backend)
    gf = check_factor(growth_factor, "growth_factor")
    bf = check_factor(backoff_factor, "backoff_factor")
    gi = check_growth_interval(growth_interval)
    scale = _check_scale(current_scale, "current_scale")
    tracker = _check_tracker(growth_tracker, tuple(scale.shape), "growth_tracker")
    found = _found_to_bool(found_inf, tuple(scale.shape))

    # The state carries no gradient; stopping it here also means the custom
    # call never needs a JVP rule under jax.grad.
    scale, tracker, found = (jax.lax.stop_gradient(x) for x in (scale, tracker, found))
    if axis_name is not None:
        found = jax.lax.pmax(found.astype(jnp.int32), axis_name) > 0

    attrs: dict[str, Any] = dict(growth_factor=gf, backoff_factor=bf, growth_interval=gi)
    if chosen == "reference":
        return update_scale_reference(scale, tracker, found, **attrs)
    if chosen == "ffi":
        return _ffi.update_scale_ffi(scale, tracker, found, **attrs)
    # auto: the native handler only where measurements favour it, and never
    # for an explicitly sharded state (a custom call's result has no sharding).
    prefer = frozenset(p for p in _ffi.platforms() if _auto_prefers_ffi(p))
    if not prefer or any(_ffi.explicitly_sharded(x) for x in (scale, tracker, found)):
        return update_scale_reference(scale, tracker, found, **attrs)
    return _ffi.update_scale_ffi(
        scale, tracker, found, fallback=update_scale_reference, use_ffi_on=prefer, **attrs
    )


def update_scale(
    state: ScaleState,
    found_inf: Any,
    backend: Backend = "auto",
    *,
    axis_name: Hashable | None = None,
) -> ScaleState:
    """Advances `state` by one step; see `ScaleState` for the rule.

    Args:
      state: the current `ScaleState`.
      found_inf: bool/int/float scalar; nonzero or NaN means overflow.
      backend: ``"auto"``, ``"reference"`` or ``"ffi"`` (see `amp_update_scale`).
      axis_name: optional mapped axis name, or tuple of names, to OR-reduce
        found_inf across.

    Returns:
      A new `ScaleState` with the same static fields.
    """
    if not isinstance(state, ScaleState):
        raise TypeError(f"state must be a ScaleState, got {type(state).__name__}")
    scale, tracker = amp_update_scale(
        state.scale,
        state.growth_tracker,
        found_inf,
        growth_factor=state.growth_factor,
        backoff_factor=state.backoff_factor,
        growth_interval=state.growth_interval,
        backend=backend,
        axis_name=axis_name,
    )
    return dataclasses.replace(state, scale=scale, growth_tracker=tracker)
