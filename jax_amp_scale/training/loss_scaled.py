"""`loss_scaled`: an optax wrapper that unscales, checks and skips overflow
steps; and `optimizer_step`, torch's ``scaler.step(opt)`` for hand-written loops.
One ``update``, step by step: ARCHITECTURE.md."""

from __future__ import annotations

import dataclasses
import enum
import functools
import sys
from collections.abc import Hashable
from types import FrameType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jax_amp_scale.mechanisms.floats import float32_bits, is_float_leaf
from jax_amp_scale.mechanisms.handlers import Backend, check_backend
from jax_amp_scale.operators.host_report import host_report
from jax_amp_scale.operators.scale_state import ScaleState, check_bool, check_int, found_to_bool
from jax_amp_scale.operators.unscale_and_check import all_finite
from jax_amp_scale.training import replicas, reports, scalers, serialization
from jax_amp_scale.training.scaling import instances


class SkipReason(enum.IntEnum):
    """Why a step was or was not applied (`Trainer`'s ``metrics["reason"]``).

    ``APPLIED`` (0): the inner update was applied.  ``OVERFLOW`` (1): the
    unscaled gradients held an inf or NaN; the scale backs off.
    ``NONFINITE_UPDATE`` (2): the gradients were finite but the inner update
    (or the new parameters) were not (``skip_nonfinite_updates``).
    ``ACCUMULATING`` (3): a micro-batch inside an accumulation window.
    """

    APPLIED = 0
    OVERFLOW = 1
    NONFINITE_UPDATE = 2
    ACCUMULATING = 3


@serialization.register_namedtuple
class LossScaledState(NamedTuple):
    """State of `loss_scaled`; its structure never depends on the options.

    Attributes:
      scaler: the `DynamicScaler`, `StaticScaler`, `NoOpScaler` or `AmaxScaler`; it holds
        the one `ScaleState` of this state.
      inner_state: the wrapped transformation's state; never changed on a
        skipped step.
      consecutive_overflows: int32, optimizer steps in a row whose gradients
        overflowed (0 after one that did not).
      skipped_steps: int32, optimizer steps dropped so far (overflow or
        non-finite update).
      total_steps: int32, optimizer steps so far (calls of ``update``; under
        `accumulate_gradients` one per window, like `skipped_steps`).
    """

    scaler: Any
    inner_state: Any
    consecutive_overflows: jax.Array
    skipped_steps: jax.Array
    total_steps: jax.Array

    @property
    def found_inf(self) -> jax.Array:
        """Whether the last optimizer step's gradients overflowed."""
        return self.consecutive_overflows > 0

    @property
    def scale(self) -> jax.Array:
        """The current scale (what `jax_amp_scale.scale_loss` multiplies by)."""
        return self.scaler.scale

    @property
    def scale_state(self) -> ScaleState:
        return self.scaler.scale_state

    @property
    def is_identity(self) -> bool:
        return self.scaler.is_identity


class LossScaled(optax.GradientTransformationExtraArgs):
    """What `loss_scaled` returns: an optax transformation (`Trainer` knows it)."""

    __slots__ = ()


def get_loss_scaled_state(opt_state: Any) -> LossScaledState:
    """The one `LossScaledState` inside `opt_state`.

    Args:
      opt_state: an optax state holding exactly one `LossScaledState` (the
        state itself, a chain's tuple, `accumulate_gradients`' state); a
        ``ValueError`` when it holds none or more than one.
    """
    found = instances(opt_state, LossScaledState)
    if len(found) != 1:
        raise ValueError(f"expected exactly one LossScaledState in opt_state, found {len(found)}")
    return found[0]


def typed_as(value: Any, like: Any) -> jax.Array:
    """`value` (an array or a Python number) in `like`'s dtype and shape."""
    out = jnp.asarray(value)
    if out.dtype != like.dtype:
        out = out.astype(like.dtype)
    if out.shape != like.shape:
        out = jnp.broadcast_to(out, like.shape)
    return out


