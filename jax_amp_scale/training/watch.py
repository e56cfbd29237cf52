"""`watch_amax`: the largest |cotangent| at a point of the backward pass,
returned as the gradient of a probe (the mechanism flax's fp8 ops use to
return their amax history).  What overflows first under loss scaling is
often a float16 tensor inside the backward pass, which the parameter
gradients only show as inf (examples/overflow_first.py measures which).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from jax_amp_scale.mechanisms.custom_call import varying_axes
from jax_amp_scale.operators.scale_state import check_dtype

__all__ = ["watch_amax", "watch_probes"]

_FLOATS = {jnp.dtype(d) for d in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)}


def watch_probes(n: int) -> jax.Array:
    """``n`` probes for `watch_amax`: float32 zeros of shape ``(n,)``.

    Pass them to the differentiated function beside the parameters, give
    ``probes[i]`` to the i-th `watch_amax`, and take the gradient with respect
    to both: the probes' gradient holds each watch's amax.

    Args:
      n: the number of probes, an int >= 1.
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"watch_probes: n must be an int >= 1, got {n!r}")
    return jnp.zeros((int(n),), jnp.float32)


def watch_amax(x: Any, probe: Any, *, dtype: Any = None) -> jax.Array:
    """Identity (or a cast) whose backward pass reports the amax of its cotangent.

    Forward: ``x``, or ``x.astype(dtype)``, bit for bit.  Backward: the
    cotangent ``ct`` of the result passes on unchanged (cast back to
    ``x.dtype``), and the gradient of `probe` is ``max |ct|`` over the finite
    entries of ``ct`` (0.0 where there is none), in ``ct``'s own units (the
    scaled units of a loss-scaled backward pass), taken before the cast back
    and rounded to float32.  So at a float16-to-float32 cast (the logits,
    ``dtype=jnp.float32``) the probe sees the float32 cotangent *before* it
    is narrowed to float16: a value that will overflow there shows as itself
    (70000.0), not as inf.

    Transformations: ``jit``; ``vmap`` with a shared probe gives the max over
    the batch (not the sum ``vmap`` of a ``custom_vjp`` would give), with a
    batched probe each example's own amax; ``shard_map`` with varying-axes
    checking (the default) gives the max over the devices the cotangent
    varies over and the probe does not; without checking (and on jax < 0.7)
    JAX sums the devices' amaxes into a shared probe's gradient, an upper
    bound (give each device its own probe, ``P(axis)``, and take their max).
    The amax has zero derivative (grad of grad sees the cotangent's path);
    forward mode (``jax.jvp``) is not supported.  Give each probe to one
    watch: a probe used twice, or shared by ``lax.scan``'s iterations, gets
    the sum of their amaxes: pass one per iteration, as ``xs``, and take the
    max of their gradients.

    Args:
      x: a floating array (float16, bfloat16, float32 or float64).
      probe: a float32 scalar that the differentiated function takes as an
        argument (`watch_probes` makes them); its value is not used.
      dtype: optional floating dtype to cast ``x`` to (as a `Policy` cast
        does); None (default) keeps ``x.dtype``.

    Returns:
      ``x`` cast to ``dtype`` (``x`` itself when ``dtype`` is None).

    Raises:
      ValueError: at trace time, naming the argument, when ``x`` is not a
        floating array, ``probe`` is not a float32 scalar or ``dtype`` is not
        a floating dtype.
    """
    x = _check_x(x)
    probe = _check_probe(probe)
    out = x.dtype
    if dtype is not None:
        words = "None or a floating dtype (float16, bfloat16, float32 or float64)"
        out = check_dtype(dtype, "watch_amax: dtype", _FLOATS, words, ValueError)
    return _watch(x.dtype, out)(x, probe)


def _aval(x: Any) -> tuple[np.dtype, tuple[int, ...]] | None:
    """(dtype, shape) of an array or of what ``jnp.asarray`` takes; None otherwise."""
    if not isinstance(x, jax.Array | np.ndarray | np.generic):
        try:
            x = jnp.asarray(x)
        except (TypeError, ValueError):
            return None
    return jnp.dtype(x.dtype), tuple(x.shape)


def _check_x(x: Any) -> jax.Array:
    aval = _aval(x)
    if aval is None or aval[0] not in _FLOATS:
        got = type(x).__name__ if aval is None else aval[0].name
        raise ValueError(
            "watch_amax: x must be a floating array (float16, bfloat16, float32 or float64), "
            f"got {got}"
        )
    return jnp.asarray(x)


def _check_probe(probe: Any) -> jax.Array:
    aval = _aval(probe)
    if aval is None or aval != (jnp.dtype(jnp.float32), ()):
        got = type(probe).__name__ if aval is None else f"{aval[0].name} of shape {aval[1]}"
        raise ValueError(
            "watch_amax: probe must be a float32 scalar that the differentiated function "
            f"takes as an argument (say watch_probes(n)[i]); got {got}"
        )
    return jnp.asarray(probe)


@functools.cache
def _watch(in_dtype: np.dtype, out_dtype: np.dtype) -> Any:
    """The custom_vjp for one (input, output) dtype pair."""

    @jax.custom_vjp
    def watch(x: jax.Array, probe: jax.Array) -> jax.Array:
        return x.astype(out_dtype)

    def fwd(x: jax.Array, probe: jax.Array) -> tuple[jax.Array, jax.Array]:
        return x.astype(out_dtype), probe

    def bwd(probe: jax.Array, ct: jax.Array) -> tuple[jax.Array, jax.Array]:
        ct = jnp.asarray(ct)
        amax = _amax(jax.lax.stop_gradient(ct), probe)
        across = tuple(sorted(varying_axes(ct) - varying_axes(probe), key=str))
        if across:  # shard_map: the probe is shared by the devices ct varies over
            amax = jax.lax.pmax(amax, across)
        return ct.astype(in_dtype), amax

    watch.defvjp(fwd, bwd)
    return watch


@custom_vmap
def _amax(ct: jax.Array, probe: jax.Array) -> jax.Array:
    """max |ct| over finite entries, reduced over the axes after probe's
    (probe's shape is a prefix of ct's), as probe's dtype."""
    a = jnp.where(jnp.isfinite(ct), jnp.abs(ct), jnp.zeros((), ct.dtype))
    return jnp.max(a, axis=tuple(range(probe.ndim, ct.ndim)), initial=0).astype(probe.dtype)


@_amax.def_vmap
def _amax_vmap(
    axis_size: int, in_batched: list[bool], ct: jax.Array, probe: jax.Array
) -> tuple[jax.Array, bool]:
    # Batched axes arrive first.  A batched probe keeps the batch axis in
    # front of both (each example its own amax); a shared probe reduces it
    # with the data (moved last), so the max is over the batch, not a sum.
    ct_batched, probe_batched = in_batched
    if probe_batched:
        if not ct_batched:
            ct = jnp.broadcast_to(ct, (axis_size, *ct.shape))
        return _amax(ct, probe), True
    return _amax(jnp.moveaxis(ct, 0, -1), probe), False
