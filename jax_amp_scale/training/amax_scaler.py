"""`amax_scaler`: a power-of-two loss scale set ahead of overflow from the
step's amax, measured by the gradient pass itself (docs/guide/amax-scaler.md).
Its rule is its own; `DynamicScaler` keeps torch's."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Hashable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.mechanisms.floats import is_float_leaf
from jax_amp_scale.mechanisms.handlers import Backend, check_backend
from jax_amp_scale.operators import unscale_and_check as gradient_pass
from jax_amp_scale.operators.scale_state import INT32_MAX, ScaleState, check_factor, check_int
from jax_amp_scale.operators.unscale_and_check import PyTree
from jax_amp_scale.training.scalers import ScalerBase, fixed_state, found_flag, register_scaler

# AmaxScaler's reason codes (its ``reason`` leaf).
_NO_STEP, _FINITE, _OVERFLOW, _NOT_SCALE = -1, 0, 1, 2
_GROWTH_LOG2 = 1  # at most x2 per step once a step has been measured
_NO_LIMIT = 1 << 20  # "no bound" for an exponent (all-zero gradients)


@dataclasses.dataclass(frozen=True)
class AmaxScaler(ScalerBase):
    """A power-of-two scale set ahead of overflow from the step's amax.

    Build one with `amax_scaler` (the rule, in full, is in its docstring and
    in docs/guide/amax-scaler.md).  ``unscale_and_update`` unscales and checks
    the gradients and measures ``amax``, the largest absolute gradient among the
    finite entries in scaled units, in the same function; ``update(found_inf,
    amax=...)`` applies the rule.

    Leaves: ``state`` (a `ScaleState` whose factors are 1.0: the core
    `update_scale` never moves it), ``amax`` (float32, the last step's),
    ``headroom_used`` (float32, ``amax / largest finite of compute_dtype``),
    ``reason`` (int32: -1 no step yet, 0 finite, 1 overflow: backed off, 2
    non-finite but not attributed to the scale: skipped, scale held),
    ``run`` (int32, non-finite steps in a row), ``finite_steps`` (int32),
    ``leaf_amax`` (float32, one per named leaf; None unless asked).
    Static: ``margin``, ``micro_batches``, ``min_scale``, ``max_scale``,
    ``max_backoffs``, ``compute_dtype`` (a dtype name), ``leaf_paths``,
    ``drop_overflow_update``, ``measured`` (one bool per gradient leaf: the
    leaves whose amax sets the scale; () for all).
    """

    state: ScaleState
    amax: jax.Array
    headroom_used: jax.Array
    reason: jax.Array
    run: jax.Array
    finite_steps: jax.Array
    leaf_amax: jax.Array | None
    margin: int = 5
    micro_batches: int = 1
    min_scale: float = 2.0**-24
    max_scale: float = 2.0**24
    max_backoffs: int = 4
    compute_dtype: str = "float16"
    leaf_paths: tuple[str, ...] = ()
    drop_overflow_update: bool = True
    measured: tuple[bool, ...] = ()

    REASONS: ClassVar[dict[int, str]] = {
        _NO_STEP: "no step yet",
        _FINITE: "finite",
        _OVERFLOW: "overflow",
        _NOT_SCALE: "non-finite, not the scale",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "leaf_paths", tuple(self.leaf_paths))  # JSON gives a list
        object.__setattr__(self, "measured", tuple(bool(m) for m in self.measured))

    @property
    def largest(self) -> float:
        """The largest finite value of ``compute_dtype`` (65504 for float16)."""
        return float(jnp.finfo(jnp.dtype(self.compute_dtype)).max)

    @property
    def target(self) -> float:
        """The line the amax is kept under, ``largest / 2**(margin + ceil(log2(micro_batches)))``."""
        return self.largest / 2.0 ** (self.margin + _ceil_log2(self.micro_batches))

    def unscale_and_update(
        self,
        grads: PyTree,
        *,
        axis_name: Hashable | None = None,
        backend: Backend = "auto",
        update_backend: Backend | None = None,
    ) -> tuple[PyTree, jax.Array, AmaxScaler]:
        """``(unscaled, found_inf, next scaler)``, the amax measured in the pass.

        Args:
          grads: the gradients of the scaled loss (any pytree, mixed dtypes);
            floating leaves are unscaled and checked, the others pass.
          axis_name: optional mapped axis name, or tuple of names: the flag is
            OR-reduced and the amaxes max-reduced across it (one all-reduce).
          backend: the gradient pass's backend: ``"auto"`` (default: the
            native pass on CPU where it is built, the reference elsewhere),
            ``"reference"`` or ``"ffi"``.
          update_backend: not used (the rule is pure JAX); taken, and checked,
            so that generic scaler code can pass it: None (default) or a backend.
        """
        if update_backend is not None:
            check_backend(update_backend)  # checked, then unused: the rule is pure JAX
        # The amax comes from the pass itself (one read of each gradient on
        # the CPU's native pass); under axis_name, one pmax beside the flag's.
        scale = self.state.scale.reshape(())
        grads, found, per_leaf = gradient_pass.unscale_check_amax(grads, scale, backend)
        if axis_name is not None:  # one all-reduce: the flag (0 or 1) beside the amaxes
            both = jax.lax.pmax(
                jnp.concatenate([found.astype(jnp.float32)[None], per_leaf]), axis_name
            )
            found, per_leaf = both[0] > 0, both[1:]
        amax = jnp.max(per_leaf[self._measured_index(grads)], initial=0.0)
        return grads, found, self.update(found, amax=amax, leaf_amax=per_leaf)

    def _measured_index(self, grads: PyTree) -> Any:
        """The floating leaves whose amax sets the scale: all, or those `measured` marks."""
        leaves = jax.tree.leaves(grads)
        if not self.measured:
            return slice(None)
        if len(leaves) != len(self.measured):
            raise ValueError(
                f"amax_scaler(measure=...) marked {len(self.measured)} leaves, but the gradients "
                f"have {len(leaves)}: pass measure a tree of bools shaped like the gradients"
            )
        floating = [m for m, g in zip(self.measured, leaves, strict=True) if is_float_leaf(g)]
        if not any(floating):  # an empty max would read 0 and grow the scale to max_scale
            raise ValueError("amax_scaler(measure=...) marks no floating leaf of the gradients")
        return np.flatnonzero(np.asarray(floating, bool))

    def update(
        self,
        found_inf: Any,
        *,
        amax: Any = None,
        leaf_amax: Any = None,
        axis_name: Hashable | None = None,
        backend: Backend = "auto",
    ) -> AmaxScaler:
        """The scaler after one step (see `amax_scaler` for the rule).

        Args:
          found_inf: whether this step's gradients were not finite: a bool,
            int or float scalar (Python, NumPy or JAX; shape ``()`` or
            ``(1,)``), read by its bits: nonzero, subnormal and NaN count.
          amax: the step's amax in scaled units (finite entries only), a
            float scalar, as `unscale_and_update` measures it; None (default,
            generic code that passes only ``found_inf``): nothing measured,
            so a finite step keeps the scale.
          leaf_amax: the step's amax per floating leaf named by ``per_leaf``,
            one float each, in ``tree_flatten`` order; None (default) keeps the
            last ones.  Ignored when the scaler was built without ``per_leaf``.
          axis_name: optional mapped axis name, or tuple of names:
            ``found_inf`` is OR-reduced and `amax` and `leaf_amax`
            max-reduced across it.
          backend: not used (the rule is pure JAX); taken, and checked, so
            that generic scaler code can pass it: ``"auto"`` (default),
            ``"reference"`` or ``"ffi"``.
        """
        check_backend(backend)  # checked, then unused: the rule is pure JAX
        found = found_flag(found_inf, self.state, axis_name).reshape(())
        a = _scalar_amax(amax, axis_name)
        per = self._next_leaf_amax(leaf_amax, axis_name)
        e_new, back = self._next_exponent(found, a, measured=amax is not None)
        scale = jnp.ldexp(jnp.float32(1.0), e_new.astype(jnp.int32))
        reason = jnp.where(found, jnp.where(back, _OVERFLOW, _NOT_SCALE), _FINITE)
        return dataclasses.replace(
            self,
            state=dataclasses.replace(
                self.state, scale=scale.reshape(self.state.scale.shape).astype(self.scale.dtype)
            ),
            amax=a,
            headroom_used=a / jnp.float32(self.largest),
            reason=reason.astype(jnp.int32),
            run=jnp.where(found, self.run + 1, 0).astype(jnp.int32),
            finite_steps=(self.finite_steps + (~found).astype(jnp.int32)).astype(jnp.int32),
            leaf_amax=per,
        )

    def _next_leaf_amax(self, leaf_amax: Any, axis_name: Hashable | None) -> jax.Array | None:
        """`update`'s ``leaf_amax``, checked and max-reduced over `axis_name`."""
        if not self.leaf_paths:
            return None  # not asked for (and no empty array: orbax refuses those)
        if leaf_amax is None:
            return self.leaf_amax
        per = jnp.asarray(leaf_amax, jnp.float32)
        if per.shape != (len(self.leaf_paths),):
            raise ValueError(
                f"leaf_amax must have shape ({len(self.leaf_paths)},), one amax per floating "
                f"leaf that amax_scaler(per_leaf=...) named; got shape {per.shape} (pass "
                f"per_leaf a tree shaped like the gradients)"
            )
        return per if axis_name is None else jax.lax.pmax(per, axis_name)

    def _next_exponent(
        self, found: jax.Array, a: jax.Array, *, measured: bool
    ) -> tuple[jax.Array, jax.Array]:
        """The rule: log2 of the next scale (clipped), and whether a non-finite
        step backs off (reason 1) rather than holds (reason 2)."""
        e_lo, e_hi = _log2_exact(self.min_scale), _log2_exact(self.max_scale)
        e_s = jnp.frexp(self.state.scale.reshape(()).astype(jnp.float32))[1] - 1  # log2(scale)
        k = self._room(a)  # largest k with a * 2**k <= target
        # A finite step: the rule, growth at most x2 once a step has been measured.
        grow = jnp.where(self.finite_steps > 0, jnp.minimum(k, _GROWTH_LOG2), k)
        k_fin = grow if measured else jnp.zeros((), jnp.int32)
        # A non-finite step: back off (at least x1/2, more if the finite entries
        # ask for it) when the finite entries had reached the target line, for
        # the first max_backoffs such steps in a row, and then when the run's
        # length is a power of two (a NaN the model makes walks the scale down
        # only logarithmically in its length); else hold.  Before any finite
        # step nothing is known: from above 1, fall to the probe scale 1 at once
        # (or lower, if the back-off asks for it).
        run = self.run
        explained = a >= jnp.float32(self.target)
        first = self.finite_steps == 0
        above = first & (e_s > 0)
        back = above | explained | (run < self.max_backoffs) | (((run + 1) & run) == 0)
        k_off = jnp.minimum(k, 0) - 1
        k_off = jnp.where(first, jnp.minimum(k_off, jnp.where(e_s > 0, -e_s, 0)), k_off)
        k_bad = jnp.where(back, k_off, 0)
        return jnp.clip(e_s + jnp.where(found, k_bad, k_fin), e_lo, e_hi), back

    def _room(self, a: jax.Array) -> jax.Array:
        """int32: the largest k with ``a * 2**k <= target`` (exact; large for a == 0)."""
        m_t, e_t = math.frexp(self.target)
        m_a, e_a = jnp.frexp(a)
        k = e_t - e_a - (m_a > jnp.float32(m_t)).astype(jnp.int32)
        return jnp.where(a > 0, k, _NO_LIMIT).astype(jnp.int32)

    def leaf_report(self) -> dict[str, float]:
        """Host side: ``{keystr path: amax}`` of the last step, per named leaf."""
        if self.leaf_amax is None:
            return {}
        values = np.asarray(jax.device_get(self.leaf_amax), np.float64).reshape(-1)
        return dict(zip(self.leaf_paths, values.tolist(), strict=True))


