"""What every custom call of this package needs, written once: the branch
per lowering platform (`per_platform`), the lowering-time error where
``backend="ffi"`` has no handler (`unavailable`), vmap and jvp taken from the
reference (`with_reference_rules`), shard_map's varying axes (`vary_like`),
and what the operators' ``custom_partitioning`` rules share (XLA cannot see
inside a custom call, so on its own it gathers every sharded operand
around one).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jax_amp_scale.mechanisms import handlers


def varying_axes(x: Any) -> frozenset[Hashable]:
    """The manual axes `x` varies over inside ``shard_map`` (empty where JAX
    does not track them: outside shard_map, check_vma=False, pmap, vmap)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)  # jax >= 0.10
    return frozenset(getattr(mat, "varying", None) or getattr(aval, "vma", None) or ())


_HINTS = {
    handlers.UPDATE_SCALE: "register one with jax_amp_scale.plugin.register(platform=...)",
    handlers.UNSCALE_AND_CHECK: "the fused pass has native handlers on CPU and Ascend",
    handlers.UNSCALE_CHECK_AMAX: "the pass with the amax has a native handler on CPU",
}
_WHAT = {
    handlers.UPDATE_SCALE: "",
    handlers.UNSCALE_AND_CHECK: "fused unscale-and-check ",
    handlers.UNSCALE_CHECK_AMAX: "unscale-check-amax ",
}


def _vary(x: jax.Array, axes: frozenset[Any]) -> jax.Array:
    missing = tuple(a for a in sorted(axes, key=str) if a not in varying_axes(x))
    if not missing:
        return x
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, missing, to="varying")
    return jax.lax.pvary(x, missing)  # type: ignore[attr-defined]  # jax < 0.8


def vary_like(tree: Any, *inputs: Any) -> Any:
    """`tree`'s arrays typed as varying over every axis any of `inputs` varies over."""
    axes = frozenset().union(*(varying_axes(x) for x in jax.tree_util.tree_leaves(inputs)))
    return jax.tree_util.tree_map(lambda x: _vary(x, axes), tree)


# A primitive whose only job is to fail, at lowering time and with a clear
# message, when backend="ffi" is lowered for a platform with no handler for
# `op`.  It passes its operands through.  `lax.platform_dependent` traces
# every branch but lowers only the chosen one, so this costs nothing where a
# handler exists.
_unavailable_p = Primitive("jas_ffi_unavailable")
_unavailable_p.multiple_results = True
_unavailable_p.def_abstract_eval(lambda *args, op: args)
batching.primitive_batchers[_unavailable_p] = lambda args, dims, op: (
    _unavailable_p.bind(*args, op=op),
    dims,
)


def _unavailable_lowering(ctx: Any, *args: Any, op: str) -> Any:
    have_set = handlers.registered_platforms(op)
    missing = [p for p in ctx.module_context.platforms if p.lower() not in have_set]
    if not missing:
        # Older jax lowers every platform_dependent branch; this one is dead
        # code for the platforms being lowered, so an identity is enough.
        return list(args)
    have = ", ".join(sorted(have_set)) or "none"
    raise NotImplementedError(
        f"jax_amp_scale: backend='ffi' has no native {_WHAT[op]}handler for platform "
        f"'{','.join(missing)}' (handlers: {have}). Use backend='reference' or "
        f"'auto'; {_HINTS[op]}."
    )


mlir.register_lowering(_unavailable_p, _unavailable_lowering)


