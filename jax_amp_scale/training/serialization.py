"""Stable ``jax.export`` serialization names for the training layer's pytree
nodes (an exported function's input and output structures are serialized)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from jax import export

_PREFIX = "jax_amp_scale."
T = TypeVar("T", bound=type)


def register_namedtuple(cls: T) -> T:
    """Registers the NamedTuple `cls` under ``jax_amp_scale.<name>``."""
    export.register_namedtuple_serialization(cls, serialized_name=_PREFIX + cls.__name__)
    return cls


def register_dataclass(cls: type, meta_fields: Sequence[str]) -> type:
    """Registers `cls` (a ``jax.tree_util.register_dataclass`` node whose static
    fields `meta_fields` are JSON values) under ``jax_amp_scale.<name>``."""
    n = len(meta_fields)

    def deserialize(data: bytes) -> tuple[Any, ...]:
        values = tuple(json.loads(data.decode()))
        if len(values) != n:
            raise ValueError(f"{cls.__name__}: expected {n} static fields, got {len(values)}")
        return values

    export.register_pytree_node_serialization(
        cls,
        serialized_name=_PREFIX + cls.__name__,
        serialize_auxdata=lambda aux: json.dumps(list(aux)).encode(),
        deserialize_auxdata=deserialize,
    )
    return cls
