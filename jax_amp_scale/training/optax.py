"""`loss_scaled`: an optax wrapper that unscales, checks and skips overflow steps.

Usage::

    tx = jax_amp_scale.optax.loss_scaled(optax.adam(1e-3))
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        def scaled_loss(p):
            return jax_amp_scale.scale_loss(loss_fn(p, batch), opt_state)
        grads = jax.grad(scaled_loss)(params)          # scaled gradients
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

Also here, for loops ported from torch's ``GradScaler``: `optimizer_step`
(``scaler.step(opt)`` for any optax optimizer, skipping on found_inf).
"""

from __future__ import annotations

import enum
import numbers
import sys
import warnings
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax_amp_scale.ops.update_scale import or_across
from jax_amp_scale.reference.gradient_pass import is_float_leaf
from jax_amp_scale.state.scale_state import ScaleState
from jax_amp_scale.state.validation import Backend, check_backend, check_bool
from jax_amp_scale.training import helpers, loss_scale_kinds


class SkipReason(enum.IntEnum):
    """Why `loss_scaled` did or did not apply a step (``LossScaledState.reason``).

    ``APPLIED`` (0): the inner update was applied.  ``OVERFLOW`` (1): the
    unscaled gradients held an inf or NaN; the scale backs off.
    ``NONFINITE_UPDATE`` (2): the gradients were finite but the inner update
    (or the new parameters) were not, with ``skip_nonfinite_updates``.
    ``ACCUMULATING`` (3): a micro-batch inside an ``accumulate=k`` window; no
    optimizer step is due.
    """

    APPLIED = 0
    OVERFLOW = 1
    NONFINITE_UPDATE = 2
    ACCUMULATING = 3


class LossScaledState(NamedTuple):
    """State of `loss_scaled`.

    Attributes:
      scale: the scale kind (`DynamicScale`, `StaticScale` or `NoOpScale`); it
        holds the one core `ScaleState` of this state (``scale_state``).
      inner_state: the wrapped transformation's state; never changed on a
        skipped step.
      found_inf: bool scalar, whether the last optimizer step saw inf/NaN in
        its (accumulated) gradients; False inside an accumulation window.
      skipped_steps: int32, optimizer steps dropped (overflow or non-finite
        update) so far.
      total_steps: int32, calls to ``update`` so far (skipped ones and
        micro-batches included).
      reason: int32 `SkipReason` of the last call.
      consecutive_overflows: int32, overflowing optimizer steps in a row
        (0 after a step without overflow).
      grad_norm: float32 global norm of the unscaled gradients of the last
        optimizer step (before clipping, as torch's ``clip_grad_norm_``
        returns it); None unless ``grad_norm=True`` or ``clip_grad_norm``.
      mini_step: int32 position inside the accumulation window (always 0
        with ``accumulate=1``).
      acc_grads: the accumulated *scaled* gradients of the window (floating
        leaves in the parameters' dtypes), or None with ``accumulate=1``.
    """

    scale: loss_scale_kinds.DynamicScale | loss_scale_kinds.StaticScale | loss_scale_kinds.NoOpScale
    inner_state: Any
    found_inf: jax.Array
    skipped_steps: jax.Array
    total_steps: jax.Array
    reason: Any = None
    consecutive_overflows: Any = None
    grad_norm: Any = None
    mini_step: Any = None
    acc_grads: Any = None

    @property
    def loss_scale(self) -> jax.Array:
        """The current loss scale (what `jax_amp_scale.scale_loss` multiplies by)."""
        return self.scale.loss_scale

    @property
    def scale_state(self) -> ScaleState:
        """The core `ScaleState`."""
        return self.scale.scale_state

    @property
    def is_identity(self) -> bool:
        return self.scale.is_identity


def get_loss_scaled_state(opt_state: Any) -> LossScaledState:
    """The one `LossScaledState` inside `opt_state` (for example a chain's tuple)."""
    found = [
        x
        for x in jax.tree_util.tree_leaves(
            opt_state, is_leaf=lambda x: isinstance(x, LossScaledState)
        )
        if isinstance(x, LossScaledState)
    ]
    if len(found) != 1:
        raise ValueError(f"expected exactly one LossScaledState in opt_state, found {len(found)}")
    return found[0]