def select(flag: Any, on_true: Any, on_false: Any) -> jax.Array:
    """``where(flag, on_true, on_false)`` for a scalar bool, typed as `on_false`,
    as one ``lax.select`` (``jnp.where`` stages a nested jit for every leaf)."""
    on_false = jnp.asarray(on_false)  # optax allows Python scalars in a state
    return jax.lax.select(jnp.asarray(flag), typed_as(on_true, on_false), on_false)


def strongly_typed(tree: Any) -> Any:
    """`tree` with weak-typed leaves made strong (two cond branches must agree)."""

    def one(x: Any) -> Any:
        if not jax.typeof(x).weak_type:
            return x
        return jax.lax.convert_element_type(x, jnp.result_type(x))

    return jax.tree_util.tree_map(one, tree)


def keep_where(flag: Any, old: Any, new: Any) -> Any:
    """`old` where the scalar bool `flag` holds, else `new`, leaf by leaf (typed as `new`)."""
    return jax.tree_util.tree_map(lambda o, n: select(flag, o, n), old, new)


def zeros_where(flag: Any, tree: Any) -> Any:
    """`tree` with every leaf zeroed where the scalar bool `flag` holds."""
    zeros: dict[Any, jax.Array] = {}  # one zeros array per type, shared

    def one(u: Any) -> jax.Array:
        key = jax.typeof(u)
        if key not in zeros:
            zeros[key] = jnp.zeros_like(u)
        return select(flag, zeros[key], u)

    return jax.tree_util.tree_map(one, tree)


def unaliased(tree: Any, *taken: Any) -> Any:
    """`tree` with every array that is a leaf of `taken`, or that appears in
    `tree` before, replaced by a copy: a state that can be donated whole."""
    seen = {id(x) for x in jax.tree_util.tree_leaves(taken)}

    def one(x: Any) -> Any:
        if not isinstance(x, jax.Array):
            return x
        if id(x) in seen:
            return jnp.copy(x)
        seen.add(id(x))
        return x

    return jax.tree_util.tree_map(one, tree)


def check_same_scaler(expected: Any, got: Any) -> None:
    """Trace-time check that a state's scaler is configured as the transformation's."""
    want, have = jax.tree_util.tree_structure(expected), jax.tree_util.tree_structure(got)
    if want != have:  # type: ignore[operator]
        raise ValueError(
            "loss_scaled: the state's scaler is configured differently from the "
            f"transformation's: state {describe(got)}, transformation {describe(expected)}; "
            "build the state with this transformation's init (restore a checkpoint into "
            "tx.init(params)), or build the transformation with the state's scaler"
        )


def describe(scaler: Any) -> str:
    """The static configuration of a scaler (its fields with a default: see
    `scalers.register_scaler`), as the constructor would take it."""
    if not dataclasses.is_dataclass(scaler):
        return type(scaler).__name__
    static = (f.name for f in dataclasses.fields(scaler) if f.default is not dataclasses.MISSING)
    fields = [f"{name}={getattr(scaler, name)!r}" for name in static]
    st = getattr(scaler, "state", None)
    if isinstance(st, ScaleState):
        names = ("growth_factor", "backoff_factor", "growth_interval", "rule")
        fields += [f"{name}={getattr(st, name)!r}" for name in names]
    return f"{type(scaler).__name__}({', '.join(fields)})"


# Two optax wrappers around loss_scaled break it with no sign in their state or
# calls: only the caller of init tells them apart
# (tests/training/loss_scaled/test_accumulate_and_guards.py checks both).
WRAPPER_ERRORS = {
    "optax.MultiSteps": "loss_scaled(...) inside optax.MultiSteps: MultiSteps keeps its "
    "accumulator as (1 - emit) * acc, so one overflowing micro-batch leaves a NaN in it for "
    "good and every later step is skipped. Accumulate outside the scaling instead: "
    "accumulate_gradients(loss_scaled(inner, ...), k) (torch's semantics), or put "
    "MultiSteps inside: loss_scaled(optax.MultiSteps(inner, k))",
    "optax.apply_if_finite": "loss_scaled(...) inside optax.apply_if_finite: it drops an "
    "overflowing step before loss_scaled sees it, so the scale never backs off and the "
    "overflow repeats. loss_scaled already skips non-finite steps: drop apply_if_finite "
    "(max_consecutive_overflows= is its max_consecutive_errors), or put it inside: "
    "loss_scaled(optax.apply_if_finite(inner, n))",
}


