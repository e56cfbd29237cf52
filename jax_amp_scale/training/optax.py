"""`loss_scaled`: an optax wrapper that unscales, checks and skips overflow steps.

Usage::

    tx = jax_amp_scale.optax.loss_scaled(optax.adam(1e-3))
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        grads = jax.grad(lambda p: jas.scale_loss(loss_fn(p, batch), opt_state))(params)
        updates, opt_state = tx.update(grads, opt_state, params)   # scaled grads in
        return optax.apply_updates(params, updates), opt_state

One ``update``: average the gradients over ``axis_name`` (torch DDP), unscale
and check them with the scaler, OR the flag over ``axis_name``, advance the
scaler, run the inner update, and keep it or drop it (zero updates, the inner
state untouched) with one select per leaf.  What goes beyond that lives in
`jax_amp_scale.training.pieces` (accumulation, clipping).

Also here, for loops ported from torch's ``GradScaler``: `optimizer_step`
(``scaler.step(opt)`` for any optax optimizer, skipping on found_inf).
"""

from __future__ import annotations

import enum
import functools
import numbers
import sys
import warnings
from collections.abc import Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax_amp_scale.ops import host_report
from jax_amp_scale.ops.update_scale import or_across
from jax_amp_scale.state.scale_state import ScaleState
from jax_amp_scale.state.tree import instances, is_float_leaf
from jax_amp_scale.state.tree import select as _pick
from jax_amp_scale.state.validation import Backend, check_backend, check_bool
from jax_amp_scale.training import _export, helpers, replicas, scalers

# Skips in a row after which the non-finite-update guard warns (once).
NONFINITE_RUN_WARNING = 10


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


