"""`shard_alike` for the jax releases without `jax.experimental.shard_alike`.

jax 0.11 removed that module with no public successor.  partitioning.py
needs what it did: each gradient and the native pass's result for it in
one sharding group, so that the partitioner carries shardings through the
custom call (issue 30).  Under Shardy (jax's default partitioner since 0.7)
a group is one ``sdy.sharding_group`` op per array, through public APIs;
under GSPMD it is a ``shard_as`` annotation, which only JAX internals build
(platforms/jax_internals.py; without them, no group: the same bits, and XLA
may place the collectives otherwise).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import jax
from jax.extend.core import Primitive
from jax.extend.mlir.dialects import sdy
from jax.interpreters import ad, batching, mlir

from jax_amp_scale.platforms import jax_internals

# Group ids only need to differ between the groups of one program.
_ids = itertools.count()

_group_p = Primitive("jas_sharding_group")
_group_p.multiple_results = True
_group_p.def_impl(lambda x, y: (x, y))
_group_p.def_abstract_eval(lambda x, y: (x, y))


def _lowering(ctx: Any, x: Any, y: Any) -> list[Any]:
    group = next(_ids)
    # The flag's documented reader; jax's stubs do not declare it.
    if not jax.config.jax_use_shardy_partitioner:  # type: ignore[attr-defined]
        return jax_internals.gspmd_shard_group(ctx, [x, y], group)
    sdy.sharding_group(x, group)
    sdy.sharding_group(y, group)
    return [x, y]


def _batched(args: Sequence[Any], dims: Sequence[Any]) -> tuple[Any, Any]:
    if dims[0] != dims[1]:  # a partitioning hint only: dropped, not aligned
        return list(args), list(dims)
    return _group_p.bind(*args), list(dims)


def _jvp(primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
    return _group_p.bind(*primals), list(tangents)


mlir.register_lowering(_group_p, _lowering)
batching.primitive_batchers[_group_p] = _batched
ad.primitive_jvps[_group_p] = _jvp


def shard_alike(xs: Sequence[jax.Array], ys: Sequence[jax.Array]) -> tuple[list[Any], list[Any]]:
    """`xs` and `ys` unchanged, each ``xs[i]`` in one sharding group with ``ys[i]``."""
    pairs = [_group_p.bind(x, y) for x, y in zip(xs, ys, strict=True)]
    return [x for x, _ in pairs], [y for _, y in pairs]