def refusing_wrapper() -> str | None:
    """The key of `WRAPPER_ERRORS` whose wrapper called (a few frames up) the
    ``init`` that calls this; None otherwise."""
    frame: FrameType | None = sys._getframe(2)  # the caller of the init that asks
    for _ in range(4):  # that init <- a chain's init <- the wrapper's init
        if frame is None:
            return None
        if frame.f_code.co_name == "init":
            if isinstance(frame.f_locals.get("self"), optax.MultiSteps):
                return "optax.MultiSteps"
            if frame.f_code.co_filename == optax.apply_if_finite.__code__.co_filename:
                return "optax.apply_if_finite"
        frame = frame.f_back
    return None


def loss_scaled(
    inner: optax.GradientTransformation,
    scaler: Any = None,
    *,
    axis_name: Hashable | None = None,
    skip_nonfinite_updates: bool | None = None,
    max_consecutive_overflows: int | None = None,
    host_reports: bool = True,
    backend: Backend = "auto",
) -> LossScaled:
    """Wraps `inner` so that it receives unscaled, checked gradients.

    For a new float16 run, pass `amax_scaler()`; keep the default
    `dynamic_scaler()` where the run must take torch's `GradScaler`
    decisions step for step.

    Args:
      inner: any optax transformation or chain (extra args are forwarded).
        ``optax.MultiSteps`` inside updates the scale every micro-batch
        (`accumulate_gradients` outside is torch's semantics); around the
        result, ``optax.MultiSteps`` (its accumulator would keep an
        overflow's NaN) and ``optax.apply_if_finite`` (it would hide
        overflows from the scale) raise ``TypeError`` at ``init``.
      scaler: `dynamic_scaler()` (default: torch ``GradScaler``'s),
        `static_scaler(x)`, `no_op_scaler()`, `amax_scaler()` or a `ScaleState`.  It decides
        every step (its ``drop_overflow_update``: skip an overflow step); a
        state whose scaler is configured otherwise is a ``ValueError`` when
        the step is traced.
      axis_name: data parallelism over a mapped axis, as torch DDP: the
        gradients are averaged over it and the overflow flag OR-reduced.
      skip_nonfinite_updates: also skip a step whose gradients are finite
        but whose update (or ``params + updates``) is not, without backing
        off the scale.  None (default): on when a parameter (without
        `params`: an update) is 16-bit and overflow steps are dropped.
      max_consecutive_overflows: None (torch: no limit) or n: the n-th
        overflowing step in a row fails the step, by a host report.
      host_reports: the host's warnings (docs/guide/training.md) and the
        `max_consecutive_overflows` error, which reaches your code as a
        ``jax.errors.JaxRuntimeError`` when the step's result is read.  False
        for ``jax.export``.
      backend: the `update_scale` backend (``"auto"``, ``"reference"``,
        ``"ffi"``); the gradient pass is ``"reference"`` with
        ``"reference"``, else ``"auto"``.

    ``update`` takes the gradients of the *scaled* loss (see `LossScaled`);
    ``init`` returns a `LossScaledState` of fresh arrays: donate it whole.
    """
    step = _Step.build(
        inner,
        scaler,
        axis_name=axis_name,
        skip_nonfinite_updates=skip_nonfinite_updates,
        max_consecutive_overflows=max_consecutive_overflows,
        host_reports=host_reports,
        backend=backend,
    )
    return LossScaled(step.init, step.update)


