"""Loss-scaling helpers: scale a loss, unscale and check gradients.

Every function takes the scale as ``state``: a `ScaleState`, a scaler, an
optax `LossScaledState`, any pytree holding exactly one `ScaleState`, or a
float scalar.  Floating leaves (float16 to float64) are unscaled and
checked; integer, boolean and ``float0`` leaves pass; ``None`` stays ``None``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from jax_amp_scale.mechanisms.floats import compute_dtype, inverse_scale, is_float_leaf, widened
from jax_amp_scale.mechanisms.handlers import Backend
from jax_amp_scale.operators import float_status
from jax_amp_scale.operators import unscale_and_check as gradient_pass
from jax_amp_scale.operators.scale_state import ScaleState, or_across
from jax_amp_scale.operators.unscale_and_check import PyTree, leaf_finite, unscale_leaf

T = TypeVar("T")


def instances(tree: Any, cls: type[T]) -> list[T]:
    """Every node of type `cls` in `tree`, outermost first, by a plain pytree walk."""
    nodes = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, cls))
    return [x for x in nodes if isinstance(x, cls)]


def find_scale_state(tree: PyTree) -> ScaleState:
    """The one `ScaleState` inside `tree`.

    Args:
      tree: any pytree: a `ScaleState` itself, a scaler, a `LossScaledState`
        or a whole optax state; a ``ValueError`` when it holds none or more
        than one (for example an optax state with two `loss_scaled`).
    """
    found = instances(tree, ScaleState)
    if len(found) != 1:
        raise ValueError(
            f"expected exactly one ScaleState in the pytree, found {len(found)}; "
            "pass the ScaleState, scaler or LossScaledState itself"
        )
    return found[0]


def path_key(key: Any) -> Any:
    """One key of a pytree path as the tree spells it: a dict key, attribute or index."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return key


def map_floats(fn: Callable[[jax.Array], Any], tree: PyTree) -> PyTree:
    """`fn` on every floating leaf of `tree`; the other leaves as they are."""
    return jax.tree_util.tree_map(lambda x: fn(x) if is_float_leaf(x) else x, tree)


def _is_identity(state: Any) -> bool:
    # NoOpScaler (and states that wrap one) multiply by nothing at all.
    return bool(getattr(state, "is_identity", False))


def scale_value(state: Any, name: str = "state") -> jax.Array:
    """The current scale held by `state`, as a float array of shape ()."""
    if isinstance(state, ScaleState):
        value = state.scale
    elif isinstance(getattr(state, "scale_state", None), ScaleState):
        value = state.scale_state.scale  # a scaler or a LossScaledState
    elif isinstance(state, bool):
        raise TypeError(f"{name} must be a scale state or a float scalar, got bool")
    elif isinstance(state, numbers.Real):
        value = jnp.asarray(float(state), dtype=jnp.float32)
    elif isinstance(state, jax.Array | np.ndarray | np.generic):
        value = jnp.asarray(state)
    else:
        held = instances(state, ScaleState)
        if len(held) != 1:
            raise TypeError(
                f"{name} must be a ScaleState, a scaler (DynamicScaler, StaticScaler, "
                "NoOpScaler), a LossScaledState, any pytree holding exactly one ScaleState "
                "(such as the optax state of a chain with one loss_scaled) or a float "
                f"scalar; got a {type(state).__name__} holding {len(held)} ScaleStates"
            )
        value = held[0].scale
    dtype = getattr(value, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name}: the scale must be a floating array, got {dtype}")
    if value.size != 1 or value.ndim > 1:
        raise ValueError(f"{name}: the scale must have shape () or (1,), got {tuple(value.shape)}")
    return value.reshape(())


def scale_loss(loss: PyTree, state: Any) -> PyTree:
    """Multiplies the loss by the current loss scale.

    Args:
      loss: a floating array (usually a scalar) or a pytree of them.
      state: where the scale lives (see the module docstring).

    Returns:
      ``loss * scale`` computed and returned in ``promote_types(loss.dtype,
      float32)``: a float16 loss times ``2**16`` would overflow float16 itself,
      while its gradient, taken through this float32 product, arrives in the
      parameters' dtype.  Non-floating leaves are returned unchanged.
    """
    python = [x for x in jax.tree_util.tree_leaves(loss) if isinstance(x, numbers.Number)]
    if python:
        raise TypeError(
            f"scale_loss: the loss must be a JAX array (what the loss function returns "
            f"under jax.grad), got a Python {type(python[0]).__name__}; a Python number "
            "carries no gradient and would not be scaled. Scale the array itself: "
            "jas.scale_loss(loss_fn(params), state)"
        )
    if _is_identity(state):
        return loss
    # On an Ascend device in saturation mode the scale passes through the
    # clear of the overflow flag, after the loss (operators/float_status.py).
    scale = float_status.clear_before_backward(scale_value(state), loss)

    def one(x: jax.Array) -> jax.Array:
        dt = compute_dtype(x.dtype)
        return x.astype(dt) * scale.astype(dt)

    return map_floats(one, loss)


