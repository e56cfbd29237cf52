"""Native calls that partition like the elementwise operators they are.

XLA cannot see inside a custom call, so on its own it gathers every sharded
operand around one.  `jax.experimental.custom_partitioning` tells it better
(GSPMD's callbacks and a Shardy ``sharding_rule``, auto and explicit axes;
ARCHITECTURE.md says why each choice):

- `elementwise_pass`: the gradient pass runs on each device's shards and
  its found-inf flag is OR-reduced over the leaves' mesh axes, one scalar
  all-reduce.
- `per_element`: the update-scale call, every operand and result sharded
  like the scale (a vmapped population updated where it lies).

With one device, and inside `whole_arrays` (`jax.export`: the partitioner is
a Python callback, which does not serialise), the calls are plain.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import Mesh, NamedSharding, PartitionSpec

try:  # jax 0.11 removed it, with no public successor yet
    from jax.experimental.shard_alike import shard_alike
except ImportError:  # jax >= 0.11: the same groups, built here (Shardy and GSPMD)
    from jax_amp_scale.lowering.sharding_groups import shard_alike  # type: ignore[assignment]

Pass = Callable[[jax.Array, list[jax.Array]], tuple[jax.Array, list[jax.Array]]]


# jax < 0.7 (explicit axes experimental) lowers the flag's all-reduce inside
# the partitioned call with sharding constraints XLA cannot translate when a
# mesh with explicit axes is set while compiling.
_EXPLICIT_OK = tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 7)


# Inside `whole_arrays()` the native calls are traced unwrapped.
_WHOLE = contextvars.ContextVar("jax_amp_scale_whole_arrays", default=False)


@contextlib.contextmanager
def whole_arrays() -> Iterator[None]:
    """Trace the native calls without custom_partitioning, as one call on the
    whole arrays: XLA then gathers sharded operands around them (the bits
    stay the same).  `jax.export` needs this with several devices, because
    custom_partitioning's partitioner is a Python callback, which does not
    serialise."""
    token = _WHOLE.set(True)
    try:
        yield
    finally:
        _WHOLE.reset(token)


def _unwrapped() -> bool:
    return jax.device_count() == 1 or _WHOLE.get()


def partitions(operands: Sequence[Any]) -> bool:
    """Whether the native calls partition these operands on this jax (all
    do, except explicitly sharded ones on jax < 0.7)."""
    return _EXPLICIT_OK or not any(_explicit_spec(x) is not None for x in operands)


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
    # The operand's own sharding (its mesh included): a bare PartitionSpec
    # would need a mesh context the caller may not have set.
    sharding = jax.typeof(x).sharding
    if hasattr(jax.sharding, "reshard"):
        return jax.sharding.reshard(y, sharding)
    from jax.experimental.shard import reshard  # jax < 0.7

    return reshard(y, sharding)


def _local_shapes() -> Any:
    """A context for tracing the per-shard body: no mesh.  It works on
    local shapes, and the user's mesh (still set while XLA compiles) would
    type its values with shardings whose constraints then have no meaning
    inside the partitioned call (jax 0.8 fails to compile them)."""
    if hasattr(jax.sharding, "use_abstract_mesh") and hasattr(jax.sharding, "AbstractMesh"):
        try:
            return jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ()))
        except TypeError:  # an older AbstractMesh signature
            pass
    return contextlib.nullcontext()


def _operand_sharding(mesh: Any, arg_shape: Any) -> Any:
    """The sharding XLA gives an operand (None on older jax for an
    unannotated one: replicated)."""
    s = arg_shape.sharding
    if s is None:
        return NamedSharding(mesh, PartitionSpec())
    return s


def _replicated_like(sharding: Any) -> NamedSharding:
    """A replicated sharding over `sharding`'s devices."""
    devices = sorted(sharding.device_set, key=lambda d: d.id)
    return NamedSharding(Mesh(np.array(devices), ("replicas",)), PartitionSpec())


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
        leaf_shardings = [_operand_sharding(mesh, a) for a in arg_shapes[1:]]
        if not all(isinstance(s, NamedSharding) for s in leaf_shardings):
            # Shardings without mesh axis names (a program without a mesh):
            # no axis to reduce the flag over, so every operand replicated
            # (correct, but gathers).  An exception here would abort the
            # process (XLA calls this while compiling), so none is raised.
            rep = _replicated_like(leaf_shardings[0])
            return rep, [rep] * len(leaf_shardings), []
        rep = NamedSharding(mesh, PartitionSpec())
        axes = sorted({a for s in leaf_shardings for a in _spec_axes(s)}, key=str)
        return rep, leaf_shardings, axes

    def partition(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        rep, leaf_shardings, axes = shardings(mesh, arg_shapes)

        def local(inv: jax.Array, *leaves: jax.Array) -> tuple[jax.Array, ...]:
            with _local_shapes():
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
        if _unwrapped():
            found, outs = run(inv, leaves)
            return found, [_typed_like(y, x) for y, x in zip(outs, leaves, strict=True)]
        found, *outs = _partitioned(run, tuple(x.ndim for x in leaves))(inv, *leaves)
        return found, _sharded_alike(leaves, list(outs))

    return partitioned


def _sharded_alike(leaves: list[jax.Array], outs: list[jax.Array]) -> list[jax.Array]:
    """`outs`, each in one sharding group with its operand in `leaves`, so
    the partitioner carries shardings through the call as through the plain
    step's elementwise unscale (ARCHITECTURE.md; tests/multidevice/
    test_step_collectives.py).  On jax >= 0.11, which removed `shard_alike`,
    sharding_groups.py builds the same groups.
    """
    _, outs = shard_alike(leaves, outs)
    return list(outs)


def _elementwise_rule(ndim: int, n_in: int, n_out: int) -> str:
    value = " ".join(f"d{d}" for d in range(ndim))
    return ", ".join([value] * n_in) + " -> " + ", ".join([value] * n_out)


def _per_element_partitioned(fn: Callable[..., Any], *args: jax.Array) -> Any:
    shape = args[0].shape
    if _unwrapped() or any(a.shape != shape for a in args):
        return tuple(_typed_like(y, args[0]) for y in fn(*args))
    n_out = len(jax.eval_shape(fn, *args))

    @custom_partitioning
    def call(*xs: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(_typed_like(y, xs[0]) for y in fn(*xs))

    def sharding(mesh: Any, arg_shapes: Any) -> Any:
        s = _operand_sharding(mesh, arg_shapes[0])
        # Unnamed (no mesh) and sharded: replicate rather than raise, which
        # would abort the process inside XLA's compiler.
        return s if isinstance(s, NamedSharding) else _replicated_like(s)

    def partition(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        s = sharding(mesh, arg_shapes)
        return mesh, fn, (s,) * n_out, (s,) * len(arg_shapes)

    def infer(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        return (sharding(mesh, arg_shapes),) * n_out

    call.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=_elementwise_rule(len(shape), len(args), n_out),
    )
    return call(*args)


def per_element(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (arrays of one shape -> a tuple of arrays of that shape, each
    element computed from the same element of the operands alone) run on each
    device's shard, every operand and result sharded like the first."""

    @jax.custom_batching.custom_vmap
    def call(*args: jax.Array) -> Any:
        return _per_element_partitioned(fn, *args)

    @call.def_vmap
    def _batched(axis_size: int, in_batched: Any, *args: jax.Array) -> Any:
        full = [
            a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
            for a, b in zip(args, in_batched, strict=True)
        ]
        out = call(*full)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return call  # type: ignore[no-any-return]
