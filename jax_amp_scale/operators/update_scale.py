"""The update-scale operator: one dynamic loss-scale step, ``ScaleState -> ScaleState``.

Everything of the operator lives here, in this order:

- its state (`ScaleState`, `init_scale_state`) and its argument checks, run
  once at the public boundary, at trace time;
- its pure-JAX reference (`update_scale_reference`), exact on every
  platform: the products come from `floats` in integer arithmetic;
- its native call (``jas_update_scale_v2``: ffi/update_scale_cpu.cc,
  ffi/update_scale_cuda.cu, ffi/ascend.cc; the rule in ffi/update_scale.h),
  partitioned per element, and the guard after CANN's kernel;
- the choice between them (`plan`) and the public functions
  (`update_scale`, `amp_update_scale`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import numbers
from collections.abc import Callable, Collection, Hashable, Iterable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import export  # jax 0.6: not an attribute of jax until imported
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding

from jax_amp_scale.mechanisms import custom_call as cc
from jax_amp_scale.mechanisms import floats, handlers
from jax_amp_scale.mechanisms.handlers import Backend

# Torch GradScaler's defaults, which are also jmp's and MindSpore's choices
# for growth and backoff.
DEFAULT_INIT_SCALE = 2.0**16
DEFAULT_GROWTH_FACTOR = 2.0
DEFAULT_BACKOFF_FACTOR = 0.5
DEFAULT_GROWTH_INTERVAL = 2000

# Which published kernel's arithmetic a state follows (docs/operator.md):
# torch's _amp_update_scale_ (float64 product, the default: a torch port
# gets torch's bits) or CANN's aclnnAmpUpdateScale (float32 factors and
# product, finiteness tested on the float32 product; plus the library's
# guard against an infinite stored scale).
RULES: tuple[str, ...] = ("torch", "cann")
DEFAULT_RULE = "torch"
INT32_MAX = 2**31 - 1
SHAPES: tuple[tuple[int, ...], ...] = ((), (1,))


# ---- argument checks ---------------------------------------------------------
#
# Each check names the argument and the values it allows, and returns the
# value in the form the code below takes, so nothing below validates again.


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _static(value: Any, name: str, kind: type, what: str, allowed: str) -> Any:
    """`value` (Python or NumPy) if it is a `kind` number, or a TypeError."""
    if isinstance(value, jax.Array):  # tracers are jax.Arrays too
        raise TypeError(
            f"{name} must be a Python {what} (it is a static attribute of the "
            f"operator), not a JAX array or traced value; got {type(value).__name__}"
        )
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    return value


def check_factor(value: Any, name: str) -> float:
    """`value` as a Python float: a static real number, finite, > 0."""
    out = float(_static(value, name, numbers.Real, "number", "a real number"))
    if not (math.isfinite(out) and out > 0.0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return out


def check_growth_interval(value: Any, name: str = "growth_interval") -> int:
    """`value` as a Python int in [1, 2**31 - 1]."""
    allowed = f"an integer in [1, {INT32_MAX}]"
    out = int(_static(value, name, numbers.Integral, "int", allowed))
    if not 1 <= out <= INT32_MAX:
        raise ValueError(f"{name} must lie in [1, {INT32_MAX}], got {out}")
    return out


def check_rule(value: Any, name: str = "rule") -> str:
    """Returns `value` if it is one of `RULES`, or raises naming `name`."""
    if not isinstance(value, str) or value not in RULES:
        raise ValueError(f"{name} must be one of {RULES}, got {value!r}")
    return value


def check_dtype(
    dtype: Any,
    name: str = "dtype",
    allowed: Collection[Any] = floats.SCALE_DTYPES,
    words: str = "float32, float16 or bfloat16",
) -> np.dtype:
    """`dtype` as a NumPy dtype if it is one of `allowed` (named by `words`)."""
    try:
        dt = jnp.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"{name} must be {words}, got {dtype!r}") from e
    if dt not in allowed:
        raise TypeError(f"{name} must be {words}, got {dt.name}")
    return dt


def check_static(
    growth_factor: Any, backoff_factor: Any, growth_interval: Any, rule: Any
) -> tuple[float, float, int, str]:
    """A state's static fields, checked, in the form the layers below take."""
    rule = check_rule(rule)
    gf = check_factor(growth_factor, "growth_factor")
    bf = check_factor(backoff_factor, "backoff_factor")
    if rule == "cann":
        gf = floats.check_factor_in_float32(gf, "growth_factor")
        bf = floats.check_factor_in_float32(bf, "backoff_factor")
    return gf, bf, check_growth_interval(growth_interval), rule