def unscale(tree: PyTree, state: Any) -> PyTree:
    """Multiplies every floating leaf by ``float32(1 / scale)``, in
    ``promote_types(dtype, float32)`` rounded once back to its own dtype.

    Args:
      tree: the gradients (any pytree, mixed dtypes); non-floating leaves
        are returned as they are.
      state: where the scale lives (see the module docstring).  With a
        `NoOpScaler` (or a `LossScaledState` holding one), `tree` is
        returned as it is.
    """
    if _is_identity(state):
        return tree
    # torch's GradScaler inv_scale bit for bit, subnormal above 2**126
    # (unscale_leaf and the native pass multiply exactly).
    inv = inverse_scale(scale_value(state))
    return jax.tree_util.tree_map(lambda x: unscale_leaf(x, inv), tree)


def check_max_norm(value: Any, name: str = "max_norm") -> float:
    """`value` as a finite float > 0, or a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float > 0, got {type(value).__name__}")
    v = float(value)
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite float > 0, got {value!r}")
    return v


def global_norm(tree: PyTree) -> jax.Array:
    """float32 L2 norm of all floating leaves, as torch's ``clip_grad_norm_``
    computes it (the norm of the per-leaf norms); 0 for an empty tree."""
    norms = [
        jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32))))
        for x in jax.tree_util.tree_leaves(tree)
        if is_float_leaf(x)
    ]
    if not norms:
        return jnp.zeros((), jnp.float32)
    return jnp.sqrt(jnp.sum(jnp.square(jnp.stack(norms))))


def clip_to_norm(tree: PyTree, norm: jax.Array, max_norm: float) -> PyTree:
    """Floating leaves times ``min(1, max_norm / (norm + 1e-6))`` (torch's formula)."""
    coef = jnp.minimum(jnp.float32(max_norm) / (norm + jnp.float32(1e-6)), jnp.float32(1.0))
    return map_floats(lambda x: widened(lambda w: w * coef, x), tree)


def clip_by_global_norm(tree: PyTree, max_norm: float) -> tuple[PyTree, jax.Array]:
    """torch's ``clip_grad_norm_`` for a pytree: ``(clipped, norm)``.

    Call it on *unscaled* gradients (after `unscale_and_check`, torch's
    ``scaler.unscale_``).  `norm` is the float32 global norm before
    clipping; a non-finite norm (an overflow step) leaves non-finite leaves,
    as torch does, and the step should be skipped anyway.

    Args:
      tree: the unscaled gradients (any pytree); floating leaves are
        multiplied by ``min(1, max_norm / (norm + 1e-6))``, the others pass.
      max_norm: the largest global norm kept, a Python or NumPy real number,
        finite and > 0 (a ``TypeError`` or ``ValueError`` otherwise).
    """
    max_norm = check_max_norm(max_norm)
    norm = global_norm(tree)
    return clip_to_norm(tree, norm, max_norm), norm


def unscale_and_check(
    tree: PyTree, state: Any, *, backend: Backend = "auto"
) -> tuple[PyTree, jax.Array]:
    """Unscales the gradients and reports whether any value is non-finite.

    Args:
      tree: gradients of the scaled loss (any pytree, mixed dtypes).
      state: where the scale lives (see the module docstring).
      backend: ``"reference"``: pure JAX, one unscale and one check per leaf.
        ``"ffi"``: the native pass over all floating leaves (CPU, and
        ``aclnnForeachNonFiniteCheckAndUnscale`` on Ascend; an error at
        lowering time elsewhere).  ``"auto"`` (default): the native pass on
        CPU and Ascend, with any number of devices (explicitly sharded
        leaves on jax < 0.7 take the reference), the reference elsewhere.
        Both give the same bits.

    Returns:
      ``(unscaled, found_inf)``: ``unscaled`` as from `unscale`; ``found_inf`` a
      bool scalar, True when any unscaled floating value is inf or NaN.  The
      check reads the *unscaled* value, so a finite gradient that overflows
      when a scale below 1 is divided out is caught too.

    The native pass reads and writes each gradient byte once (docs/backends.md);
    under ``vmap`` it runs the reference, and it is differentiable.
    """
    scale = None if _is_identity(state) else scale_value(state)
    return gradient_pass.unscale_and_check(tree, scale, backend)


def nonfinite_leaves(tree: PyTree) -> PyTree:
    """A bool scalar per leaf of `tree`: True where it holds an inf or NaN.
    `nonfinite_paths` names them on the host.

    Args:
      tree: any pytree, usually the gradients; a leaf that is not a floating
        array (an integer array, a Python float) gets False.
    """
    return jax.tree_util.tree_map(
        lambda x: jnp.logical_not(leaf_finite(x)) if is_float_leaf(x) else jnp.array(False), tree
    )


def nonfinite_paths(report: PyTree) -> list[str]:
    """Host side: the ``jax.tree_util.keystr`` paths whose flag in `report` is True.

    Args:
      report: the output of `nonfinite_leaves` (fetched from the device; each
        flag is read with ``bool()``, so this cannot run under jit): one
        bool per leaf, a ``TypeError`` otherwise.
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(report)
    for path, flag in flat:
        dtype = getattr(flag, "dtype", None)
        if not (isinstance(flag, bool) or (dtype == np.bool_ and np.size(flag) == 1)):
            raise TypeError(
                "report must hold one bool per leaf, as nonfinite_leaves returns; "
                f"got {dtype if dtype is not None else type(flag).__name__} "
                f"of shape {tuple(np.shape(flag))} at {jax.tree_util.keystr(path)}: "
                "call nonfinite_paths(nonfinite_leaves(grads))"
            )
    return [jax.tree_util.keystr(path) for path, flag in flat if bool(np.asarray(flag))]


def check_scalar_loss(loss: Any, name: str, has_aux: bool) -> None:
    """Raises a TypeError naming `name` unless `loss` is a floating scalar."""
    if isinstance(loss, tuple | list) and not has_aux:
        raise TypeError(
            f"{name} returned a {type(loss).__name__} of {len(loss)} items, not a scalar "
            "loss; pass has_aux=True when it returns (loss, aux)"
        )
    shape = getattr(loss, "shape", None)
    if not is_float_leaf(loss) or shape != ():
        what = getattr(loss, "dtype", type(loss).__name__)
        raise TypeError(
            f"{name} must return a floating scalar loss, got {what}"
            + (f" of shape {tuple(shape)}" if shape is not None else "")
        )


def value_and_grad(
    fun: Callable[..., Any],
    state: Any,
    *,
    has_aux: bool = False,
    argnums: int | Sequence[int] = 0,
    axis_name: Hashable | None = None,
    backend: Backend = "auto",
) -> Callable[..., tuple[Any, PyTree, jax.Array]]:
    """Like `jax.value_and_grad`, through a scaled loss.

    Args:
      fun: returns a floating scalar loss, or ``(loss, aux)`` with ``has_aux``.
      state: where the scale lives (see the module docstring).
      has_aux: whether `fun` returns ``(loss, aux)``; the aux is returned
        unscaled beside the loss.
      argnums: which positional argument(s) to differentiate (an int or a
        sequence of ints), as in `jax.value_and_grad`.
      axis_name: optional mapped axis; found_inf is OR-reduced across it so
        every replica takes the same skip decision.  Gradients are not
        averaged here (``replicas.mean_gradients`` does, in `loss_scaled` and `Trainer`).
      backend: the `unscale_and_check` backend.

    Returns:
      A function of `fun`'s arguments returning ``(value, grads, found_inf)``:
      ``value`` is `fun`'s own (unscaled) loss or ``(loss, aux)``; ``grads``
      are unscaled, in the dtypes of the differentiated arguments;
      ``found_inf`` is a bool scalar.  The scale itself is not updated: feed
      found_inf to ``scaler.update`` (or `update_scale`).
    """
    if not callable(fun):
        raise TypeError(f"fun must be callable, got {type(fun).__name__}")

    def scaled(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        out = fun(*args, **kwargs)
        if has_aux and not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError("with has_aux=True, fun must return a pair (loss, aux)")
        loss, aux = out if has_aux else (out, None)
        check_scalar_loss(loss, "fun", has_aux)
        return scale_loss(loss, state), (loss, aux)

    grad_fn = jax.grad(scaled, argnums=argnums, has_aux=True)

    def wrapped(*args: Any, **kwargs: Any) -> tuple[Any, PyTree, jax.Array]:
        grads, (loss, aux) = grad_fn(*args, **kwargs)
        grads, found = unscale_and_check(grads, state, backend=backend)
        return ((loss, aux) if has_aux else loss), grads, or_across(found, axis_name)

    return wrapped