def unavailable(op: str, tree: Any) -> Any:
    """`tree` unchanged, or a lowering-time error where `op` has no handler."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return jax.tree_util.tree_unflatten(treedef, _unavailable_p.bind(*leaves, op=op))


# The other platforms' branch of `per_platform` as one equation: `fn` (the
# pure-JAX reference, flat arguments to flat results) is traced when that
# branch is lowered, vmapped or differentiated, not when the step is traced.
# On CPU that branch is dead, and tracing the reference over a large tree is
# slow (bench/RESULTS.md).
_elsewhere_p = Primitive("jas_reference_elsewhere")
_elsewhere_p.multiple_results = True
_elsewhere_p.def_abstract_eval(lambda *args, fn, out_avals: out_avals)
mlir.register_lowering(
    _elsewhere_p,
    lambda ctx, *args, fn, out_avals: mlir.lower_fun(fn, multiple_results=True)(ctx, *args),
)


def _elsewhere_batched(args: Any, dims: Any, *, fn: Callable[..., Any], out_avals: Any) -> Any:
    in_axes = tuple(dims)  # None where an argument is not batched
    outs = jax.vmap(fn, in_axes=in_axes)(*args)
    return outs, (0,) * len(outs)


def _elsewhere_jvp(primals: Any, tangents: Any, *, fn: Callable[..., Any], out_avals: Any) -> Any:
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return jax.jvp(fn, tuple(primals), tuple(tangents))


batching.primitive_batchers[_elsewhere_p] = _elsewhere_batched
ad.primitive_jvps[_elsewhere_p] = _elsewhere_jvp


def per_platform(
    native: Callable[..., Any],
    other: Callable[..., Any],
    *args: Any,
    native_on: Iterable[str],
    overrides: Mapping[str, Callable[..., Any]] | None = None,
) -> Any:
    """``native(*args)`` when lowering for a platform in `native_on` (or that
    platform's entry in `overrides`), else ``other(*args)``."""
    # Every branch must return the same type, varying axes included.
    args = vary_like(args, args)
    overrides = overrides or {}
    # platform_dependent traces the named branches before the default one:
    # the first records the result types, and the default becomes one
    # equation of those types.  Where nothing was recorded (called eagerly, a
    # jax that traces in another order) `other` is traced as it is.
    typed: list[Any] = []

    def recording(branch: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any) -> Any:
            out = branch(*a)
            if not typed:
                leaves, treedef = jax.tree_util.tree_flatten(out)
                typed.extend([treedef, tuple(jax.typeof(x) for x in leaves)])
            return out

        return run

    def deferred_other(*a: Any) -> Any:
        if not typed:
            return other(*a)
        out_tree, out_avals = typed
        flat, in_tree = jax.tree_util.tree_flatten(a)

        def flat_other(*xs: Any) -> list[Any]:
            return jax.tree_util.tree_leaves(other(*jax.tree_util.tree_unflatten(in_tree, xs)))

        outs = _elsewhere_p.bind(*flat, fn=flat_other, out_avals=out_avals)
        return jax.tree_util.tree_unflatten(out_tree, outs)

    wrapped: dict[int, Callable[..., Any]] = {}  # one wrapper per distinct branch
    branches = {}
    for p in sorted(native_on):
        branch = overrides.get(p, native)
        branches[p] = wrapped.setdefault(id(branch), recording(branch))
    return jax.lax.platform_dependent(*args, default=deferred_other, **branches)


def with_reference_rules(native: Callable[..., Any], reference: Callable[..., Any]) -> Any:
    """`native` whose vmap and jvp are `reference`'s (same signature and results).

    Under ``vmap`` the batched call runs the reference vmapped (one vectorised
    program rather than a loop of calls); tangents come from the reference's
    linear map, whose primal half is dead code XLA removes.
    """
    batched_native = jax.custom_batching.custom_vmap(native)

    @batched_native.def_vmap
    def _batched(axis_size: int, in_batched: Any, *args: Any) -> tuple[Any, Any]:
        in_axes = jax.tree_util.tree_map(lambda b: 0 if b else None, in_batched)
        out = jax.vmap(reference, in_axes=tuple(in_axes), axis_size=axis_size)(*args)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    @jax.custom_jvp
    def call(*args: Any) -> Any:
        return batched_native(*args)

    @call.defjvp
    def _jvp(primals: Any, tangents: Any) -> tuple[Any, Any]:
        _, tangent_out = jax.jvp(reference, primals, tangents)
        return call(*primals), tangent_out

    return call


# ---- partitioning: what the operators' rules share ----

# jax < 0.7 (explicit axes experimental) lowers the flag's all-reduce inside
# the partitioned call with sharding constraints XLA cannot translate when a
# mesh with explicit axes is set while compiling.
EXPLICIT_OK = tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 7)


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


def unwrapped() -> bool:
    return jax.device_count() == 1 or _WHOLE.get()


def partitions(operands: Sequence[Any]) -> bool:
    """Whether the native calls partition these operands on this jax (all
    do, except explicitly sharded ones on jax < 0.7)."""
    return EXPLICIT_OK or not any(explicit_spec(x) is not None for x in operands)


def explicit_spec(x: Any) -> Any:
    """`x`'s explicit-axes PartitionSpec, or None (auto axes, or none sharded)."""
    spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", None)
    return spec if spec is not None and any(p is not None for p in spec) else None


def typed_like(y: jax.Array, x: jax.Array) -> jax.Array:
    """`y` typed with `x`'s explicit sharding: an elementwise result keeps its
    operand's (`jax.ffi.ffi_call` types results as replicated)."""
    spec = explicit_spec(x)
    if spec is None or explicit_spec(y) == spec:
        return y
    # The operand's own sharding (its mesh included): a bare PartitionSpec
    # would need a mesh context the caller may not have set.
    sharding = jax.typeof(x).sharding
    if hasattr(jax.sharding, "reshard"):
        return jax.sharding.reshard(y, sharding)
    from jax.experimental.shard import reshard  # jax < 0.7

    return reshard(y, sharding)


def local_shapes() -> Any:
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


def operand_shardings(mesh: Any, arg_shapes: Any) -> tuple[NamedSharding, list[Any], bool]:
    """``(replicated, shardings, named)`` for a partitioning rule's operands:
    the sharding XLA gives each (None on older jax for an unannotated one:
    replicated) and a replicated one.  Where some operand's sharding has no
    mesh axis names (a program without a mesh), every one is replicated over
    the first's devices and `named` is False: raising instead would abort the
    process inside XLA's compiler."""
    replicated = NamedSharding(mesh, PartitionSpec())
    own = [replicated if a.sharding is None else a.sharding for a in arg_shapes]
    if all(isinstance(s, NamedSharding) for s in own):
        return replicated, own, True
    devices = sorted(own[0].device_set, key=lambda d: d.id)
    replicated = NamedSharding(Mesh(np.array(devices), ("replicas",)), PartitionSpec())
    return replicated, [replicated] * len(own), False


def spec_axes(sharding: Any) -> list[Hashable]:
    axes: list[Hashable] = []
    for entry in sharding.spec:
        if entry is None:
            continue
        axes += list(entry) if isinstance(entry, tuple) else [entry]
    return axes