def _scalar_amax(amax: Any, axis_name: Hashable | None) -> jax.Array:
    """`update`'s ``amax`` as a float32 scalar (0 for None), max-reduced over
    `axis_name`; another shape is refused here, at trace time (a reshape
    would fail inside jax with a message that names no argument)."""
    a = jnp.zeros((), jnp.float32) if amax is None else jnp.asarray(amax, jnp.float32)
    if a.shape not in ((), (1,)):
        raise ValueError(
            f"amax must be a scalar, shape () or (1,); got shape {a.shape}. It is the "
            "step's largest |gradient| over all leaves; per-leaf maxima go to leaf_amax "
            "(with amax_scaler(per_leaf=...)), their max to amax"
        )
    a = a.reshape(())
    return a if axis_name is None else jax.lax.pmax(a, axis_name)


def _ceil_log2(n: int) -> int:
    return (int(n) - 1).bit_length()


def _log2_exact(value: float) -> int:
    _, e = math.frexp(value)
    return e - 1  # value is a checked power of two: m == 0.5


def _power_of_two(value: Any, name: str) -> float:
    v = check_factor(value, name)
    m, e = math.frexp(v)
    if m != 0.5 or not -126 <= e - 1 <= 127:
        raise ValueError(
            f"{name} must be a power of two in [2**-126, 2**127] (so that unscaling is "
            f"exact), got {value!r}"
        )
    return v