def _strongly_typed(tree: Any) -> Any:
    # Weak-typed leaves would make the two cond branches' types differ.
    def one(x: Any) -> Any:
        if not jax.typeof(x).weak_type:
            return x
        return jax.lax.convert_element_type(x, jnp.result_type(x))

    return jax.tree_util.tree_map(one, tree)


def _pick(flag: jax.Array, on_true: Any, on_false: Any) -> jax.Array:
    """``jnp.where(flag, on_true, on_false)`` for a scalar bool `flag`, typed as
    `on_false`, as one ``lax.select``: ``jnp.where`` stages a nested jit for
    every leaf, which the tracer then inlines (trace time on every compile)."""
    on_false = jnp.asarray(on_false)
    # jnp.asarray: optax allows Python scalars in a state ({"foo": 1}).
    on_true = jnp.asarray(on_true)
    if on_true.dtype != on_false.dtype:
        on_true = on_true.astype(on_false.dtype)
    if on_true.shape != on_false.shape:
        on_true = jnp.broadcast_to(on_true, on_false.shape)
    return jax.lax.select(flag, on_true, on_false)


def _zeros_where(flag: jax.Array, tree: Any) -> Any:
    """`tree` with every leaf zeroed where the scalar bool `flag` holds.

    One zeros array per distinct type (shape, dtype, sharding), shared by the
    leaves of that type: a model repeats few shapes, and each zeros_like is
    traced and lowered on its own."""
    zeros: dict[Any, jax.Array] = {}

    def one(u: Any) -> jax.Array:
        key = jax.typeof(u)
        if key not in zeros:
            zeros[key] = jnp.zeros_like(u)
        return _pick(flag, zeros[key], u)

    return jax.tree_util.tree_map(one, tree)


def _keep(old: Any, new: Any, flag: Any) -> Any:
    return jax.tree_util.tree_map(lambda o, n: _pick(flag, o, n), old, new)


def _update_unless(
    found: jax.Array,
    inner: optax.GradientTransformationExtraArgs,
    grads: Any,
    inner_state: Any,
    params: Any,
    extra_args: dict[str, Any],
    *,
    by_select: bool,
    check: Callable[[Any], jax.Array] | None = None,
    on_skip: Callable[[], None] | None = None,
    flag_in_memory: bool = False,
) -> tuple[Any, Any, jax.Array]:
    """inner.update(...), or (zero updates, inner_state unchanged) when `found`.

    Returns ``(updates, inner_state, bad_update)``.  With `check`, an update
    for which ``check(updates)`` is True is dropped too and ``bad_update``
    says so (False when `found` already dropped the step).  `on_skip` runs
    (a ``jax.debug.callback``) only where the step is dropped for `found`.

    `by_select` picks how the step is skipped; both give the same bits.
    `flag_in_memory`: `found` is one native call's own result (no OR of
    several), so the selects can read it as it is.
    A select per leaf fuses into that leaf's update kernel (no extra pass, and
    the fewest kernels to compile), but only when `found` is a value XLA
    cannot recompute: the fused native pass's flag.  A flag built from
    per-leaf reductions is recomputed inside every leaf's kernel (compile
    time then grows with the square of the tree) and the unscale fuses into
    each reader: for those, one ``lax.cond`` (bench/RESULTS.md).
    `flag_in_memory`: `found` is one native call's own result (no OR of
    several), so the selects can read it as it is.
    """

    def raw(operands: tuple[Any, Any]) -> tuple[Any, Any]:
        g, st = operands
        return _strongly_typed(inner.update(g, st, params, **extra_args))

    if by_select:
        new_updates, new_state = raw((grads, inner_state))
        bad = check(new_updates) if check is not None else jnp.bool_(False)

        # A cond with constant branches hands the selects one materialised
        # flag (the OR of several native calls, say) that XLA cannot copy
        # into each kernel; optimization_barrier does not stop that on XLA:CPU.
        # With one native call (and no on_skip to run) the flag already is
        # such a value; the cond would only cost compile time.
        def yes() -> jax.Array:
            if on_skip is not None:
                on_skip()
            return jnp.bool_(True)

        if flag_in_memory and on_skip is None:
            dropped = found
        else:
            dropped = jax.lax.cond(found, yes, lambda: jnp.bool_(False))
        if check is not None:
            dropped = dropped | bad
        updates = _zeros_where(dropped, new_updates)
        return updates, _keep(inner_state, new_state, dropped), bad & ~found

    def apply(operands: tuple[Any, Any]) -> tuple[Any, Any, jax.Array]:
        u, st = raw(operands)
        if check is None:
            return u, st, jnp.bool_(False)
        bad = check(u)
        u = _zeros_where(bad, u)
        return u, _keep(operands[1], st, bad), bad

    def skip(operands: tuple[Any, Any]) -> tuple[Any, Any, jax.Array]:
        # Built from the traced update so both branches carry the same
        # shardings and shard_map varying axes; the update is dead code here
        # and XLA removes it.  select(True, old, new) keeps old's bits exactly.
        if on_skip is not None:
            on_skip()
        new_updates, new_state = raw(operands)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, new_updates)
        return zeros, _keep(operands[1], new_state, True), jnp.bool_(False)

    return jax.lax.cond(found, skip, apply, (grads, inner_state))


