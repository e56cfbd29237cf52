"""`amax_scaler`: a power-of-two loss scale set ahead of overflow from the
step's amax, measured by the gradient pass itself (docs/guide/amax-scaler.md).
Its rule is its own; `DynamicScaler` keeps torch's."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.mechanisms.floats import is_float_leaf
from jax_amp_scale.mechanisms.handlers import Backend, check_backend
from jax_amp_scale.operators import unscale_and_check as gradient_pass
from jax_amp_scale.operators.scale_state import ScaleState, check_dtype, check_factor, check_int
from jax_amp_scale.operators.unscale_and_check import PyTree
from jax_amp_scale.training.scalers import ScalerBase, fixed_state, found_flag, register_scaler

# AmaxScaler's reason codes (its ``reason`` leaf).
_NO_STEP, _FINITE, _OVERFLOW, _UNSEEN = -1, 0, 1, 2
_NO_LIMIT = 1 << 20  # "no bound" for an exponent (all-zero gradients)
_PROBE = 1.0  # the first step's scale: no gradient finite unscaled overflows there


@register_scaler
@dataclasses.dataclass(frozen=True)
class AmaxScaler(ScalerBase):
    """A power-of-two scale set ahead of overflow from the step's amax.

    Build one with `amax_scaler` (its docstring gives the rule).
    ``unscale_and_update`` unscales, checks and measures the gradients in one
    pass; ``update(found_inf, amax=...)`` applies the rule.  Leaves: ``state``
    (a `ScaleState` with factors 1.0; its ``growth_tracker`` counts the
    finite steps since the ceiling last moved), ``ceiling``, ``amax`` (the
    last step's, scaled units), ``headroom_used`` (``amax / largest``),
    ``reason`` (-1 no step yet, 0 finite, 1 overflow the amax saw, 2 one it
    did not see), ``finite_steps``, ``leaf_amax`` (per ``per_leaf`` leaf, or
    None); the rest is static (``measured``: ``(keystr path, bool)`` per leaf).
    """

    state: ScaleState
    ceiling: jax.Array
    amax: jax.Array
    headroom_used: jax.Array
    reason: jax.Array
    finite_steps: jax.Array
    leaf_amax: jax.Array | None
    margin: int = 5
    micro_batches: int = 1
    min_scale: float = 2.0**-24
    max_scale: float = 2.0**24
    growth_interval: int = 2000
    compute_dtype: str = "float16"
    leaf_paths: tuple[str, ...] = ()
    drop_overflow_update: bool = True
    measured: tuple[tuple[str, bool], ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "leaf_paths", tuple(self.leaf_paths))  # JSON gives lists
        object.__setattr__(self, "measured", tuple((str(p), bool(m)) for p, m in self.measured))

    @property
    def largest(self) -> float:
        """The largest finite value of ``compute_dtype`` (65504 for float16)."""
        return float(jnp.finfo(jnp.dtype(self.compute_dtype)).max)

    @property
    def target(self) -> float:
        """The line the amax is kept under, ``largest / 2**(margin + ceil(log2(micro_batches)))``."""
        return self.largest / 2.0 ** (self.margin + (self.micro_batches - 1).bit_length())

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
          update_backend: None (default) or a backend: checked and unused (the
            rule is pure JAX), for generic scaler code.
        """
        if update_backend is not None:
            check_backend(update_backend)
        # The amax comes from the pass itself (one read of each gradient on the CPU).
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
        """The floating leaves whose amax sets the scale: all, or those `measured` marks.
        Checks `per_leaf` and `measure` against the gradients' structure (by path)."""
        flat = jax.tree_util.tree_flatten_with_path(grads)[0]
        floating = [jax.tree_util.keystr(p) for p, g in flat if is_float_leaf(g)]
        if self.leaf_paths and tuple(floating) != self.leaf_paths:
            raise ValueError(_mismatch("per_leaf", self.leaf_paths, floating))
        if not self.measured:
            return slice(None)
        paths = [jax.tree_util.keystr(p) for p, _ in flat]
        if tuple(paths) != tuple(p for p, _ in self.measured):
            raise ValueError(_mismatch("measure", [p for p, _ in self.measured], paths))
        marks = dict(self.measured)
        chosen = [marks[jax.tree_util.keystr(p)] for p, g in flat if is_float_leaf(g)]
        if not any(chosen):  # an empty max would read 0 and grow the scale to max_scale
            raise ValueError("amax_scaler(measure=...) marks no floating leaf of the gradients")
        return np.flatnonzero(np.asarray(chosen, bool))

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
          found_inf: as `DynamicScaler.update`'s.
          amax: the step's amax in scaled units (finite entries only), a
            float scalar; None (default): nothing measured, so a finite step
            keeps the scale.
          leaf_amax: one amax per floating leaf that ``per_leaf`` named, in
            ``tree_flatten`` order; None (default) keeps the last ones.
          axis_name: optional mapped axis name(s): ``found_inf`` OR-reduced,
            the amaxes max-reduced across it.
          backend: checked and unused (the rule is pure JAX), for generic scaler code.
        """
        check_backend(backend)  # checked, then unused: the rule is pure JAX
        found = found_flag(found_inf, self.state, axis_name).reshape(())
        a = _scalar_amax(amax, axis_name)
        per = self._next_leaf_amax(leaf_amax, axis_name)
        e_next, e_ceiling, tracker = self._next_exponents(found, a, measured=amax is not None)
        seen = a >= jnp.float32(self.target)
        reason = jnp.where(found, jnp.where(seen, _OVERFLOW, _UNSEEN), _FINITE)
        shape, dtype = self.state.scale.shape, self.scale.dtype
        return dataclasses.replace(
            self,
            state=dataclasses.replace(
                self.state,
                scale=_power(e_next).reshape(shape).astype(dtype),
                growth_tracker=tracker.reshape(shape).astype(jnp.int32),
            ),
            ceiling=_power(e_ceiling),
            amax=a,
            headroom_used=self._headroom(a),
            reason=reason.astype(jnp.int32),
            finite_steps=(self.finite_steps + (~found).astype(jnp.int32)).astype(jnp.int32),
            leaf_amax=per,
        )

    def _headroom(self, a: jax.Array) -> jax.Array:
        """``a / largest``, without the subnormal reciprocal XLA would make of
        ``1 / 3.4e38`` (flushed to 0 under jit) for bfloat16 and float32."""
        m, e = math.frexp(self.largest)
        half = e // 2
        return (a / jnp.float32(m)) * jnp.float32(2.0**-half) * jnp.float32(2.0 ** (half - e))

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

    def _next_exponents(
        self, found: jax.Array, a: jax.Array, *, measured: bool
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The rule: log2 of the next scale and of the next ceiling, and the
        finite steps counted toward the ceiling's growth."""
        e_lo, e_hi = int(math.log2(self.min_scale)), int(math.log2(self.max_scale))  # exact
        e_s = _log2(self.state.scale.reshape(()))
        e_c = _log2(self.ceiling.reshape(()))
        k = self._room(a)  # largest k with a * 2**k <= target
        # A finite step: growth at most x2 once a step has been measured, never
        # past the ceiling, which doubles at torch's pace: where the amax cannot
        # see the tensor that overflows, the scale climbs back no faster.
        grow = jnp.where(self.finite_steps > 0, jnp.minimum(k, 1), k)
        k_fin = grow if measured else jnp.zeros((), jnp.int32)
        tracker = self.state.growth_tracker.reshape(()).astype(jnp.int32) + 1
        raise_ceiling = tracker >= self.growth_interval
        e_c_fin = jnp.where(raise_ceiling, e_c + 1, e_c)
        # A non-finite step: at least x1/2 (more if the finite entries ask),
        # and the scale that overflowed, halved, is the new ceiling.
        e_c_bad = jnp.minimum(e_c, e_s - 1)
        e_ceiling = jnp.clip(jnp.where(found, e_c_bad, e_c_fin), e_lo, e_hi)
        e_up = jnp.minimum(e_s + k_fin, e_ceiling)
        e_down = e_s + jnp.minimum(k, 0) - 1
        e_next = jnp.clip(jnp.where(found, e_down, e_up), e_lo, e_hi)
        tracker = jnp.where(found | raise_ceiling, 0, tracker)
        return e_next, e_ceiling, tracker

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
    """`update`'s ``amax``, a float32 scalar (0 for None), max-reduced over `axis_name`;
    another shape is refused at trace time, naming the argument."""
    a = jnp.zeros((), jnp.float32) if amax is None else jnp.asarray(amax, jnp.float32)
    if a.shape not in ((), (1,)):
        raise ValueError(
            f"amax must be a scalar, shape () or (1,); got shape {a.shape}. It is the "
            "step's largest |gradient| over all leaves; per-leaf maxima go to leaf_amax "
            "(with amax_scaler(per_leaf=...)), their max to amax"
        )
    a = a.reshape(())
    return a if axis_name is None else jax.lax.pmax(a, axis_name)


def _log2(scale: jax.Array) -> jax.Array:
    """int32 log2 of a power-of-two float32 scale."""
    return jnp.frexp(scale.astype(jnp.float32))[1] - 1


def _power(e: jax.Array) -> jax.Array:
    """float32 ``2**e``, exact for e in the float32 normal range."""
    return jnp.ldexp(jnp.float32(1.0), e.astype(jnp.int32))


def _power_of_two(value: Any, name: str) -> float:
    v = check_factor(value, name)
    m, e = math.frexp(v)
    if m != 0.5 or not -126 <= e - 1 <= 127:
        raise ValueError(
            f"{name} must be a power of two in [2**-126, 2**127] (so that unscaling is "
            f"exact), got {value!r}"
        )
    return v


_COMPUTE_DTYPES = {jnp.dtype(d) for d in (jnp.float16, jnp.bfloat16, jnp.float32)}


def amax_scaler(
    margin: int = 5,
    *,
    init_scale: float | None = None,
    min_scale: float = 2.0**-24,
    max_scale: float = 2.0**24,
    micro_batches: int = 1,
    growth_interval: int = 2000,
    compute_dtype: Any = jnp.float16,
    per_leaf: PyTree = None,
    drop_overflow_update: bool = True,
    measure: PyTree = None,
) -> AmaxScaler:
    """An `AmaxScaler`: a power-of-two scale set from the step's amax, ahead of overflow.

    The rule (``F``: the largest finite value of `compute_dtype`, 65504 for float16;
    ``M = margin + ceil(log2(micro_batches))``; ``T = F / 2**M``; ``a``: the step's amax, the
    largest absolute gradient among the finite entries, in scaled units, measured at scale
    ``s``; ``k(a)``: the largest integer with ``a * 2**k <= T``, +inf for ``a == 0``;
    ``c``: the ceiling)::

      first step:  s = 1 (no gradient finite unscaled overflows there),  c = init_scale
      finite:      next = min(s * 2**min(k(a), 1), c)  (first finite: s * 2**k(a));
                   c doubles after growth_interval finite steps in a row
      non-finite:  next = s * 2**(min(k(a), 0) - 1),  c = min(c, s / 2)
      both clipped to [min_scale, max_scale]

    The scale stays a power of two (unscaling is exact); why the ceiling: docs/guide/amax-scaler.md.

    Args:
      margin: log2 of the headroom kept below ``F`` (default 5); an int in [0, 24].
      init_scale: the ceiling's first value, a power of two in [min_scale, max_scale]; None
        (default): 2**16 (torch's first scale) clipped into them.  The first step runs at
        ``min(1, init_scale)`` (at least `min_scale`).
      min_scale, max_scale: powers of two bounding the scale (defaults 2**-24 and 2**24; for
        bfloat16/float32 compute, whose ``F`` is ~3e38, the ceiling is the scale in practice).
      micro_batches: gradients averaged into one step (accumulation window times replicas),
        an int >= 1; adds ``ceil(log2(micro_batches))`` to the margin (the amax of an average).
      growth_interval: finite steps in a row after which the ceiling doubles (torch's
        ``growth_interval``, default 2000); an int in [1, 2**31 - 1].
      compute_dtype: the backward pass's dtype: ``float16`` (default), ``bfloat16``, ``float32``.
      per_leaf: None (default), or a pytree shaped like the gradients (the params): the last
        step's amax is then kept per floating leaf, named by ``jax.tree_util.keystr`` path
        (`AmaxScaler.leaf_report`).
      drop_overflow_update: skip non-finite steps (default True).
      measure: None (default: every floating gradient sets the amax), or a pytree of bools
        with the gradients' structure (checked at trace time): only the leaves marked True
        (the float16-path ones) set it.  ``found_inf`` still checks every leaf.
    """
    m, k = check_int(margin, "margin", 0, 24), check_int(micro_batches, "micro_batches")
    interval = check_int(growth_interval, "growth_interval")
    lo, hi, init = _checked_scales(min_scale, max_scale, init_scale)
    words = "one of float16, bfloat16, float32"
    name = check_dtype(compute_dtype, "compute_dtype", _COMPUTE_DTYPES, words, ValueError).name
    paths, measured = _leaf_paths(per_leaf), _measured(measure)
    static: tuple[Any, ...] = (m, k, lo, hi, interval, name, paths, drop_overflow_update, measured)
    return AmaxScaler(*_first_leaves(init, lo, len(paths)), *static)


def _measured(measure: PyTree) -> tuple[tuple[str, bool], ...]:
    """`measure`'s leaves as ``(keystr path, bool)``, in tree_flatten order; () for None."""
    if measure is None:
        return ()
    flat = jax.tree_util.tree_flatten_with_path(measure, is_leaf=lambda x: x is None)[0]
    flags = [f for _, f in flat]
    if not flags or not all(isinstance(f, bool | np.bool_) for f in flags):
        raise ValueError(
            "measure must be None or a pytree of bools shaped like the gradients (True: the "
            f"leaf's gradient sets the amax); got leaves {[type(f).__name__ for f in flags][:4]}"
        )
    if not any(flags):
        raise ValueError("measure must mark at least one leaf True (None measures them all)")
    return tuple((jax.tree_util.keystr(p), bool(f)) for p, f in flat)


def _mismatch(name: str, expected: Any, got: Any) -> str:
    missing, extra = [p for p in expected if p not in got], [p for p in got if p not in expected]
    return (
        f"amax_scaler({name}=...) was built for a tree with leaves at {list(expected)[:4]}, but "
        f"the gradients have {list(got)[:4]} (not in the gradients: {missing[:3]}; not in {name}: "
        f"{extra[:3]}): pass {name} a pytree with the gradients' structure (the params')"
    )


def _checked_scales(min_scale: Any, max_scale: Any, init_scale: Any) -> tuple[float, float, float]:
    """``(min_scale, max_scale, init_scale)``: powers of two, init_scale between the others
    (None: torch's first scale, 2**16, clipped between them)."""
    lo, hi = _power_of_two(min_scale, "min_scale"), _power_of_two(max_scale, "max_scale")
    if lo > hi:
        raise ValueError(f"min_scale ({lo}) must not exceed max_scale ({hi})")
    init = 2.0**16 if init_scale is None else _power_of_two(init_scale, "init_scale")
    init = min(max(init, lo), hi) if init_scale is None else init
    if not lo <= init <= hi:
        raise ValueError(
            f"init_scale ({init}) must lie within [min_scale, max_scale] = [{lo}, {hi}]"
        )
    return lo, hi, init


def _leaf_paths(per_leaf: PyTree) -> tuple[str, ...]:
    """The keystr paths of `per_leaf`'s floating leaves; () for None."""
    if per_leaf is None:
        return ()
    flat, _ = jax.tree_util.tree_flatten_with_path(per_leaf)
    paths = tuple(jax.tree_util.keystr(p) for p, x in flat if is_float_leaf(x))
    if not paths:
        raise ValueError("per_leaf must be a pytree with floating leaves (the params), or None")
    return paths


def _first_leaves(ceiling: float, min_scale: float, n_leaves: int) -> tuple[Any, ...]:
    """The leaves before the first step: the probe scale under `ceiling`, nothing measured."""
    probe = min(max(_PROBE, min_scale), ceiling)
    return (
        fixed_state(probe, jnp.float32, ()),
        jnp.full((), ceiling, jnp.float32),
        jnp.zeros((), jnp.float32),
        jnp.zeros((), jnp.float32),
        jnp.full((), _NO_STEP, jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.zeros((n_leaves,), jnp.float32) if n_leaves else None,
    )