_COMPUTE_DTYPES = ("float16", "bfloat16", "float32")


def amax_scaler(
    margin: int = 5,
    *,
    init_scale: float | None = None,
    min_scale: float = 2.0**-24,
    max_scale: float = 2.0**24,
    micro_batches: int = 1,
    max_backoffs: int = 4,
    compute_dtype: Any = jnp.float16,
    per_leaf: PyTree = None,
    drop_overflow_update: bool = True,
    measure: PyTree = None,
) -> AmaxScaler:
    """An `AmaxScaler`: a power-of-two scale set from the step's amax, ahead of overflow.

    The rule (``F``: the largest finite value of `compute_dtype`, 65504 for float16;
    ``M = margin + ceil(log2(micro_batches))``; ``T = F / 2**M``; ``a``: the step's amax, the
    largest absolute gradient among the finite entries, in scaled units, measured at scale
    ``s``; ``k(a)``: the largest integer with ``a * 2**k <= T``, +inf for ``a == 0``)::

      finite step:      next = s * 2**min(k(a), 1)      (first finite step: s * 2**k(a))
      no finite step yet, s > 1:  next = min(1, s * 2**(min(k(a), 0) - 1))
                        (a non-finite step: the probe scale 1, or lower; reason 1)
      non-finite step, a >= T or run < max_backoffs or run + 1 a power of two:
                        next = s * 2**(min(k(a), 0) - 1)          (reason 1: overflow)
      other non-finite: next = s        (reason 2: not the scale's doing)
      next = clip(next, min_scale, max_scale)

    so decreases take effect at once, increases are at most x2 per step, and the scale stays a
    power of two (unscaling is exact).  ``run``: the non-finite steps in a row before this one
    (a NaN the model makes walks the scale down ``max_backoffs + log2(length)`` halvings).

    Args:
      margin: log2 of the headroom kept below ``F`` (default 5, measured on the transformer
        example: docs/guide/amax-scaler.md); an int in [0, 24].
      init_scale: the first step's scale, a power of two in [min_scale, max_scale]; None
        (default): 2**16 clipped into them, GradScaler's first step bit for bit (if it overflows,
        the next runs at the probe scale 1, where no gradient finite unscaled can overflow).
      min_scale, max_scale: powers of two bounding the scale (defaults 2**-24 and 2**24; for
        bfloat16/float32 compute, whose ``F`` is ~3e38, ``max_scale`` is the scale in practice).
      micro_batches: gradients averaged into one step (accumulation window times replicas),
        an int >= 1; adds ``ceil(log2(micro_batches))`` to the margin (the amax of an average).
      max_backoffs: non-finite steps in a row that back off although the finite entries stayed
        below ``T``; after them only the 8th, 16th, 32nd, ... in a row do, so a NaN the model
        makes does not walk the scale to `min_scale`.  Int in [0, 64].
      compute_dtype: the backward pass's dtype: ``float16`` (default), ``bfloat16``, ``float32``.
      per_leaf: None (default), or a pytree shaped like the gradients (the params): the last
        step's amax is then kept per floating leaf, named by ``jax.tree_util.keystr`` path
        (`AmaxScaler.leaf_report`).
      drop_overflow_update: skip non-finite steps (default True).
      measure: None (default: every floating gradient sets the amax), or a pytree of bools
        shaped like the gradients: only the leaves marked True (the float16-path ones) set it;
        a float32-only leaf cannot overflow float16 and would hold the scale lower.
        ``found_inf`` still checks every leaf.
    """
    m, k, nb = _checked_counts(margin, micro_batches, max_backoffs)
    lo, hi, init = _checked_scales(min_scale, max_scale, init_scale)
    name, paths = _compute_dtype_name(compute_dtype), _leaf_paths(per_leaf)
    fresh = _fresh(init, m, k, lo, hi, nb, name, paths, drop_overflow_update)
    return dataclasses.replace(fresh, measured=_measured(measure))  # () measures every leaf


