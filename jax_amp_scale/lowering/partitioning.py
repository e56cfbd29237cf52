"""Native calls that partition like the elementwise operators they are.

XLA cannot see inside a custom call, so on its own it gathers every sharded
operand around one and replicates its results.  Two of JAX's public
mechanisms tell it better:

- `elementwise_pass`: the fused gradient pass wrapped in
  `jax.experimental.custom_partitioning`.  Each device runs the pass on its
  local shards (outputs keep the operands' shardings, the inverse scale is
  replicated) and the found-inf flag is OR-reduced over the mesh axes the
  leaves are sharded on: one all-reduce of a scalar, nothing gathered.  It
  serves GSPMD (``partition`` and ``infer_sharding_from_operands``) and
  Shardy (an einsum-like ``sharding_rule`` naming every dimension of every
  leaf once, so any dimension may stay sharded), auto and explicit axes
  alike; where the operands' shardings are not known until XLA partitions
  the program (auto axes), shard_map could not be used.
- `batch_partitionable`: the update-scale target registered with
  `jax.ffi.register_ffi_target_as_batch_partitionable`, so a vmapped
  population of states sharded on its batch axis is updated where it lies;
  a replicated state needs nothing (each device runs the call locally).

In a process with one device the pass is the plain custom call (nothing to
partition; the program stays exportable, as custom_partitioning's callback
is not serialisable).  Inside ``shard_map`` over every mesh axis
custom_partitioning inlines the call, which then sees the local shards.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

Pass = Callable[[jax.Array, list[jax.Array]], tuple[jax.Array, list[jax.Array]]]

_batch_partitionable: set[str] = set()


def batch_partitionable(target: str) -> None:
    """Registers FFI `target` as partitionable on its leading (vmap) axis (once)."""
    if target in _batch_partitionable:
        return
    jax.ffi.register_ffi_target_as_batch_partitionable(target)
    _batch_partitionable.add(target)


def _explicit_spec(x: Any) -> Any:
    """`x`'s explicit-axes PartitionSpec, or None (auto axes, or none sharded)."""
    spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", None)
    return spec if spec is not None and any(p is not None for p in spec) else None


def _typed_like(y: jax.Array, x: jax.Array) -> jax.Array:
    """`y` typed with `x`'s explicit sharding: an elementwise result keeps its
    operand's (`jax.ffi.ffi_call` types results as replicated)."""
    spec = _explicit_spec(x)
    if spec is None or _explicit_spec(y) == spec:
        return y
    if hasattr(jax.sharding, "reshard"):
        return jax.sharding.reshard(y, spec)
    from jax.experimental.shard import reshard  # jax < 0.7

    return reshard(y, spec)


def _spec_axes(sharding: Any) -> list[Hashable]:
    axes: list[Hashable] = []
    for entry in sharding.spec:
        if entry is None:
            continue
        axes += list(entry) if isinstance(entry, tuple) else [entry]
    return axes


def _rule(ranks: Sequence[int]) -> str:
    """The Shardy rule: a replicated scalar, then every leaf elementwise."""
    values = [""] + [" ".join(f"l{k}d{d}" for d in range(r)) for k, r in enumerate(ranks)]
    operands = ", ".join(values)
    return f"{operands} -> {operands}"


def _partitioned(run: Pass, ranks: tuple[int, ...]) -> Any:
    @custom_partitioning
    def call(inv: jax.Array, *leaves: jax.Array) -> tuple[jax.Array, ...]:
        found, outs = run(inv, list(leaves))
        return (found, *(_typed_like(y, x) for y, x in zip(outs, leaves, strict=True)))

    def shardings(mesh: Any, arg_shapes: Any) -> tuple[Any, list[Any], list[Hashable]]:
        leaf_shardings = [a.sharding for a in arg_shapes[1:]]
        if not all(isinstance(s, NamedSharding) for s in leaf_shardings):
            # Shardings without mesh axis names (a program without a mesh):
            # replicated leaves run as they are; sharded ones have no axis
            # to reduce the flag over.
            if all(s.is_fully_replicated for s in leaf_shardings):
                return leaf_shardings[0], leaf_shardings, []
            raise NotImplementedError(
                "unscale_and_check: the native pass partitions leaves sharded "
                "with a NamedSharding (mesh axes to reduce the flag over); "
                f"got {leaf_shardings[0]!r}: use a NamedSharding or backend='reference'"
            )
        rep = NamedSharding(mesh, PartitionSpec())
        axes = sorted({a for s in leaf_shardings for a in _spec_axes(s)}, key=str)
        return rep, leaf_shardings, axes

    def partition(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        rep, leaf_shardings, axes = shardings(mesh, arg_shapes)

        def local(inv: jax.Array, *leaves: jax.Array) -> tuple[jax.Array, ...]:
            found, outs = run(inv, list(leaves))
            if axes:  # one scalar all-reduce: the OR over every shard
                found = jax.lax.pmax(found.astype(jnp.int32), tuple(axes)) > 0
            return (found, *outs)

        shards = (rep, *leaf_shardings)
        return mesh, local, shards, shards

    def infer(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        rep, leaf_shardings, _ = shardings(mesh, arg_shapes)
        return (rep, *leaf_shardings)

    call.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=_rule(ranks),
    )
    return call


def elementwise_pass(run: Pass) -> Pass:
    """`run` (``(inv, leaves) -> (found, unscaled)``) partitioned per shard.

    `run` must be elementwise in the leaves and its flag an OR over their
    elements: then the OR of the per-shard flags is the global flag, bit for
    bit, whatever the sharding.
    """

    def partitioned(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
        if jax.device_count() == 1:
            return run(inv, leaves)
        found, *outs = _partitioned(run, tuple(x.ndim for x in leaves))(inv, *leaves)
        return found, list(outs)

    return partitioned