def check_scale(x: Any, name: str) -> jax.Array:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        raise TypeError(
            f"{name} must be a float32/float16/bfloat16 array of shape () or (1,), "
            f"got {type(x).__name__}"
        )
    if jnp.dtype(dtype) not in floats.SCALE_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {jnp.dtype(dtype).name}")
    if tuple(x.shape) not in SHAPES:
        raise ValueError(f"{name} must have shape () or (1,), got {tuple(x.shape)}")
    return jnp.asarray(x)


def check_tracker(x: Any, shape: tuple[int, ...], name: str) -> jax.Array:
    dtype = getattr(x, "dtype", None)
    if dtype is None or jnp.dtype(dtype) != jnp.int32:
        got = jnp.dtype(dtype).name if dtype is not None else type(x).__name__
        raise TypeError(f"{name} must be an int32 array, got {got}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have the shape of the scale {shape}, got {tuple(x.shape)}")
    return jnp.asarray(x)


def found_to_bool(found_inf: Any, shape: tuple[int, ...]) -> jax.Array:
    """found_inf (any bool/int/float scalar) -> bool array of `shape`.

    Nonzero, subnormal and NaN mean overflow; +0.0 and -0.0 do not, read
    from the bits in every path (eager, jit, vmap).
    """
    if isinstance(found_inf, bool | numbers.Number) and not isinstance(found_inf, complex):
        return jnp.full(shape, bool(found_inf != 0))  # Python arithmetic: exact
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
    if tuple(found_inf.shape) not in SHAPES:
        raise ValueError(
            f"found_inf must be a scalar (shape () or (1,)), got shape {tuple(found_inf.shape)}"
        )
    if isinstance(found_inf, np.ndarray | np.generic):  # host value: NumPy is exact
        return jnp.full(shape, bool(np.asarray(found_inf).reshape(()) != 0))
    return floats.nonzero_bits(jnp.asarray(found_inf)).reshape(shape)


def or_across(found: jax.Array, axis_name: Hashable | None) -> jax.Array:
    """`found` OR-reduced over the mapped axis (or tuple of axes) `axis_name`."""
    if axis_name is None:
        return found
    return jax.lax.pmax(found.astype(jnp.int32), axis_name) > 0


T = TypeVar("T")
# Results of `checked_once`, by check and by its arguments' types and values.
_CHECKED: dict[tuple[Any, ...], Any] = {}


def checked_once(check: Callable[..., T], *args: Any) -> T:
    """``check(*args)``, run once per distinct (hashable) arguments.

    States and scalers are rebuilt on every step and every unflatten with
    the static fields they were built with; those were checked then.
    """
    key = (check, args, tuple(map(type, args)))
    with contextlib.suppress(KeyError, TypeError):  # TypeError: unhashable
        return _CHECKED[key]  # type: ignore[no-any-return]
    out = check(*args)
    with contextlib.suppress(TypeError):
        _CHECKED[key] = out
    return out