def _measured(measure: PyTree) -> tuple[bool, ...]:
    """`measure`'s leaves as bools, in tree_flatten order; () for None."""
    if measure is None:
        return ()
    flags = jax.tree.leaves(measure)
    if not flags or not all(isinstance(f, bool | np.bool_) for f in flags):
        raise ValueError(
            "measure must be None or a pytree of bools shaped like the gradients (True: the "
            f"leaf's gradient sets the amax); got leaves {[type(f).__name__ for f in flags][:4]}"
        )
    if not any(flags):
        raise ValueError("measure must mark at least one leaf True (None measures them all)")
    return tuple(bool(f) for f in flags)


def _checked_counts(margin: Any, micro_batches: Any, max_backoffs: Any) -> tuple[int, int, int]:
    """`amax_scaler`'s int arguments, each in its range."""
    return (
        check_int(margin, "margin", 0, 24),
        check_int(micro_batches, "micro_batches", 1, INT32_MAX),
        check_int(max_backoffs, "max_backoffs", 0, 64),
    )


def _checked_scales(min_scale: Any, max_scale: Any, init_scale: Any) -> tuple[float, float, float]:
    """``(min_scale, max_scale, init_scale)``: powers of two, init_scale between the others
    (None: torch's first scale, 2**16, clipped between them)."""
    lo = _power_of_two(min_scale, "min_scale")
    hi = _power_of_two(max_scale, "max_scale")
    if lo > hi:
        raise ValueError(f"min_scale ({lo}) must not exceed max_scale ({hi})")
    init = (
        min(max(2.0**16, lo), hi) if init_scale is None else _power_of_two(init_scale, "init_scale")
    )
    if not lo <= init <= hi:
        raise ValueError(
            f"init_scale ({init}) must lie within [min_scale, max_scale] = [{lo}, {hi}]"
        )
    return lo, hi, init


