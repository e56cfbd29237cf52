"""Precision policies: the dtypes of parameters, computation and outputs.

`Policy` follows jmp's convention and adds ``keep_float32`` rules, matched
against whole names on a leaf's path; the O0-O3 levels and the scaler each
pairs with (`scaler_for`) are tabled in docs/guide/training.md.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.mechanisms.floats import is_float_leaf
from jax_amp_scale.operators.scale_state import check_dtype
from jax_amp_scale.operators.unscale_and_check import PyTree
from jax_amp_scale.training import scalers
from jax_amp_scale.training.scaling import path_key

__all__ = ["LEVELS", "Policy", "get_policy", "scaler_for"]

KeepRule = str | Callable[[str, Any], bool]

# Whole path components naming norm layers: flax (BatchNorm_0, LayerNorm_1,
# GroupNorm, RMSNorm), haiku (layer_norm, batch_norm), equinox (norm),
# Hugging Face (input_layernorm, final_layer_norm) and short names (bn1, ln_f).
NORM_RULES: tuple[str, ...] = (
    r"(?i)([a-z0-9]+_)*(layer|batch|group|rms|instance)?_?norm(_?\d+)?",
    r"(?i)([a-z0-9]+_)*(bn|ln)(_?\d+|_f|_final)?",
)


def path_names(path: Any) -> list[str]:
    """The whole names a string rule is matched against, for one key path."""
    names = (str(path_key(key)).split("/") for key in path)  # haiku's "a/~/b"
    return [part for parts in names for part in parts if part and part != "~"]


def _rank_below_2(path: str, leaf: Any) -> bool:
    return jnp.ndim(leaf) < 2


_DTYPE_NAMES = {
    **dict.fromkeys(("float32", "f32", "full", "single"), jnp.float32),
    **dict.fromkeys(("float16", "f16", "half"), jnp.float16),
    **dict.fromkeys(("bfloat16", "bf16"), jnp.bfloat16),
    **dict.fromkeys(("float64", "f64", "double"), jnp.float64),
}
_FLOAT_DTYPES = {jnp.dtype(d) for d in _DTYPE_NAMES.values()}


def _check_dtype(dtype: Any, name: str) -> np.dtype:
    if isinstance(dtype, str):
        key = dtype.strip().lower()
        if key not in _DTYPE_NAMES:
            raise ValueError(
                f"{name}: unknown dtype name {dtype!r}; use one of {sorted(_DTYPE_NAMES)}"
            )
        return jnp.dtype(_DTYPE_NAMES[key])
    return check_dtype(dtype, name, _FLOAT_DTYPES, "float16, bfloat16, float32 or float64")


def _check_rules(rules: Any) -> tuple[KeepRule, ...]:
    if isinstance(rules, str) or callable(rules):
        rules = (rules,)
    try:
        rules = tuple(rules)
    except TypeError:
        raise TypeError(
            f"keep_float32 must be a sequence of regex strings or callables, got {rules!r}"
        ) from None
    for r in rules:
        if isinstance(r, str):
            try:
                re.compile(r)
            except re.error as e:
                raise ValueError(f"keep_float32: invalid regular expression {r!r}: {e}") from e
        elif not callable(r):
            raise TypeError(f"keep_float32 entries must be regex strings or callables, got {r!r}")
    return rules


@dataclasses.dataclass(frozen=True)
class Policy:
    """Dtypes for parameters, computation and outputs.

    Attributes:
      param_dtype: dtype the parameters are stored and updated in.
      compute_dtype: dtype of the forward/backward computation.
      output_dtype: dtype of the model's outputs (the loss, logits).
      keep_float32: rules selecting leaves that `cast_to_param` and
        `cast_to_compute` put in float32 instead: a regex must match one
        whole name on the leaf's path (a dict key, attribute or index;
        haiku's ``a/~/b`` split at ``/``); a callable gets ``(path, leaf)``,
        the path as ``jax.tree_util.keystr`` (``"['LayerNorm_0']['scale']"``),
        and returns a bool.

    Casts touch floating leaves only (integer, bool, float0 leaves and
    ``None`` pass); a leaf already in the target dtype is returned as is.
    """

    param_dtype: Any = jnp.float32
    compute_dtype: Any = jnp.float32
    output_dtype: Any = jnp.float32
    keep_float32: tuple[KeepRule, ...] = ()

    def __post_init__(self) -> None:
        for f in ("param_dtype", "compute_dtype", "output_dtype"):
            object.__setattr__(self, f, _check_dtype(getattr(self, f), f))
        object.__setattr__(self, "keep_float32", _check_rules(self.keep_float32))

    def _keep(self, path: Any, leaf: Any) -> bool:
        names = path_names(path)
        return any(
            any(re.fullmatch(rule, n) for n in names)
            if isinstance(rule, str)
            else rule(jax.tree_util.keystr(path), leaf)
            for rule in self.keep_float32
        )

    def _cast(self, tree: PyTree, dtype: np.dtype, use_rules: bool) -> PyTree:
        def one(path: Any, x: Any) -> Any:
            if not is_float_leaf(x):
                return x
            keep = use_rules and self.keep_float32 and self._keep(path, x)
            target = jnp.dtype(jnp.float32) if keep else dtype
            return x if x.dtype == target else jnp.asarray(x).astype(target)

        return jax.tree_util.tree_map_with_path(one, tree)

    def cast_to_param(self, tree: PyTree) -> PyTree:
        """Floating leaves to `param_dtype` (keep-float32 leaves to float32).

        Args:
          tree: any pytree, usually the parameters; other leaves pass.
        """
        return self._cast(tree, self.param_dtype, True)

    def cast_to_compute(self, tree: PyTree) -> PyTree:
        """Floating leaves to `compute_dtype` (keep-float32 leaves to float32).

        Args:
          tree: any pytree, usually the parameters or a batch; other leaves pass.
        """
        return self._cast(tree, self.compute_dtype, True)

    def cast_to_output(self, tree: PyTree) -> PyTree:
        """Floating leaves to `output_dtype` (no keep rules: outputs are outputs).

        Args:
          tree: any pytree, usually the loss or the logits; other leaves pass.
        """
        return self._cast(tree, self.output_dtype, False)

    def __str__(self) -> str:
        return (
            f"params={self.param_dtype.name},compute={self.compute_dtype.name},"
            f"output={self.output_dtype.name}"
        )


LEVELS = ("O0", "O1", "O2", "O3")

_F32, _F16 = jnp.float32, jnp.float16
_PRESETS: dict[str, Policy] = {
    "O0": Policy(_F32, _F32, _F32),
    "O1": Policy(_F32, _F16, _F32, (*NORM_RULES, _rank_below_2)),
    "O2": Policy(_F32, _F16, _F32, NORM_RULES),
    "O3": Policy(_F16, _F16, _F16),
}

_KEYS = {
    **dict.fromkeys(("params", "p"), "param_dtype"),
    **dict.fromkeys(("compute", "c"), "compute_dtype"),
    **dict.fromkeys(("output", "o"), "output_dtype"),
}


def get_policy(name: str) -> Policy:
    """A level preset or a parsed jmp policy string.

    Args:
      name: ``"O0"``, ``"O1"``, ``"O2"`` or ``"O3"`` (case-insensitive; see
        docs/guide/training.md); or a jmp string such as
        ``"params=float32,compute=float16,output=float32"`` (keys ``params``/``p``,
        ``compute``/``c``, ``output``/``o``; dtypes ``float32``/``f32``/``full``/
        ``single``, ``float16``/``f16``/``half``, ``bfloat16``/``bf16``,
        ``float64``/``f64``/``double``); or one dtype name for all three.
        A missing ``params`` is float32, a missing ``compute`` equals params,
        a missing ``output`` equals compute.  ``half`` is always float16 here
        (jmp picks bfloat16 on TPU).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    if name.strip().upper() in _PRESETS:
        return _PRESETS[name.strip().upper()]
    if "=" not in name:
        if re.fullmatch(r"\s*[oO]\d+\s*", name):
            raise ValueError(f"unknown level {name!r}; the levels are {', '.join(LEVELS)}")
        try:
            dt = _check_dtype(name, "name")
        except ValueError:
            raise ValueError(
                f"name {name!r} is neither a level ({', '.join(LEVELS)}), a dtype name "
                f"({', '.join(sorted(_DTYPE_NAMES))}) nor a jmp policy string such as "
                "'params=float32,compute=float16,output=float32'"
            ) from None
        return Policy(dt, dt, dt)
    fields: dict[str, np.dtype] = {}
    for part in name.split(","):
        if "=" not in part:
            raise ValueError(f"policy string part {part!r} is not key=dtype (in {name!r})")
        key, value = (s.strip().lower() for s in part.split("=", 1))
        if key not in _KEYS:
            raise ValueError(
                f"unknown policy key {key!r} in {name!r}; use params/p, compute/c, output/o"
            )
        if _KEYS[key] in fields:
            raise ValueError(f"policy key {key!r} given twice in {name!r}")
        fields[_KEYS[key]] = _check_dtype(value, key)
    param = fields.get("param_dtype", jnp.dtype(jnp.float32))
    compute = fields.get("compute_dtype", param)
    output = fields.get("output_dtype", compute)
    return Policy(param, compute, output)


def scaler_for(level: str) -> scalers.DynamicScaler | scalers.NoOpScaler:
    """The scaler a level pairs with: dynamic (torch defaults) for O1/O2,
    no-op for O0 and O3.

    Args:
      level: ``"O0"``, ``"O1"``, ``"O2"`` or ``"O3"`` (case-insensitive,
        surrounding spaces ignored); another string is a ``ValueError``, a
        non-string a ``TypeError`` (as in `get_policy`).
    """
    if not isinstance(level, str):
        raise TypeError(
            f"level must be a string, one of {LEVELS}, got {type(level).__name__} {level!r}"
        )
    if level.strip().upper() not in _PRESETS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    dynamic = level.strip().upper() in ("O1", "O2")
    return scalers.dynamic_scaler() if dynamic else scalers.no_op_scaler()
