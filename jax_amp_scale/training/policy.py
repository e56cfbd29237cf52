"""Precision policies: which dtype parameters, computation and outputs use.

`Policy(param_dtype, compute_dtype, output_dtype)` follows jmp's convention
(and accepts its policy strings, see `get_policy`), with one addition: rules
that keep some leaves in float32 whatever the compute dtype, chosen by the
names on their pytree path (for example norm layers under O2).

A string rule matches *whole names*: the regular expression must match one
whole component of the leaf's path (``re.fullmatch``), a component being a
dict key, attribute name or index, with haiku's ``"a/~/b"`` keys split at
``/``.  So the O1/O2 norm rule keeps ``LayerNorm_0``, ``layer_norm``,
``post_attention_layernorm``, ``bn1`` and ``ln_f``, but not
``kernel_ln_proj`` or ``unnormalized_head``.

Levels (``get_policy("O0")`` ... ``"O3"``, after the Apex/MindSpore AMP
levels) and the scaler each pairs with (`scaler_for`):

=====  ========  ========  ========  ===========================  ===========
level  params    compute   output    kept float32                 loss scale
=====  ========  ========  ========  ===========================  ===========
O0     float32   float32   float32   (everything is)              none
O1     float32   float16   float32   norm layers and every leaf   dynamic
                                     of rank < 2 (biases, scales)
O2     float32   float16   float32   norm layers                  dynamic
O3     float16   float16   float16   nothing                      none
=====  ========  ========  ========  ===========================  ===========

Parameters (the master weights the optimizer updates) stay float32 in O0-O2;
``cast_to_compute`` makes the float16 copy the forward pass uses, and the
gradients flow back through that cast in float32.  O3 stores and updates
float16 parameters and does not scale.

JAX runs an operation in float16 only when all its floating operands are
float16 (type promotion widens mixed ones to float32).  O1 approximates the
"white list of compute-heavy ops" of the spec with pytree casting alone: its
matrix and convolution weights (rank >= 2) and inputs become float16, its
vectors stay float32, so matmuls are float16 where their input activations
are.  Models that set per-layer dtypes themselves (flax ``dtype=``) get exact
control; policies only cast pytrees.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.state.tree import is_float_leaf
from jax_amp_scale.state.validation import check_dtype
from jax_amp_scale.training import scalers

PyTree = Any
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
    names: list[str] = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            name = str(key.key)
        elif isinstance(key, jax.tree_util.GetAttrKey):
            name = key.name
        elif isinstance(key, jax.tree_util.SequenceKey):
            name = str(key.idx)
        elif isinstance(key, jax.tree_util.FlattenedIndexKey):
            name = str(key.key)
        else:
            name = str(key)
        names.extend(part for part in name.split("/") if part and part != "~")
    return names


def _rank_below_2(path: str, leaf: Any) -> bool:
    return jnp.ndim(leaf) < 2


_DTYPE_NAMES = {
    "float32": jnp.float32,
    "f32": jnp.float32,
    "full": jnp.float32,
    "single": jnp.float32,
    "float16": jnp.float16,
    "f16": jnp.float16,
    "half": jnp.float16,
    "bfloat16": jnp.bfloat16,
    "bf16": jnp.bfloat16,
    "float64": jnp.float64,
    "f64": jnp.float64,
    "double": jnp.float64,
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
        whole name on the leaf's path (``re.fullmatch``; see the module
        docstring), a callable gets ``(path, leaf)`` with the path as
        ``jax.tree_util.keystr`` (``"['LayerNorm_0']['scale']"``) and
        returns a bool.

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
        for rule in self.keep_float32:
            if isinstance(rule, str):
                if any(re.fullmatch(rule, n) for n in names):
                    return True
            elif rule(jax.tree_util.keystr(path), leaf):
                return True
        return False

    def _cast(self, tree: PyTree, dtype: np.dtype, use_rules: bool) -> PyTree:
        def one(path: Any, x: Any) -> Any:
            if not is_float_leaf(x):
                return x
            target = dtype
            if use_rules and self.keep_float32 and self._keep(path, x):
                target = jnp.dtype(jnp.float32)
            return x if x.dtype == target else jnp.asarray(x).astype(target)

        return jax.tree_util.tree_map_with_path(one, tree)

    def cast_to_param(self, tree: PyTree) -> PyTree:
        """Floating leaves to `param_dtype` (keep-float32 leaves to float32)."""
        return self._cast(tree, self.param_dtype, True)

    def cast_to_compute(self, tree: PyTree) -> PyTree:
        """Floating leaves to `compute_dtype` (keep-float32 leaves to float32)."""
        return self._cast(tree, self.compute_dtype, True)

    def cast_to_output(self, tree: PyTree) -> PyTree:
        """Floating leaves to `output_dtype` (no keep rules: outputs are outputs)."""
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
    "params": "param_dtype",
    "p": "param_dtype",
    "compute": "compute_dtype",
    "c": "compute_dtype",
    "output": "output_dtype",
    "o": "output_dtype",
}


def get_policy(name: str) -> Policy:
    """A level preset or a parsed jmp policy string.

    Args:
      name: ``"O0"``, ``"O1"``, ``"O2"`` or ``"O3"`` (see the module table;
        case-insensitive); or a jmp string such as
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
    no-op for O0 and O3."""
    if not isinstance(level, str) or level.strip().upper() not in _PRESETS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if level.strip().upper() in ("O1", "O2"):
        return scalers.dynamic_scaler()
    return scalers.no_op_scaler()