def _inside_multisteps() -> bool:
    """Whether an ``optax.MultiSteps`` method is among our first callers."""
    frame: Any = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return False
        if isinstance(frame.f_locals.get("self"), optax.MultiSteps):
            return True
        frame = frame.f_back
    return False


_MULTISTEPS_ERROR = (
    "loss_scaled must not be wrapped in optax.MultiSteps: MultiSteps resets its "
    "accumulator as (1 - emit) * acc, so one overflowing micro-batch leaves NaN in it "
    "for good (every later step skipped, the scale halved down to 0). Use "
    "loss_scaled(inner, accumulate=k) instead: torch GradScaler's semantics (one scale "
    "update per optimizer step; an overflow in any micro-batch skips the whole window)."
)


def _report(found: Any, scale: Any, count: Any, *, limit: int | None, floor: float | None) -> None:
    """Host side of the overflow reports (runs on overflow steps only)."""
    found = np.asarray(found)
    if not found.any():  # under vmap the callback may run for every step
        return
    scale = np.asarray(scale, np.float64)
    count = np.asarray(count)
    if limit is not None and (count >= limit).any():
        raise FloatingPointError(
            f"loss_scaled: {int(count.max())} overflowing steps in a row reached "
            f"max_consecutive_overflows={limit} (loss scale now {float(scale.min()):g}); "
            "the gradients are non-finite whatever the scale: look for a NaN in the loss, "
            "the data or the parameters (jas.nonfinite_paths(jas.nonfinite_leaves(grads))), "
            "or raise max_consecutive_overflows"
        )
    if (scale == 0).any():
        warnings.warn(
            "loss_scaled: the loss scale reached 0 after repeated overflows and cannot "
            "recover (zero gradients unscale to NaN); set min_scale= in dynamic_scale() "
            "or max_consecutive_overflows= in loss_scaled to stop earlier",
            RuntimeWarning,
            stacklevel=2,
        )
    elif floor is not None and (scale <= floor).any():
        warnings.warn(
            f"loss_scaled: the loss scale reached its floor min_scale={floor:g} and the "
            "step still overflowed; the gradients may be non-finite whatever the scale",
            RuntimeWarning,
            stacklevel=2,
        )


def _positive_int(value: Any, name: str, *, allow_none: bool) -> int | None:
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


def _accumulator(params: Any) -> Any:
    # Floating leaves: zeros of the parameter's dtype (torch's .grad); other
    # leaves pass the latest micro-batch's value through.
    return jax.tree_util.tree_map(
        lambda p: jnp.zeros_like(p) if is_float_leaf(p) else jnp.zeros((), jnp.int32), params
    )