# ---- the state ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScaleState:
    """Dynamic loss-scale state, one step of which is `update_scale`.

    Leaves (arrays, change every step):
      scale: the loss scale, float32/float16/bfloat16, shape ``()`` or ``(1,)``.
      growth_tracker: int32 count of consecutive finite steps, same shape.

    Static metadata (Python numbers; part of the treedef, so they become
    compile-time constants and FFI attributes):
      growth_factor: multiplier applied every ``growth_interval`` finite steps.
      backoff_factor: multiplier applied on a step with non-finite gradients.
      growth_interval: finite steps between growths, in [1, 2**31 - 1].
      rule: ``"torch"`` (default) or ``"cann"``: whose arithmetic
        ``scale * factor`` follows.  ``"torch"``: the exact product rounded
        to float64, then to the scale's dtype (``torch._amp_update_scale_``).
        ``"cann"``: factors rounded to float32, the scale widened to float32,
        a float32 product, growth refused when it is not finite or when the
        value stored in the scale's dtype is infinite (CANN's
        ``aclnnAmpUpdateScale`` plus that guard).  Both give the same bits
        for power-of-two factors (the defaults 2.0 and 0.5).

    The rule, per step (``found_inf`` nonzero or NaN means overflow)::

      if found_inf:
          scale, tracker = scale * backoff_factor, 0
      elif tracker + 1 == growth_interval:       # int32, wrapping
          grown = scale * growth_factor
          scale = grown if isfinite(grown) else scale
          tracker = 0
      else:
          tracker = tracker + 1

    Build one with `init_scale_state`.  The static fields are checked when
    a state is built, so a `ScaleState` that exists has valid ones; the
    leaves are checked where they are used (transformations rebuild a state
    with batched or tangent leaves).
    """

    scale: jax.Array
    growth_tracker: jax.Array
    growth_factor: float = DEFAULT_GROWTH_FACTOR
    backoff_factor: float = DEFAULT_BACKOFF_FACTOR
    growth_interval: int = DEFAULT_GROWTH_INTERVAL
    rule: str = DEFAULT_RULE

    def __post_init__(self) -> None:
        static = (self.growth_factor, self.backoff_factor, self.growth_interval, self.rule)
        for name, value in zip(STATIC_FIELDS, checked_once(check_static, *static), strict=True):
            object.__setattr__(self, name, value)


STATIC_FIELDS = ("growth_factor", "backoff_factor", "growth_interval", "rule")


# Leaves and static fields are declared once, here; jmp's hand-written
# flatten once dropped a field this way, so every field is tested under jit.
jax.tree_util.register_dataclass(
    ScaleState,
    data_fields=["scale", "growth_tracker"],
    meta_fields=list(STATIC_FIELDS),
)


def _serialize_auxdata(aux: tuple[Any, ...]) -> bytes:
    # JSON keeps a float's repr, which reads back to the same double.
    return json.dumps(list(aux)).encode()


def _deserialize_auxdata(data: bytes) -> tuple[Any, ...]:
    return tuple(json.loads(data.decode()))


# For jax.export: a step whose arguments or results hold a ScaleState can be
# serialized (jax_amp_scale.export).  The name is part of every artifact:
# never change it.
export.register_pytree_node_serialization(
    ScaleState,
    serialized_name="jax_amp_scale.ScaleState",
    serialize_auxdata=_serialize_auxdata,
    deserialize_auxdata=_deserialize_auxdata,
)


def init_scale_state(
    init_scale: float = DEFAULT_INIT_SCALE,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    backoff_factor: float = DEFAULT_BACKOFF_FACTOR,
    growth_interval: int = DEFAULT_GROWTH_INTERVAL,
    dtype: Any = jnp.float32,
    shape: tuple[int, ...] = (),
    rule: str = DEFAULT_RULE,
) -> ScaleState:
    """Creates a `ScaleState` with tracker 0.

    Args:
      init_scale: starting loss scale (default ``2**16``); finite, > 0 and
        finite in ``dtype`` (``2**16`` overflows float16: use at most 65504
        there).
      growth_factor: the factor the scale grows by after `growth_interval`
        finite steps (default 2.0); a finite number > 0.
      backoff_factor: the factor the scale shrinks by after an overflow
        (default 0.5); a finite number > 0.
      growth_interval: finite steps in a row before the scale grows
        (default 2000); an integer in [1, 2**31 - 1].
      dtype: the scale's dtype: ``jnp.float32`` (default), ``jnp.float16``
        or ``jnp.bfloat16`` (the Ascend operator's dtypes).
      shape: ``()`` (default) or ``(1,)`` (the Ascend operator uses ``(1,)``).
      rule: ``"torch"`` (default) or ``"cann"``; see `ScaleState`.

    Defaults equal torch's ``GradScaler`` (2**16, 2.0, 0.5, 2000).
    """
    dt = check_dtype(dtype)
    check_rule(rule)
    init = check_factor(init_scale, "init_scale")
    shape = tuple(shape)
    if shape not in SHAPES:
        raise ValueError(f"shape must be () or (1,), got {shape}")
    with np.errstate(over="ignore"):
        scale = np.asarray(init, dtype=dt)
    if not np.isfinite(scale.astype(np.float32)):
        raise ValueError(
            f"init_scale={init_scale!r} is not finite in {dt.name} (max {float(jnp.finfo(dt).max)})"
        )
    return ScaleState(
        scale=jnp.full(shape, init, dtype=dt),
        growth_tracker=jnp.zeros(shape, dtype=jnp.int32),
        growth_factor=growth_factor,
        backoff_factor=backoff_factor,
        growth_interval=growth_interval,
        rule=rule,
    )