class LossScaledState(NamedTuple):
    """State of `loss_scaled`; its structure never depends on the options.

    Attributes:
      scaler: the `DynamicScaler`, `StaticScaler` or `NoOpScaler`; it holds
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


_export.register_namedtuple(LossScaledState)


class LossScaled(optax.GradientTransformationExtraArgs):
    """What `loss_scaled` returns: an optax transformation (`Trainer` knows it)."""

    __slots__ = ()


def get_loss_scaled_state(opt_state: Any) -> LossScaledState:
    """The one `LossScaledState` inside `opt_state` (for example a chain's tuple)."""
    found = instances(opt_state, LossScaledState)
    if len(found) != 1:
        raise ValueError(f"expected exactly one LossScaledState in opt_state, found {len(found)}")
    return found[0]


def strongly_typed(tree: Any) -> Any:
    """`tree` with weak-typed leaves made strong (two cond branches must agree)."""

    def one(x: Any) -> Any:
        if not jax.typeof(x).weak_type:
            return x
        return jax.lax.convert_element_type(x, jnp.result_type(x))

    return jax.tree_util.tree_map(one, tree)


def keep_where(flag: Any, old: Any, new: Any) -> Any:
    """`old` where the scalar bool `flag` holds, else `new`, leaf by leaf (typed as `new`)."""
    return jax.tree_util.tree_map(lambda o, n: _pick(flag, o, n), old, new)


def zeros_where(flag: Any, tree: Any) -> Any:
    """`tree` with every leaf zeroed where the scalar bool `flag` holds."""
    zeros: dict[Any, jax.Array] = {}  # one zeros array per type, shared

    def one(u: Any) -> jax.Array:
        key = jax.typeof(u)
        if key not in zeros:
            zeros[key] = jnp.zeros_like(u)
        return _pick(flag, zeros[key], u)

    return jax.tree_util.tree_map(one, tree)


def positive_int(value: Any, name: str, *, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ValueError(
            f"{name} must be an int >= 1{' or None' if allow_none else ''}, got {value!r}"
        )
    return int(value)


def _low_precision(tree: Any) -> bool:
    return any(
        is_float_leaf(x) and jnp.dtype(x.dtype).itemsize < 4
        for x in jax.tree_util.tree_leaves(tree)
    )


# ------------------------------------------------------------ host reports


def _overflow_report(
    found: Any, scale: Any, count: Any, *, limit: int | None, floor: float | None
) -> None:
    """Host side of the overflow reports; runs on overflowing steps only."""
    found = np.asarray(found)
    if not found.any():  # under vmap the callback may run for every step
        return
    scale = np.asarray(scale, np.float64)
    count = np.asarray(count)
    if limit is not None and (count >= limit).any():
        message = (
            f"loss_scaled: {int(count.max())} overflowing steps in a row reached "
            f"max_consecutive_overflows={limit} (scale now {float(scale.min()):g}); "
            "the gradients are non-finite whatever the scale: look for a NaN in the loss, "
            "the data or the parameters (jas.nonfinite_paths(jas.nonfinite_leaves(grads))), "
            "or raise max_consecutive_overflows"
        )
        # JAX wraps an exception raised in a callback into a long
        # JaxRuntimeError ending with this message; say it first.
        sys.stderr.write(f"\nFloatingPointError: {message}\n")
        sys.stderr.flush()
        raise FloatingPointError(message)
    if (scale == 0).any():
        warnings.warn(
            "loss_scaled: the scale reached 0 after repeated overflows and cannot "
            "recover (zero gradients unscale to NaN); set min_scale= in dynamic_scaler() "
            "or max_consecutive_overflows= in loss_scaled to stop earlier",
            RuntimeWarning,
            stacklevel=2,
        )
    elif floor is not None and (scale <= floor).any():
        warnings.warn(
            f"loss_scaled: the scale reached its floor min_scale={floor:g} and the "
            "step still overflowed; the gradients may be non-finite whatever the scale",
            RuntimeWarning,
            stacklevel=2,
        )


class _NonfiniteUpdateReport:
    """Host side of the guard's warning: once, after a run of skipped steps.

    Called on guarded steps whose update was non-finite, with the step
    number; a run is a sequence of consecutive step numbers."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.run = 0
        self.warned = False

    def __call__(self, bad: Any, step: Any) -> None:
        bad = np.asarray(bad)
        if self.warned or not bad.any():
            return
        n = int(np.asarray(step).max())
        if n == self.last:  # the same step reported by another device
            return
        self.run = self.run + 1 if self.last is not None and n == self.last + 1 else 1
        self.last = n
        if self.run >= NONFINITE_RUN_WARNING:
            self.warned = True
            warnings.warn(
                f"loss_scaled: {self.run} optimizer steps in a row were skipped because the "
                "update (or the new parameters) held inf/NaN although the gradients were "
                "finite. The likely cause is 16-bit parameters with an optimizer epsilon "
                "that is 0 in float16 (optax.adam's eps=1e-8): a moment that underflows "
                "divides by zero. Keep float32 master weights (get_policy('O2')) or use "
                "eps >= 1e-4 in float16 (optax.adam(lr, eps=1e-4)).",
                RuntimeWarning,
                stacklevel=2,
            )


# ------------------------------------------------------------ the wrapper

_MOVED = {
    "drop_overflow_update": "it belongs to the scaler now: "
    "dynamic_scaler(..., drop_overflow_update=False) (or static_scaler/no_op_scaler)",
    "accumulate": "wrap instead: accumulate_gradients(loss_scaled(inner, ...), k)",
    "grad_norm": "put clip_grad_norm(None) inside: loss_scaled(optax.chain("
    "clip_grad_norm(None), inner)); the norm is in its state",
    "clip_grad_norm": "put the transformation inside: loss_scaled(optax.chain("
    "clip_grad_norm(max_norm), inner)); clipping then follows unscaling",
    "overflow_callbacks": "it is called host_callbacks now",
}


def _check_removed(removed: dict[str, Any], where: str) -> Any:
    """The deprecated ``scale=`` value; TypeError for options that moved."""
    scale = removed.pop("scale", None)
    for name in removed:
        if name in _MOVED:
            raise TypeError(f"{where}: the option {name}= was removed; {_MOVED[name]}")
        raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")
    if scale is not None:
        warnings.warn(
            f"{where}(scale=...) is deprecated; pass the scaler as scaler=",
            DeprecationWarning,
            stacklevel=3,
        )
    return scale


def loss_scaled(
    inner: optax.GradientTransformation,
    scaler: Any = None,
    *,
    axis_name: Hashable | None = None,
    skip_nonfinite_updates: bool | None = None,
    max_consecutive_overflows: int | None = None,
    host_callbacks: bool = True,
    backend: Backend = "auto",
    **removed: Any,
) -> LossScaled:
    """Wraps `inner` so that it receives unscaled, checked gradients.

    Args:
      inner: any optax transformation or chain (extra args are forwarded).
        An ``optax.MultiSteps`` inside is allowed but updates the scale every
        micro-batch; `accumulate_gradients` outside is torch's semantics.
        Never wrap the result in ``optax.MultiSteps``: it resets its
        accumulator as ``(1 - emit) * acc``, so one overflow leaves NaN in
        it for good.
      scaler: `dynamic_scaler()` (default, torch ``GradScaler``'s defaults),
        `static_scaler(x)`, `no_op_scaler()` or a `ScaleState`.  Its
        ``drop_overflow_update`` says whether an overflow step is skipped.
      axis_name: data parallelism over a mapped axis, as torch DDP: the
        gradients are averaged over it (`replicas.mean_gradients`) and the
        overflow flag is OR-reduced, so every replica takes the same step.
      skip_nonfinite_updates: also skip a step whose gradients are finite but
        whose inner update (or ``params + updates`` when `params` is given)
        is not; the scale is not backed off.  Default None: on when some
        parameter (without `params`: update) is 16-bit and overflow steps
        are dropped.  A run of 10 such skips warns once (``RuntimeWarning``)
        with the likely cause.
      max_consecutive_overflows: None (torch: no limit) or n: the n-th
        overflowing step in a row raises ``FloatingPointError`` on the host
        (see `host_callbacks`).
      host_callbacks: the host reports (default True): a ``RuntimeWarning``
        when a dynamic scale reaches 0 or ``min_scale``, the
        `max_consecutive_overflows` error, the guard's warning.  They run
        inside the skip branch (or the guard's), never on a plain step: on
        CPU as a native custom call that calls Python, elsewhere (and with
        ``backend="reference"``) as ``jax.debug.callback``.  The error is
        written to stderr, then raised on the host, so it reaches your code
        as ``jax.errors.JaxRuntimeError`` whose message holds it, when the
        step's result is read.  False for ``jax.export`` (which cannot
        serialize the reports): the counters stay in the state.
      backend: the `update_scale` backend (``"auto"``, ``"reference"``,
        ``"ffi"``); the gradient pass runs ``"auto"``, or ``"reference"``
        when `backend` is ``"reference"``.

    ``update(grads, state, params=None, **extra_args)`` expects the gradients
    of the *scaled* loss (``scale_loss(loss, state)``) and returns the inner
    updates, or zeros with ``inner_state`` untouched when the step is
    skipped.  The state is a `LossScaledState`.
    """
    legacy_scale = _check_removed(removed, "loss_scaled")
    if legacy_scale is not None:
        if scaler is not None:
            raise TypeError("loss_scaled: pass the scaler once (scaler=), not also scale=")
        scaler = legacy_scale
    if isinstance(inner, optax.MultiSteps):
        inner = inner.gradient_transformation()
    if not isinstance(inner, optax.GradientTransformation):
        raise TypeError(
            "inner must be an optax GradientTransformation (or optax.MultiSteps), "
            f"got {type(inner).__name__}"
        )
    scaler = scalers.as_scaler(scaler)
    limit = positive_int(max_consecutive_overflows, "max_consecutive_overflows", allow_none=True)
    guard = None
    if skip_nonfinite_updates is not None:
        guard = check_bool(skip_nonfinite_updates, "skip_nonfinite_updates")
    callbacks = check_bool(host_callbacks, "host_callbacks")
    if limit is not None and not callbacks:
        raise ValueError(
            "max_consecutive_overflows needs host_callbacks=True (it raises from a "
            "host report); without callbacks, read state.consecutive_overflows instead"
        )
    backend = check_backend(backend)  # type: ignore[assignment]
    # "ffi" asks for the native update-scale operator; the gradient pass stays
    # "auto" (native where there is one, the reference elsewhere).
    pass_backend: Backend = "reference" if backend == "reference" else "auto"
    inner = optax.with_extra_args_support(inner)
    drop = scaler.drop_overflow_update
    dynamic = isinstance(scaler, scalers.DynamicScaler)
    floor = scaler.min_scale if isinstance(scaler, scalers.DynamicScaler) else None
    report_overflows = callbacks and (dynamic or limit is not None)
    overflow_report = functools.partial(_overflow_report, limit=limit, floor=floor)
    nonfinite_report = _NonfiniteUpdateReport()

    def init_fn(params: Any) -> LossScaledState:
        zero = jnp.zeros((), jnp.int32)
        return LossScaledState(scaler, inner.init(params), zero, zero, zero)

    def update_fn(
        updates: Any, state: LossScaledState, params: Any = None, **extra_args: Any
    ) -> tuple[Any, LossScaledState]:
        if not isinstance(state, LossScaledState):
            raise TypeError(f"state must be a LossScaledState, got {type(state).__name__}")
        grads = replicas.mean_gradients(updates, axis_name)
        grads, found = state.scaler.unscale_and_check(grads, backend=pass_backend)
        found = or_across(found, axis_name)
        new_scaler = state.scaler.update(found, backend=backend)
        overflows = jnp.where(found, state.consecutive_overflows + 1, 0).astype(jnp.int32)
        guarded = (
            guard
            if guard is not None
            else drop and _low_precision(updates if params is None else params)
        )

        new_updates, new_inner = strongly_typed(
            inner.update(grads, state.inner_state, params, **extra_args)
        )
        bad = jnp.bool_(False)
        if guarded:
            new = new_updates if params is None else optax.apply_updates(params, new_updates)
            bad = jnp.logical_not(helpers.all_finite(new))

        # The skip: one scalar lax.cond decides it, and one select per leaf
        # applies it.  The cond's overflow branch runs the host reports (never
        # on a plain step); its result is one flag in memory, which each
        # leaf's select reads inside that leaf's update kernel (no extra pass).
        # A report returns the flag it was given: using it keeps the report.
        def overflow() -> jax.Array:
            skip = bad | drop
            if report_overflows:
                seen = host_report.report(
                    overflow_report, found, new_scaler.scale, overflows, backend=pass_backend
                )
                skip = skip & seen  # seen is found: True in this branch
            return skip

        def finite() -> jax.Array:
            if guarded and callbacks:
                return host_report.report(
                    nonfinite_report, bad, state.total_steps, backend=pass_backend
                )
            return bad

        skipped = jax.lax.cond(found, overflow, finite)
        return zeros_where(skipped, new_updates), LossScaledState(
            scaler=new_scaler,
            inner_state=keep_where(skipped, state.inner_state, new_inner),
            consecutive_overflows=overflows,
            skipped_steps=state.skipped_steps + skipped.astype(jnp.int32),
            total_steps=state.total_steps + 1,
        )

    return LossScaled(init_fn, update_fn)


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
    one ``lax.cond``.  Several optimizers sharing one scaler (torch's multiple
    optimizer scenario): call this once per optimizer with the found_inf of
    its own gradients, and ``scaler.update`` once with the OR of them.
    """
    if not isinstance(tx, optax.GradientTransformation):
        raise TypeError(f"tx must be an optax GradientTransformation, got {type(tx).__name__}")
    tx = optax.with_extra_args_support(tx)
    found = jnp.asarray(found_inf)
    if found.size != 1:
        raise ValueError(f"found_inf must be a scalar, got shape {found.shape}")
    found = found.reshape(()).astype(bool)

    def apply(operands: tuple[Any, Any, Any]) -> tuple[Any, Any]:
        g, st, p = operands
        u, new_st = tx.update(g, st, p, **extra_args)
        return strongly_typed((optax.apply_updates(p, u), new_st))

    def skip(operands: tuple[Any, Any, Any]) -> tuple[Any, Any]:
        new_p, new_st = apply(operands)  # dead code, for matching types
        return keep_where(True, operands[2], new_p), keep_where(True, operands[1], new_st)

    return jax.lax.cond(found, skip, apply, (grads, opt_state, params))