@dataclasses.dataclass(frozen=True)
class _Step:
    """One `loss_scaled` update, configured once (see `loss_scaled`)."""

    inner: optax.GradientTransformationExtraArgs
    scaler: Any  # decides the configuration; the state's scaler must match it
    axis_name: Hashable | None
    skip_nonfinite: bool | None  # skip_nonfinite_updates; None: decided per step
    backend: Backend
    on_overflow: reports.OverflowReport | None  # None: host_reports=False
    on_nonfinite: reports.NonfiniteUpdateReport | None

    @classmethod
    def build(
        cls,
        inner: Any,
        scaler: Any,
        *,
        axis_name: Hashable | None,
        skip_nonfinite_updates: bool | None,
        max_consecutive_overflows: int | None,
        host_reports: bool,
        backend: Backend,
    ) -> _Step:
        """The options checked once (`loss_scaled`'s arguments)."""
        if isinstance(inner, optax.MultiSteps):
            inner = inner.gradient_transformation()
        if not isinstance(inner, optax.GradientTransformation):
            raise TypeError(
                "inner must be an optax GradientTransformation (or optax.MultiSteps), "
                f"got {type(inner).__name__}"
            )
        scaler = scalers.as_scaler(scaler)
        limit, skip_nonfinite = max_consecutive_overflows, skip_nonfinite_updates
        if limit is not None:
            limit = check_int(limit, "max_consecutive_overflows", 1, None, "an int >= 1 or None")
        if skip_nonfinite is not None:
            skip_nonfinite = check_bool(skip_nonfinite, "skip_nonfinite_updates")
        reporting = check_bool(host_reports, "host_reports")
        if limit is not None and not reporting:
            raise ValueError(
                "max_consecutive_overflows needs host_reports=True (it raises from a "
                "host report); without reports, read state.consecutive_overflows instead"
            )
        dynamic = isinstance(scaler, scalers.DynamicScaler)
        floor = scaler.min_scale if dynamic else None
        overflow = reports.OverflowReport(limit=limit, floor=floor, dynamic=dynamic)
        return cls(
            inner=optax.with_extra_args_support(inner),
            scaler=scaler,
            axis_name=axis_name,
            skip_nonfinite=skip_nonfinite,
            backend=check_backend(backend),  # type: ignore[arg-type]
            on_overflow=overflow if reporting else None,
            on_nonfinite=reports.NonfiniteUpdateReport() if reporting else None,
        )

    def init(self, params: Any) -> LossScaledState:
        wrapper = refusing_wrapper()
        if wrapper is not None:
            raise TypeError(WRAPPER_ERRORS[wrapper])
        zero = functools.partial(jnp.zeros, (), jnp.int32)
        # The transformation keeps its scaler: the state gets copies.
        scaler, inner_state = unaliased((self.scaler, self.inner.init(params)), params, self.scaler)
        return LossScaledState(scaler, inner_state, zero(), zero(), zero())

    @property
    def pass_backend(self) -> Backend:
        """The gradient pass's backend: "ffi" names the update-scale operator's."""
        return "reference" if self.backend == "reference" else "auto"

    def update(
        self, updates: Any, state: LossScaledState, params: Any = None, **extra_args: Any
    ) -> tuple[Any, LossScaledState]:
        if not isinstance(state, LossScaledState):
            raise TypeError(f"state must be a LossScaledState, got {type(state).__name__}")
        check_same_scaler(self.scaler, state.scaler)
        axis = self.axis_name
        grads = updates if axis is None else replicas.mean_gradients(updates, axis)
        grads, found, new_scaler = state.scaler.unscale_and_update(
            grads, axis_name=axis, backend=self.pass_backend, update_backend=self.backend
        )
        overflows = jnp.where(found, state.consecutive_overflows + 1, 0).astype(jnp.int32)
        new_updates, new_inner = strongly_typed(
            self.inner.update(grads, state.inner_state, params, **extra_args)
        )
        bad = self.nonfinite_update(updates, new_updates, params)
        # The scales go to the host report by their bits (XLA:CPU would flush a
        # subnormal scale to 0 on the way); the previous one tells the step
        # where the scale became 0 from the ones after it.
        scale_bits = float32_bits(new_scaler.scale), float32_bits(state.scaler.scale)
        skipped = self.skip(found, bad, scale_bits, overflows, state.total_steps)
        return zeros_where(skipped, new_updates), LossScaledState(
            scaler=new_scaler,
            inner_state=keep_where(skipped, state.inner_state, new_inner),
            consecutive_overflows=overflows,
            skipped_steps=state.skipped_steps + skipped.astype(jnp.int32),
            total_steps=state.total_steps + 1,
        )

    def nonfinite_update(self, updates: Any, new_updates: Any, params: Any) -> jax.Array | None:
        """Whether a finite step's update (or new parameters) is not finite;
        None where such steps are not skipped (`skip_nonfinite_updates`)."""
        skip = self.skip_nonfinite
        if skip is None:
            leaves = jax.tree_util.tree_leaves(updates if params is None else params)
            low = any(is_float_leaf(x) and jnp.dtype(x.dtype).itemsize < 4 for x in leaves)
            skip = self.scaler.drop_overflow_update and low
        if not skip:
            return None
        new = new_updates if params is None else optax.apply_updates(params, new_updates)
        return jnp.logical_not(all_finite(new))

    def skip(
        self,
        found: Any,
        bad: jax.Array | None,
        scale_bits: tuple[Any, Any],
        overflows: Any,
        total: Any,
    ) -> jax.Array:
        """Whether the step is skipped: one scalar ``lax.cond`` on the overflow
        flag, whose branches run the host reports (never on a plain step); a
        report returns the flag it was given: using it keeps the report.
        `scale_bits`: the new and the previous scale's float32 bits."""
        drop = self.scaler.drop_overflow_update

        def overflow() -> jax.Array:
            skip = jnp.bool_(drop) if bad is None else bad | drop
            if self.on_overflow is not None:
                # The max_consecutive_overflows error takes the callback route:
                # JAX raises its error as JaxRuntimeError on every dispatch path
                # (a native call's by path), at the cost of the Python path here.
                route = "reference" if self.on_overflow.limit is not None else self.pass_backend
                new, previous = scale_bits
                seen = host_report(self.on_overflow, found, new, overflows, previous, backend=route)
                skip = skip & seen  # seen is found: True in this branch
            return skip

        def finite() -> jax.Array:
            if bad is None:
                return jnp.bool_(False)
            if self.on_nonfinite is None:
                return bad
            return host_report(self.on_nonfinite, bad, total, backend=self.pass_backend)

        return jax.lax.cond(found, overflow, finite)