# ---- the reference: every platform ------------------------------------------


# Jitted so that an eager (un-jitted) call runs as one compiled kernel instead
# of ~150 dispatched integer ops; inside an outer jit it is simply inlined.
@functools.partial(
    jax.jit, static_argnames=("growth_factor", "backoff_factor", "growth_interval", "rule")
)
def update_scale_reference(
    scale: jax.Array,
    growth_tracker: jax.Array,
    found: jax.Array,
    *,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    rule: str = "torch",
) -> tuple[jax.Array, jax.Array]:
    """One step of the rule, elementwise.

    Args:
      scale: float32/float16/bfloat16 array.
      growth_tracker: int32 array of the same shape.
      found: bool array of the same shape (True: overflow on this step).
      growth_factor, backoff_factor, growth_interval: validated Python numbers.
      rule: ``"torch"`` (`floats.torch_product`) or ``"cann"`` (CANN's
        float32 kernel plus the guard: `floats.cann_product`).

    Returns:
      ``(updated_scale, updated_growth_tracker)`` with the input shapes/dtypes.
    """
    fm = floats.FORMATS[jnp.dtype(scale.dtype)]
    bits = jax.lax.bitcast_convert_type(scale, fm.bits_dtype)
    backed_off, _ = floats.product(bits, scale.dtype, backoff_factor, rule)
    grown, grown_finite = floats.product(bits, scale.dtype, growth_factor, rule)

    # int32 addition wraps in XLA (two's complement), as the spec requires.
    successful = growth_tracker + jnp.int32(1)
    grow = successful == jnp.int32(growth_interval)

    new_bits = jnp.where(found, backed_off, jnp.where(grow & grown_finite, grown, bits))
    new_tracker = jnp.where(found | grow, jnp.zeros_like(growth_tracker), successful)
    return jax.lax.bitcast_convert_type(new_bits, scale.dtype), new_tracker


# ---- the native call -----------------------------------------------------------

# One update of (scale, tracker, found): the reference bound to a state's attributes.
UpdateFn = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]

# The operator's attributes and the types its handlers decode them as.
ATTRIBUTES = {
    "growth_factor": np.float64,
    "backoff_factor": np.float64,
    "growth_interval": np.int64,
    "rule": str,
}


def call_native(
    target: str, scale: jax.Array, tracker: jax.Array, found: jax.Array, **attrs: Any
) -> tuple[jax.Array, jax.Array]:
    """One ``ffi_call`` of `target` with the operator's `ATTRIBUTES` (all of
    them); `found` is bool."""
    # The operator's dtype rule: found_inf has the scale's dtype (1 or 0).
    found_inf = found.astype(scale.dtype)
    attrs = {name: kind(attrs[name]) for name, kind in ATTRIBUTES.items()}

    def call(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, ...]:
        ffi = jax.ffi.ffi_call(
            target,
            (jax.ShapeDtypeStruct(s.shape, s.dtype), jax.ShapeDtypeStruct(t.shape, jnp.int32)),
            # A vmapped batch of states goes to the handler in one call.
            vmap_method="broadcast_all",
            # In place, as torch_npu calls aclnnAmpUpdateScale.
            input_output_aliases={0: 0, 1: 1},
        )
        return tuple(ffi(s, t, f, **attrs))

    # Each device updates the states it holds (`per_element`).
    new_scale, new_tracker = per_element(call)(scale, tracker, found_inf)
    # ffi_call types its results from the ShapeDtypeStructs above, which say
    # nothing of shard_map's varying axes; the state varies wherever an input
    # does, and shard_map's replication check relies on knowing that.
    return cc.vary_like((new_scale, new_tracker), scale, tracker, found)


