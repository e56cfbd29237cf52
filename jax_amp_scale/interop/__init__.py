"""torch ``GradScaler`` state dicts to and from a `ScaleState`, and whole
training states to and from nested dicts of NumPy arrays (checkpoints)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.operators.scale_state import INT32_MAX, ScaleState, init_scale_state
from jax_amp_scale.operators.unscale_and_check import PyTree
from jax_amp_scale.training.scaling import find_scale_state, path_key

__all__ = [
    "TORCH_KEYS",
    "from_state_dict",
    "from_torch_state_dict",
    "to_state_dict",
    "to_torch_state_dict",
]

TORCH_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _number(sd: Mapping[str, Any], key: str) -> float:
    value = sd[key]
    if hasattr(value, "item"):  # NumPy scalars, 1-element arrays or tensors
        size = value.numel() if hasattr(value, "numel") else getattr(value, "size", 1)
        if size != 1:
            raise ValueError(f"state_dict[{key!r}] must hold one number, got {size}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"state_dict[{key!r}] must be a real number, got {value!r}")
    return float(value) if not isinstance(value, numbers.Integral) else int(value)


def from_torch_state_dict(
    state_dict: Mapping[str, Any], *, dtype: Any = jnp.float32, shape: tuple[int, ...] = ()
) -> ScaleState:
    """A `ScaleState` from torch ``GradScaler.state_dict()``.

    Args:
      state_dict: the mapping torch returns (Python numbers or 1-element
        tensors).  An empty dict (what a disabled GradScaler returns) is
        rejected.
      dtype: the new state's scale dtype, ``jnp.float32`` by default (torch's
        scale is float32).
      shape: the new state's shape, ``()`` (default) or ``(1,)``.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
    missing = [k for k in TORCH_KEYS if k not in state_dict]
    if missing:
        raise ValueError(
            f"state_dict lacks {missing} (needs {list(TORCH_KEYS)}; a disabled "
            "GradScaler returns an empty state_dict)"
        )
    tracker = _number(state_dict, "_growth_tracker")
    interval = _number(state_dict, "growth_interval")
    if not isinstance(tracker, int) or not -(2**31) <= tracker <= INT32_MAX:
        raise ValueError(f"state_dict['_growth_tracker'] must be an int32 value, got {tracker!r}")
    if not isinstance(interval, int):
        raise TypeError(f"state_dict['growth_interval'] must be an int, got {interval!r}")
    scale, growth, backoff = (_number(state_dict, k) for k in TORCH_KEYS[:3])
    state = init_scale_state(scale, growth, backoff, interval, dtype=dtype, shape=shape)
    return dataclasses.replace(state, growth_tracker=jnp.full(shape, tracker, jnp.int32))


def to_torch_state_dict(state: Any) -> dict[str, float | int]:
    """torch ``GradScaler.state_dict()`` for `state`.

    Bounds and hysteresis of a `DynamicScaler` have no torch counterpart and
    are not exported.  Values are Python numbers, as torch writes them
    (``GradScaler.load_state_dict`` accepts them).

    Args:
      state: a `ScaleState` or any pytree holding exactly one (a scaler, a
        `LossScaledState`, a whole optax state); a ``ValueError`` when it
        holds none or more than one, or when its scale is not finite.
    """
    s = find_scale_state(state)
    scale = float(np.asarray(s.scale, np.float32).reshape(()))
    if not math.isfinite(scale):
        raise ValueError(f"cannot export a non-finite scale ({scale})")
    return {
        "scale": scale,
        "growth_factor": float(s.growth_factor),
        "backoff_factor": float(s.backoff_factor),
        "growth_interval": int(s.growth_interval),
        "_growth_tracker": int(np.asarray(s.growth_tracker).reshape(())),
    }


def _keys(path: Any) -> list[str]:
    return [str(path_key(k)) for k in path] or ["_"]


def to_state_dict(tree: PyTree) -> dict[str, Any]:
    """A nested dict of NumPy arrays mirroring `tree`'s paths.

    Dict keys, attribute names (dataclasses, NamedTuples) and sequence
    indices become string keys; every leaf becomes a NumPy array of its own
    dtype (bfloat16 via ml_dtypes).  Static fields (factors, intervals) are
    not stored: they come back from the template in `from_state_dict`.

    Args:
      tree: any pytree: a training state, an optax state, parameters (a
        single leaf is stored under the key ``"_"``).  Two keys of one node
        that become the same string (``1`` and ``"1"``) are a ``ValueError``
        naming them.
    """
    out: dict[str, Any] = {}
    # Each string path -> the key path it came from: two keys that become the
    # same string would overwrite or merge their entries.
    origin: dict[tuple[str, ...], tuple[Any, ...]] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        names = _keys(path)
        for i in range(len(path)):
            first = origin.setdefault(tuple(names[: i + 1]), tuple(path[: i + 1]))
            if first != tuple(path[: i + 1]):  # the same up to i: they differ at i
                raise ValueError(
                    f"to_state_dict: keys {path_key(first[i])!r} and {path_key(path[i])!r} "
                    f"at {jax.tree_util.keystr(tuple(path[:i])) or 'the top level'} both "
                    f"become {names[i]!r}; give them distinct string forms"
                )
        *parents, last = names
        node = out
        for k in parents:
            node = node.setdefault(k, {})
        node[last] = np.asarray(leaf)
    return out


def from_state_dict(target: PyTree, state_dict: Mapping[str, Any]) -> PyTree:
    """Rebuilds `target`'s structure with the leaves from `state_dict`.

    Args:
      target: a pytree of the wanted structure (for example ``trainer.init(params)``
        or a fresh ``tx.init``); its leaves give the expected dtypes and shapes.
      state_dict: from `to_state_dict` (possibly through msgpack/orbax).

    Raises ``ValueError`` naming the path of a missing key or a leaf whose
    shape or dtype does not match.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(target)
    leaves = []
    for path, ref in flat:
        node: Any = state_dict
        for k in _keys(path):
            if not isinstance(node, Mapping) or k not in node:
                raise ValueError(f"state_dict has no entry for {jax.tree_util.keystr(path)}")
            node = node[k]
        value = np.asarray(node)
        ref_arr = np.asarray(ref)
        if value.shape != ref_arr.shape or value.dtype != ref_arr.dtype:
            raise ValueError(
                f"{jax.tree_util.keystr(path)}: stored {value.dtype}{list(value.shape)} "
                f"does not match the target's {ref_arr.dtype}{list(ref_arr.shape)}"
            )
        leaves.append(jnp.asarray(value) if isinstance(ref, jax.Array) else value)
    return jax.tree_util.tree_unflatten(treedef, leaves)