def _compute_dtype_name(compute_dtype: Any) -> str:
    try:
        name = jnp.dtype(compute_dtype).name
    except TypeError:
        name = repr(compute_dtype)
    if name not in _COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {', '.join(_COMPUTE_DTYPES)}; got {name}")
    return name


def _leaf_paths(per_leaf: PyTree) -> tuple[str, ...]:
    """The keystr paths of `per_leaf`'s floating leaves; () for None."""
    if per_leaf is None:
        return ()
    flat, _ = jax.tree_util.tree_flatten_with_path(per_leaf)
    paths = tuple(jax.tree_util.keystr(p) for p, x in flat if is_float_leaf(x))
    if not paths:
        raise ValueError("per_leaf must be a pytree with floating leaves (the params), or None")
    return paths


def _fresh(
    init: float,
    margin: int,
    micro_batches: int,
    min_scale: float,
    max_scale: float,
    max_backoffs: int,
    compute_dtype: str,
    leaf_paths: tuple[str, ...],
    drop_overflow_update: bool,
) -> AmaxScaler:
    """A scaler before its first step, at scale `init` (its arguments checked)."""
    f32 = functools.partial(jnp.zeros, (), jnp.float32)
    i32 = functools.partial(jnp.zeros, (), jnp.int32)
    return AmaxScaler(
        fixed_state(init, jnp.float32, ()),
        f32(),
        f32(),
        jnp.full((), _NO_STEP, jnp.int32),
        i32(),
        i32(),
        jnp.zeros((len(leaf_paths),), jnp.float32) if leaf_paths else None,
        margin,
        micro_batches,
        min_scale,
        max_scale,
        max_backoffs,
        compute_dtype,
        leaf_paths,
        drop_overflow_update,
    )


register_scaler(
    AmaxScaler,
    [
        "margin",
        "micro_batches",
        "min_scale",
        "max_scale",
        "max_backoffs",
        "compute_dtype",
        "leaf_paths",
        "drop_overflow_update",
        "measured",
    ],
)