def loss_scaled(
    inner: optax.GradientTransformation,
    scale: Any = None,
    drop_overflow_update: bool | None = None,
    *,
    accumulate: int = 1,
    skip_nonfinite_updates: bool | None = None,
    max_consecutive_overflows: int | None = None,
    grad_norm: bool = False,
    clip_grad_norm: float | None = None,
    overflow_callbacks: bool = True,
    axis_name: Hashable | None = None,
    backend: Backend = "auto",
) -> optax.GradientTransformationExtraArgs:
    """Wraps `inner` so that it receives unscaled, checked gradients.

    Args:
      inner: any optax transformation or chain, or an ``optax.MultiSteps``
        (extra args are forwarded; see the README on accumulation: with a
        MultiSteps inside, the scale is updated every micro-batch).
      scale: a scale kind (`dynamic_scale()`, `static_scale(x)`,
        `no_op_scale()`) or a `ScaleState`; default ``dynamic_scale()``
        (torch GradScaler's defaults).
      drop_overflow_update: on a step with inf/NaN, return zero updates and
        keep ``inner_state`` (True) or apply the inner update anyway (False).
        Default: the kind's own choice (True unless a static/no-op kind says
        otherwise).
      accumulate: gradient accumulation over `accumulate` calls, with torch
        GradScaler's semantics: the scaled gradients are summed (in the
        parameters' dtypes, as torch's ``.grad``), and on every
        `accumulate`-th call their mean is unscaled, checked and handed to
        `inner`; the scale changes only then (``growth_interval`` counts
        optimizer steps) and an overflow in any micro-batch skips the whole
        window.  Between, updates are zero.  Default 1 (no accumulation).
      skip_nonfinite_updates: also drop a step whose gradients are finite but
        whose inner update or new parameters (``params + updates``, when
        `params` is given) are not (`SkipReason.NONFINITE_UPDATE`; the scale
        is not touched).  Costs one read of the updates.  Default None: on
        when overflow steps are dropped and some parameter (or, without
        `params`, update) is 16-bit, off for float32 master weights, where a
        finite gradient gives a finite update unless the optimizer is broken.
      max_consecutive_overflows: None (default, torch's behaviour) or an int:
        when that many optimizer steps in a row overflow, the step raises
        ``FloatingPointError`` from a ``jax.debug.callback`` (under jit it
        arrives as jax's runtime error with that message).
      grad_norm: record the global norm of the unscaled gradients in
        ``state.grad_norm`` (one extra reduction over the gradients; default
        False).
      clip_grad_norm: clip the unscaled gradients to this global norm before
        `inner`, with torch's ``clip_grad_norm_`` formula (``g *
        min(1, max_norm / (norm + 1e-6))``); the norm before clipping is
        recorded as with `grad_norm`.
      overflow_callbacks: emit the overflow reports (the warning when a
        dynamic scale reaches 0 or ``min_scale``, and the
        `max_consecutive_overflows` error) through ``jax.debug.callback``
        (default True).  False for ``jax.export``, which cannot serialize
        host callbacks; the counters stay in the state.
      axis_name: optional mapped axis; found_inf is OR-reduced across it so
        all replicas skip together and keep equal scales.
      backend: the core `update_scale` backend (``"auto"``, ``"reference"``,
        ``"ffi"``).  `unscale_and_check` runs with ``"auto"`` (the native
        fused pass on a one-device CPU process and on Ascend), or ``"reference"`` when
        `backend` is ``"reference"``.

    ``update(grads, state, params=None, **extra_args)`` expects the gradients
    of the *scaled* loss (``scale_loss(loss, state)``); it unscales them,
    checks them, advances the scale with `update_scale`, and returns the
    inner updates, or zeros with ``inner_state`` untouched (its step count
    too) when the step is dropped.  On a dynamic kind, an overflow that
    leaves the scale at 0 or at ``min_scale`` warns (``RuntimeWarning``).
    """
    if isinstance(inner, optax.MultiSteps):
        inner = inner.gradient_transformation()
    if not isinstance(inner, optax.GradientTransformation):
        raise TypeError(
            "inner must be an optax GradientTransformation (or optax.MultiSteps), "
            f"got {type(inner).__name__}"
        )
    kind = loss_scale_kinds.as_loss_scale(scale)
    if drop_overflow_update is None:
        drop = kind.drop_overflow_update
    else:
        drop = check_bool(drop_overflow_update, "drop_overflow_update")
    k = _positive_int(accumulate, "accumulate", allow_none=False)
    assert k is not None
    limit = _positive_int(max_consecutive_overflows, "max_consecutive_overflows", allow_none=True)
    if skip_nonfinite_updates is not None:
        skip_nonfinite_updates = check_bool(skip_nonfinite_updates, "skip_nonfinite_updates")
    want_norm = check_bool(grad_norm, "grad_norm") or clip_grad_norm is not None
    max_norm = None
    if clip_grad_norm is not None:
        max_norm = helpers.check_max_norm(clip_grad_norm, "clip_grad_norm")
    backend = check_backend(backend)  # type: ignore[assignment]
    # "ffi" asks for the native update-scale operator (Ascend's, say); the
    # fused gradient pass stays "auto" (native on CPU and Ascend, the
    # reference elsewhere) so that "ffi" never fails for it.
    unscale_backend: Backend = "reference" if backend == "reference" else "auto"
    inner = optax.with_extra_args_support(inner)
    dynamic = isinstance(kind, loss_scale_kinds.DynamicScale)
    floor = kind.min_scale if dynamic else None  # type: ignore[union-attr]
    reports = check_bool(overflow_callbacks, "overflow_callbacks") and (
        dynamic or limit is not None
    )
    if limit is not None and not overflow_callbacks:
        raise ValueError(
            "max_consecutive_overflows needs overflow_callbacks=True (it raises from a "
            "jax.debug.callback); without callbacks, read state.consecutive_overflows instead"
        )

    def init_fn(params: Any) -> LossScaledState:
        if _inside_multisteps():
            raise TypeError(_MULTISTEPS_ERROR)
        return LossScaledState(
            scale=kind,
            inner_state=inner.init(params),
            found_inf=jnp.array(False),
            skipped_steps=jnp.zeros((), jnp.int32),
            total_steps=jnp.zeros((), jnp.int32),
            reason=jnp.zeros((), jnp.int32),
            consecutive_overflows=jnp.zeros((), jnp.int32),
            grad_norm=jnp.zeros((), jnp.float32) if want_norm else None,
            mini_step=jnp.zeros((), jnp.int32),
            acc_grads=_accumulator(params) if k > 1 else None,
        )

    def update_fn(
        updates: Any, state: LossScaledState, params: Any = None, **extra_args: Any
    ) -> tuple[Any, LossScaledState]:
        if not isinstance(state, LossScaledState):
            raise TypeError(f"state must be a LossScaledState, got {type(state).__name__}")
        if state.reason is None:  # a state built by hand with the first five fields
            state = state._replace(
                reason=jnp.zeros((), jnp.int32), consecutive_overflows=jnp.zeros((), jnp.int32)
            )
        if (state.acc_grads is None) != (k == 1) or (state.grad_norm is None) == want_norm:
            raise ValueError(
                "state was not made by this transformation's init (accumulate, grad_norm "
                "or clip_grad_norm differ); call tx.init(params) with the same options"
            )
        old_kind = state.scale
        emit: jax.Array | None = None
        if k > 1:
            grads_in = jax.tree_util.tree_map(
                lambda a, g: (a + g).astype(a.dtype) if is_float_leaf(g) else g,
                state.acc_grads,
                updates,
            )
            emit = state.mini_step == k - 1
            # The window's mean: divide by scale * k at once (exact for k a power of 2).
            unscale_by: Any = old_kind.loss_scale.astype(jnp.float32).reshape(()) * k
        else:
            grads_in, unscale_by = updates, old_kind
        grads, found = helpers.unscale_and_check(grads_in, unscale_by, backend=unscale_backend)
        found = or_across(found, axis_name)
        if emit is not None:
            found = found & emit
        adjusted = old_kind.adjust(found, backend=backend)
        count = jnp.where(found, state.consecutive_overflows + 1, 0).astype(jnp.int32)
        if emit is not None:
            adjusted = jax.tree_util.tree_map(
                lambda n, o: jnp.where(emit, n, o), adjusted, old_kind
            )
            count = jnp.where(emit, count, state.consecutive_overflows)
        norm = None
        if want_norm:
            norm = helpers.global_norm(grads)
            if max_norm is not None:
                grads = helpers.clip_to_norm(grads, norm, max_norm)
            if emit is not None:
                norm = jnp.where(emit, norm, state.grad_norm)

        on_skip = None
        if reports:

            def on_skip() -> None:
                jax.debug.callback(
                    lambda f, s, c: _report(f, s, c, limit=limit, floor=floor),
                    found,
                    adjusted.loss_scale,
                    count,
                )

        check_on = skip_nonfinite_updates
        if check_on is None:
            check_on = drop and _low_precision(updates if params is None else params)
        check = None
        if check_on:

            def check(u: Any) -> jax.Array:
                new = u if params is None else optax.apply_updates(params, u)
                return jnp.logical_not(helpers.all_finite(new))

        skip_flag: jax.Array | None = found if drop else None
        if emit is not None:
            skip_flag = ~emit if skip_flag is None else skip_flag | ~emit
        if skip_flag is not None:
            calls = helpers.fused_pass_calls(updates, unscale_backend)
            by_select = emit is None and not old_kind.is_identity and calls > 0
            new_updates, new_inner, bad = _update_unless(
                skip_flag,
                inner,
                grads,
                state.inner_state,
                params,
                extra_args,
                by_select=by_select,
                check=check,
                # Inside the skip branch: no second conditional on a plain step.
                on_skip=on_skip if drop and emit is None else None,
                flag_in_memory=calls == 1 and axis_name is None,
            )
            if on_skip is not None and not (drop and emit is None):
                jax.lax.cond(found, on_skip, lambda: None)
        else:
            if on_skip is not None:
                jax.lax.cond(found, on_skip, lambda: None)
            new_updates, new_inner = inner.update(grads, state.inner_state, params, **extra_args)
            bad = jnp.bool_(False)
            if check is not None:
                bad = check(new_updates)
                new_updates = _zeros_where(bad, new_updates)
                new_inner = _keep(state.inner_state, new_inner, bad)
        dropped = bad | found if drop else bad
        reason = jnp.where(bad, int(SkipReason.NONFINITE_UPDATE), int(SkipReason.APPLIED))
        if drop:
            reason = jnp.where(found, int(SkipReason.OVERFLOW), reason)
        acc = None
        mini = state.mini_step
        if emit is not None:
            dropped = dropped & emit
            reason = jnp.where(emit, reason, int(SkipReason.ACCUMULATING))
            acc = jax.tree_util.tree_map(
                lambda a, s: jnp.where(emit, jnp.zeros_like(a), s) if is_float_leaf(a) else a,
                state.acc_grads,
                grads_in,
            )
            mini = jnp.where(emit, 0, mini + 1).astype(jnp.int32)
        return new_updates, LossScaledState(
            scale=adjusted,
            inner_state=new_inner,
            found_inf=found,
            skipped_steps=state.skipped_steps + dropped.astype(jnp.int32),
            total_steps=state.total_steps + 1,
            reason=reason.astype(jnp.int32),
            consecutive_overflows=count,
            grad_norm=norm,
            mini_step=mini,
            acc_grads=acc,
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


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
    one ``lax.cond``.  Several optimizers sharing one scale (torch's multiple
    optimizer scenario): call this once per optimizer with the found_inf of
    its own gradients, and advance the scale once with the OR of them.
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
        return _strongly_typed((optax.apply_updates(p, u), new_st))

    def skip(operands: tuple[Any, Any, Any]) -> tuple[Any, Any]:
        new_p, new_st = apply(operands)  # dead code, for matching shardings
        return _keep(operands[2], new_p, True), _keep(operands[1], new_st, True)

    return jax.lax.cond(found, skip, apply, (grads, opt_state, params))