def refuse_infinite_growth(
    old_scale: jax.Array, found: jax.Array, new_scale: jax.Array
) -> jax.Array:
    """`new_scale`, except where growth stored an infinite value: there `old_scale`.

    The library's guard around ``aclnnAmpUpdateScale``, whose kernel tests
    finiteness on the float32 product and casts to float16/bfloat16 after
    (hicann/ops-math ``math/amp_update_scale/op_kernel/amp_update_scale.h``
    :146-147, :162-172), so float16 32768 grown x2 is stored as inf.  Without
    `found` the scale changes only by growth, so a finite scale that became
    infinite did so there; the tracker is 0 either way.  Bits only, no float
    comparison.  float32 needs no guard (the kernel's own test covers it).
    """
    if jnp.dtype(old_scale.dtype) == jnp.float32:
        return new_scale
    grew_to_inf = ~found & floats.is_inf(new_scale) & ~floats.is_inf(old_scale)
    return jnp.where(grew_to_inf, old_scale, new_scale)


def _elementwise_rule(ndim: int, n_in: int, n_out: int) -> str:
    value = " ".join(f"d{d}" for d in range(ndim))
    return ", ".join([value] * n_in) + " -> " + ", ".join([value] * n_out)


def _per_element_partitioned(fn: Callable[..., Any], *args: jax.Array) -> Any:
    shape = args[0].shape
    if cc.unwrapped() or any(a.shape != shape for a in args):
        return tuple(cc.typed_like(y, args[0]) for y in fn(*args))
    n_out = len(jax.eval_shape(fn, *args))

    @custom_partitioning
    def call(*xs: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(cc.typed_like(y, xs[0]) for y in fn(*xs))

    def sharding(mesh: Any, arg_shapes: Any) -> Any:
        s = cc.operand_sharding(mesh, arg_shapes[0])
        # Unnamed (no mesh) and sharded: replicate rather than raise, which
        # would abort the process inside XLA's compiler.
        return s if isinstance(s, NamedSharding) else cc.replicated_like(s)

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


def update_scale_native(
    scale: jax.Array,
    tracker: jax.Array,
    found: jax.Array,
    *,
    target: str,
    native_on: Iterable[str],
    fallback: UpdateFn | None,
    guarded: Iterable[str] = (),
    **attrs: float | str,
) -> tuple[jax.Array, jax.Array]:
    """The custom call on platforms in `native_on`; elsewhere `fallback`
    (bound to the same attributes) or, when it is None, a lowering-time error.
    On platforms in `guarded` (Ascend: the operator is CANN's kernel) the
    result passes through `refuse_infinite_growth`."""

    def native(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        return call_native(target, s, t, f, **attrs)  # type: ignore[arg-type]

    def native_guarded(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        new_s, new_t = native(s, t, f)
        return refuse_infinite_growth(s, f, new_s), new_t

    def other(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        if fallback is not None:
            return fallback(s, t, f)
        return cc.unavailable(handlers.UPDATE_SCALE, (s, t))  # type: ignore[no-any-return]

    guarded = frozenset(guarded)
    overrides = {p: native_guarded for p in native_on if p in guarded}
    return cc.per_platform(  # type: ignore[no-any-return]
        native, other, scale, tracker, found, native_on=native_on, overrides=overrides
    )


# ---- the choice, and the operator -------------------------------------------


def exact_on_cann(factor: float) -> bool:
    """Whether `factor` is a power of two that is a normal float32 (then
    CANN's float32 product gives torch's bits)."""
    k = floats.power_of_two_exponent(factor)
    return k is not None and -126 <= k <= 127


def cann_serves(rule: str, growth_factor: float, backoff_factor: float) -> bool:
    """Whether aclnnAmpUpdateScale (plus the guard) gives `rule`'s bits."""
    return rule == "cann" or (exact_on_cann(growth_factor) and exact_on_cann(backoff_factor))


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
    rule: str = DEFAULT_RULE,
) -> tuple[jax.Array, jax.Array]:
    """One dynamic loss-scale update, with the arguments of ``aclnnAmpUpdateScale``.

    Args:
      current_scale: float32, float16 or bfloat16 array of shape ``()`` or ``(1,)``.
      growth_tracker: int32 array of the same shape.
      found_inf: bool/int/float scalar (Python, NumPy or JAX; shape ``()`` or
        ``(1,)``). Nonzero or NaN means this step overflowed.
      growth_factor: what the scale is multiplied by after `growth_interval`
        finite steps; a Python number, finite and > 0 (static).
      backoff_factor: what the scale is multiplied by after an overflow; a
        Python number, finite and > 0 (static).
      growth_interval: Python int in [1, 2**31 - 1] (static).
      backend: ``"reference"`` (pure JAX, every platform), ``"ffi"`` (the
        native custom call; lowering fails clearly on a platform without a
        handler) or ``"auto"`` (per lowering platform: the native handler
        on the CPU, where it measured faster in ``bench/``, and on Ascend,
        CANN's own operators; the reference on CUDA, whose handler has never
        run on a GPU, and elsewhere: `auto_backend` answers).
      axis_name: optional mapped axis name, or tuple of names, of
        ``shard_map``/``pmap``/``vmap``; found_inf is OR-reduced across it so
        every replica takes one decision.
      rule: ``"torch"`` (default: torch's float64 product) or ``"cann"``
        (CANN's float32 kernel plus the guard); see `ScaleState`.  Every
        backend gives the chosen rule's bits.

    Returns:
      ``(updated_scale, updated_growth_tracker)``, shapes and dtypes of the inputs.
      The state is not differentiable: gradients through it are zero.
    """
    chosen = handlers.check_backend(backend)
    gf, bf, gi, rule = check_static(growth_factor, backoff_factor, growth_interval, rule)
    scale = check_scale(current_scale, "current_scale")
    tracker = check_tracker(growth_tracker, tuple(scale.shape), "growth_tracker")
    found = found_to_bool(found_inf, tuple(scale.shape))
    attrs = dict(growth_factor=gf, backoff_factor=bf, growth_interval=gi, rule=rule)
    return update_scale_checked(scale, tracker, found, attrs, chosen, axis_name)


def update_scale_checked(
    scale: jax.Array,
    tracker: jax.Array,
    found: jax.Array,
    attrs: dict[str, Any],
    backend: str,
    axis_name: Hashable | None = None,
) -> tuple[jax.Array, jax.Array]:
    """`amp_update_scale` on inputs already checked (`found` a bool array;
    `attrs` the state's growth_factor, backoff_factor, growth_interval, rule)."""
    # The state carries no gradient; stopping it here also means the custom
    # call never needs a JVP rule under jax.grad.
    scale, tracker, found = (jax.lax.stop_gradient(x) for x in (scale, tracker, found))
    found = or_across(found, axis_name)
    plan = handlers.plan(
        handlers.UPDATE_SCALE,
        backend,
        partitions=cc.partitions([scale, tracker, found]),
        not_auto=frozenset()
        if cann_serves(attrs["rule"], attrs["growth_factor"], attrs["backoff_factor"])
        else handlers.CANN_PLATFORMS,
    )
    if plan.mode == "reference":
        return update_scale_reference(scale, tracker, found, **attrs)

    def reference(s: jax.Array, t: jax.Array, f: jax.Array) -> tuple[jax.Array, jax.Array]:
        return update_scale_reference(s, t, f, **attrs)

    return update_scale_native(
        scale,
        tracker,
        found,
        target=plan.target,
        native_on=plan.platforms,
        fallback=reference if plan.mode == "native" else None,
        guarded=plan.cann_platforms,
        **attrs,
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
        hint = ""
        if hasattr(state, "inner_state"):
            hint = "; take the ScaleState out with jax_amp_scale.find_scale_state(opt_state)"
        elif hasattr(state, "scale_state"):
            hint = "; a scaler advances with its own .update(found_inf)"
        raise TypeError(f"state must be a ScaleState, got {type(state).__name__}{hint}")
    # The static fields were checked when the state was built; its leaves
    # and the other arguments are checked here.
    chosen = handlers.check_backend(backend)
    scale = check_scale(state.scale, "state.scale")
    tracker = check_tracker(state.growth_tracker, tuple(scale.shape), "state.growth_tracker")
    found = found_to_bool(found_inf, tuple(scale.shape))
    attrs = {name: getattr(state, name) for name in STATIC_FIELDS}
    scale, tracker = update_scale_checked(scale, tracker, found, attrs, chosen, axis_name)
    return dataclasses.replace(state, scale=scale, growth_tracker=tracker)