def optimizer_step(
    tx: optax.GradientTransformation,
    grads: Any,
    opt_state: Any,
    params: Any,
    found_inf: Any,
    **extra_args: Any,
) -> tuple[Any, Any]:
    """torch's ``scaler.step(optimizer)`` for any optax optimizer.

    Applies ``tx`` to the (unscaled) `grads` and returns ``(new_params,
    new_opt_state)``; when `found_inf` is True returns `params` and
    `opt_state` unchanged, bit for bit (the optimizer's step count too), with
    one ``lax.cond``.  `found_inf` is read as `update_scale` reads it (a bool,
    int or float scalar, by its bits: nonzero, subnormal and NaN count).
    Several optimizers sharing one scaler (torch's multiple
    optimizer scenario): call this once per optimizer with the found_inf of
    its own gradients, and ``scaler.update`` once with the OR of them.
    """
    if not isinstance(tx, optax.GradientTransformation):
        raise TypeError(f"tx must be an optax GradientTransformation, got {type(tx).__name__}")
    tx = optax.with_extra_args_support(tx)
    # Read by its bits, as update_scale reads it: a subnormal flag is an
    # overflow (astype(bool) would read it as 0 under XLA's denormals-are-zero).
    found = found_to_bool(found_inf, ())

    def apply(operands: tuple[Any, Any, Any]) -> tuple[Any, Any]:
        g, st, p = operands
        u, new_st = tx.update(g, st, p, **extra_args)
        return strongly_typed((optax.apply_updates(p, u), new_st))

    def skip(operands: tuple[Any, Any, Any]) -> tuple[Any, Any]:
        _, st, p = operands  # apply's results are dead code, for matching types
        return keep_where(True, (p, st), apply(operands))

    return jax.lax.cond(found, skip, apply, (grads, opt_state, params))
