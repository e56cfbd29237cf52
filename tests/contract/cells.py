"""The contract suite's rows (what the library returns), model, data and oracle.

Every row is driven the same way: a tiny linear model whose loss is
``sum(p * x)``, so the gradient of the scaled loss is exactly ``scale * x``
(the scales are powers of two), fed a scripted sequence of batches with
inf/NaN injected at known steps.  The oracle is independent of the library:
torch's ``_amp_update_scale_`` for the scale (or the fixed scale; for
`amax_scaler` a brute force over powers of two, tests/_amax_oracle.py), the
overflow decision computed with NumPy on the scaled gradients, torch's
``clip_grad_norm_`` for clipping, and the plain optax step (never given an
overflowing window) for the parameters.

Rows and columns are listed here once; tests/contract/test_contract.py
crosses them, tools/contract_matrix.py renders the results as
docs/contract.md.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import pickle
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jax_amp_scale as jas
from jax_amp_scale.optax import accumulate_gradients, clip_grad_norm, loss_scaled, optimizer_step
from tests import _amax_oracle as amax_oracle

LR, MOMENTUM = 0.25, 0.5
INIT_SCALE, GROWTH_INTERVAL, STATIC_SCALE = 16.0, 2, 8.0
MAX_NORM = 1.5
AMAX_INIT = 1.0  # amax_scaler()'s first step: the probe scale 1 (its ceiling starts at 2**16)
STEPS = 8
OVERFLOW_AT = (2, 5)  # steps whose batch holds inf (2) or NaN (5)

# --------------------------------------------------------------- model, data


def params0(dtype: Any = jnp.float32) -> dict[str, jax.Array]:
    """Parameters with dim 0 divisible by 8 (the FSDP cells shard it)."""
    w = (np.arange(32, dtype=np.float32).reshape(8, 4) - 16) / 8
    b = np.array([0.5, -0.25, 1.0, 0.0], np.float32)
    return {"b": jnp.asarray(b, dtype), "w": jnp.asarray(w, dtype)}


def loss_fn(p: Any, x: Any) -> jax.Array:
    """Linear: the gradient is the batch, exactly (in the parameters' dtype)."""
    return sum(jnp.sum(p[k] * x[k]) for k in ("b", "w")).astype(jnp.float32)


def batches(
    n: int = STEPS, overflow_at: tuple[int, ...] = OVERFLOW_AT, dtype: Any = jnp.float32, seed=0
) -> list[dict[str, np.ndarray]]:
    """Batches of multiples of 1/16 in [-1/2, 1/2]: exact in every dtype, and
    ``scale * x`` stays finite in float16 while the scale stays below 2**17."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(n):
        x = {
            "b": rng.integers(-8, 9, size=(4,)).astype(np.float32) / 16,
            "w": rng.integers(-8, 9, size=(8, 4)).astype(np.float32) / 16,
        }
        if t in overflow_at:
            x["w"][1, 2] = np.inf if overflow_at.index(t) % 2 == 0 else np.nan
        out.append({k: np.asarray(jnp.asarray(v, dtype)) for k, v in x.items()})
    return out


def stack(bs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([b[k] for b in bs]) for k in bs[0]}


# --------------------------------------------------------------- the rows


@dataclasses.dataclass(frozen=True)
class Row:
    """One public transformation or wrapper, driven through one interface.

    kind: "optax" (a GradientTransformation: the optax columns apply),
    "trainer", "function" (optimizer_step in a hand-written loop) or
    "scaler" (a bare scaler or ScaleState with the operators).
    rule: "dynamic", "static", "none" or "amax" (the oracle's scale).
    """

    name: str
    kind: str
    rule: str
    k: int = 1
    clip: bool = False
    momentum: bool = True

    # -- building
    def scaler(self) -> Any:
        name = self.name
        if "ScaleState" in name:
            return jas.init_scale_state(INIT_SCALE, growth_interval=GROWTH_INTERVAL)
        if self.rule == "static":
            return jas.static_scaler(STATIC_SCALE)
        if self.rule == "none":
            return jas.no_op_scaler()
        if self.rule == "amax":
            return jas.amax_scaler(micro_batches=self.k)
        return jas.dynamic_scaler(INIT_SCALE, growth_interval=GROWTH_INTERVAL)

    def inner(self, inner: optax.GradientTransformation | None = None) -> Any:
        inner = plain_inner(self.momentum) if inner is None else inner
        if self.clip:
            inner = optax.chain(clip_grad_norm(MAX_NORM), inner)
        return inner

    def tx(self, inner: Any = None, **options: Any) -> optax.GradientTransformation:
        """The row's transformation around `inner` (kind "optax" only)."""
        assert self.kind == "optax", self.name
        tx = loss_scaled(self.inner(inner), self.scaler(), **options)
        if self.k > 1:
            tx = accumulate_gradients(tx, self.k)
        return tx

    def trainer(self, **options: Any) -> Any:
        if options:  # loss_scaled's options: pass the built transformation
            return jas.Trainer(loss_scaled(self.inner(), self.scaler(), **options))
        return jas.Trainer(self.inner(), self.scaler())

    def make(self, **options: Any) -> Driver:
        """The row as (init, step, scale, skipped); options go to loss_scaled."""
        if self.kind == "optax":
            return optax_driver(self.tx(**options))
        if self.kind == "trainer":
            return trainer_driver(self.trainer(**options))
        inner = self.inner()
        if self.kind == "function":
            return function_driver(self.scaler, inner)
        return scaler_driver(self.scaler, LR)


def plain_inner(momentum: bool = True) -> optax.GradientTransformation:
    return optax.sgd(LR, momentum=MOMENTUM if momentum else None)


ROWS = [
    Row("loss_scaled(dynamic_scaler())", "optax", "dynamic"),
    Row("loss_scaled(static_scaler(8.0))", "optax", "static"),
    Row("loss_scaled(no_op_scaler())", "optax", "none"),
    Row("loss_scaled(amax_scaler())", "optax", "amax"),
    Row("loss_scaled(ScaleState)", "optax", "dynamic"),
    Row("accumulate_gradients(loss_scaled(...), 2)", "optax", "dynamic", k=2),
    Row("loss_scaled(chain(clip_grad_norm(1.5), sgd))", "optax", "dynamic", clip=True),
    Row("Trainer", "trainer", "dynamic"),
    Row("optimizer_step", "function", "dynamic"),
    Row("DynamicScaler (bare)", "scaler", "dynamic", momentum=False),
    Row("StaticScaler (bare)", "scaler", "static", momentum=False),
    Row("NoOpScaler (bare)", "scaler", "none", momentum=False),
    Row("ScaleState (bare operators)", "scaler", "dynamic", momentum=False),
]
ROW = {r.name: r for r in ROWS}
OPTAX_ROWS = [r for r in ROWS if r.kind == "optax"]


# --------------------------------------------------------------- drivers


@dataclasses.dataclass(frozen=True)
class Driver:
    init: Callable[[Any], Any]
    step: Callable[[Any, Any, Any], tuple[Any, Any]]  # (params, state, batch)


def scale_of(state: Any) -> jax.Array:
    return jas.find_scale_state(state).scale


def skipped_of(state: Any) -> Any:
    """The library's skipped-step counter, where the state has one."""
    found = [
        x
        for x in jax.tree_util.tree_leaves(
            state, is_leaf=lambda x: isinstance(x, jas.optax.LossScaledState)
        )
        if isinstance(x, jas.optax.LossScaledState)
    ]
    return found[0].skipped_steps if found else None


def optax_step(tx: Any) -> Callable[[Any, Any, Any], tuple[Any, Any]]:
    """The user's step of the README: grad of the scaled loss, update, apply."""

    def step(params: Any, state: Any, batch: Any) -> tuple[Any, Any]:
        grads = jax.grad(lambda p: jas.scale_loss(loss_fn(p, batch), state))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step


def optax_driver(tx: Any) -> Driver:
    return Driver(tx.init, optax_step(tx))


def trainer_driver(trainer: Any) -> Driver:
    def step(params: Any, state: Any, batch: Any) -> tuple[Any, Any]:
        params, state, _ = trainer.step(params, state, batch, loss_fn)
        return params, state

    return Driver(trainer.init, step)


def _mean(grads: Any, axis_name: str | None) -> Any:
    """Data parallelism written by hand (torch DDP): average the gradients."""
    if axis_name is None:
        return grads
    # Under shard_map's varying-axes check, the gradient of a replicated
    # parameter arrives summed over the axis (JAX transposes the implicit
    # broadcast into a psum): divide it; a varying one (pmap) is averaged.
    if _varying(jax.lax.axis_index(axis_name)) and not any(map(_varying, jax.tree.leaves(grads))):
        n = jax.lax.psum(1, axis_name)
        return jax.tree.map(lambda g: g / n, grads)
    return jax.lax.pmean(grads, axis_name)


def _varying(x: Any) -> bool:
    """Whether JAX types `x` as varying over a manual axis (shard_map's check)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)
    return bool(getattr(mat, "varying", None) or getattr(aval, "vma", None))


def function_driver(make_scaler: Callable[[], Any], inner: Any, axis_name=None) -> Driver:
    """torch's loop: scaler.scale(loss), unscale_, scaler.step(opt), scaler.update."""

    def init(params: Any) -> dict[str, Any]:
        return {"scaler": make_scaler(), "opt": inner.init(params)}

    def step(params: Any, state: Any, batch: Any) -> tuple[Any, Any]:
        scaler = state["scaler"]
        grads = jax.grad(lambda p: scaler.scale_loss(loss_fn(p, batch)))(params)
        grads = _mean(grads, axis_name)
        grads, found = scaler.unscale_and_check(grads)
        params, opt = optimizer_step(inner, grads, state["opt"], params, found)
        return params, {"scaler": scaler.update(found), "opt": opt}

    return Driver(init, step)


def scaler_driver(make_scaler: Callable[[], Any], lr: float, axis_name=None) -> Driver:
    """The README's loop without optax: the operators on a scaler or ScaleState."""

    def step(params: Any, state: Any, batch: Any) -> tuple[Any, Any]:
        grads = jax.grad(lambda p: jas.scale_loss(loss_fn(p, batch), state))(params)
        grads = _mean(grads, axis_name)
        grads, found = jas.unscale_and_check(grads, state)
        params = jax.tree.map(lambda p, g: jnp.where(found, p, p - lr * g), params, grads)
        if isinstance(state, jas.ScaleState):
            return params, jas.update_scale(state, found)
        return params, state.update(found)

    return Driver(lambda params: make_scaler(), step)


# --------------------------------------------------------------- the oracle


@dataclasses.dataclass
class Expected:
    params: dict[str, np.ndarray]
    scales: list[float]  # the scale after each optimizer step
    skipped: int


def _amax_rule(micro_batches: int) -> Callable[[bool, float], float]:
    """amax_scaler's scale after each step (its defaults, `micro_batches`):
    the brute force of tests/_amax_oracle.py, which tries every power of two
    between min_scale and max_scale against the step's amax."""
    brute = amax_oracle.Oracle(amax_oracle.Config(micro_batches=micro_batches))
    return lambda found, amax: brute.step(found, amax)[0]


def _torch_rule(rule: str) -> Callable[[bool], float]:
    """The scale after each step: torch's _amp_update_scale_, or fixed."""
    import torch

    if rule != "dynamic":
        fixed = STATIC_SCALE if rule == "static" else 1.0
        return lambda found: fixed
    scale = torch.tensor([INIT_SCALE], dtype=torch.float32)
    tracker = torch.tensor([0], dtype=torch.int32)

    def advance(found: bool) -> float:
        flag = torch.tensor([1.0 if found else 0.0])
        torch._amp_update_scale_(scale, tracker, flag, 2.0, 0.5, GROWTH_INTERVAL)
        return float(scale[0])

    return advance


def _torch_clip(grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch

    # torch clips the .grad of parameters (a bare tensor would be ignored).
    ps = {}
    for k, v in grads.items():
        ps[k] = torch.zeros(v.shape, dtype=torch.float32, requires_grad=True)
        ps[k].grad = torch.tensor(np.asarray(v, np.float32))
    norm = torch.nn.utils.clip_grad_norm_(list(ps.values()), MAX_NORM)
    CLIPPED.append(float(norm) > MAX_NORM)
    return {k: ps[k].grad.numpy().astype(grads[k].dtype) for k in ps}


CLIPPED: list[bool] = []  # whether each oracle step clipped (tests check some did)


def initial_scale(rule: str) -> float:
    return {"dynamic": INIT_SCALE, "static": STATIC_SCALE, "none": 1.0, "amax": AMAX_INIT}[rule]


def oracle(
    row: Row, bs: list[dict[str, np.ndarray]], dtype: Any = jnp.float32, inner: Any = None
) -> Expected:
    """What the row must return after `bs`, computed without the library
    (`inner`: the plain optimizer the row wraps, default its sgd)."""
    key = None
    if inner is None:  # the common case, memoized: many cells share one oracle
        key = (row.name, jnp.dtype(dtype).name, hashlib.sha1(pickle.dumps(bs)).hexdigest())
        if key in _ORACLES:
            want, clipped = _ORACLES[key]
            CLIPPED.extend(clipped)
            return copy.deepcopy(want)
    first_clip = len(CLIPPED)
    advance_amax = _amax_rule(row.k) if row.rule == "amax" else None
    advance = _torch_rule(row.rule) if advance_amax is None else None
    plain = _plain_jit(row.momentum) if inner is None else jax.jit(partial(_plain_step, inner))
    inner = plain_inner(row.momentum) if inner is None else inner
    params = params0(dtype)
    opt = inner.init(params)
    scale = initial_scale(row.rule)
    scales, skipped = [], 0
    np_dtype = np.dtype(jnp.dtype(dtype))
    for i in range(0, len(bs), row.k):
        window = bs[i : i + row.k]
        # The scaled gradients in the parameters' dtype, summed as torch's .grad.
        with np.errstate(invalid="ignore", over="ignore"):
            total = {k: sum(np_dtype.type(scale) * w[k] for w in window) for k in window[0]}
            found = not all(np.isfinite(v).all() for v in total.values())
            grads = {
                k: ((v / np.float32(row.k)).astype(np_dtype) * np.float32(1 / scale)).astype(
                    np_dtype
                )
                for k, v in total.items()
            }
        if found:
            skipped += 1
        else:
            if row.clip:
                grads = _torch_clip(grads)
            params, opt = plain(params, opt, grads)
        if advance_amax is not None:
            # The amax of the step: the largest finite |value| of the averaged
            # scaled gradients, as the step's pass reads them.
            with np.errstate(invalid="ignore", over="ignore"):
                mean = [(v / np.float32(row.k)).astype(np_dtype) for v in total.values()]
            finite = [np.abs(m[np.isfinite(m)]).astype(np.float64) for m in mean]
            amax = max((float(f.max()) for f in finite if f.size), default=0.0)
            scale = advance_amax(found, amax)
        else:
            scale = advance(found)
        scales.append(scale)
    want = Expected({k: np.asarray(v) for k, v in params.items()}, scales, skipped)
    if key is not None:
        _ORACLES[key] = (copy.deepcopy(want), CLIPPED[first_clip:])
    return want


_ORACLES: dict[tuple, tuple[Expected, list[bool]]] = {}


@functools.cache
def _plain_jit(momentum: bool) -> Callable:
    return jax.jit(partial(_plain_step, plain_inner(momentum)))


def _plain_step(inner: Any, p: Any, o: Any, g: Any) -> tuple[Any, Any]:
    g = jax.tree.map(lambda x, q: jnp.asarray(x, q.dtype), g, p)
    u, o = inner.update(g, o, p)
    return optax.apply_updates(p, u), o


def assert_params(got: Any, want: dict[str, np.ndarray], *, clip: bool = False) -> None:
    for k, w in want.items():
        g = np.asarray(got[k])
        assert g.dtype == w.dtype, (k, g.dtype, w.dtype)
        if clip:  # torch's norm and ours sum in different orders
            np.testing.assert_allclose(
                g.astype(np.float32), w.astype(np.float32), rtol=1e-5, atol=1e-6, err_msg=k
            )
        else:  # the same IEEE operations on the same values: the same bits
            np.testing.assert_array_equal(g, w, err_msg=k)


def run_loop(
    row: Row, step: Callable, params: Any, state: Any, bs: list
) -> tuple[Any, Any, list[float]]:
    """Steps through `bs`; the scale after each optimizer step (each k-th call)."""
    scales = []
    for t, b in enumerate(bs):
        params, state = step(params, state, b)
        if (t + 1) % row.k == 0:
            scales.append(float(np.asarray(scale_of(state)).reshape(-1)[0]))
    return params, state, scales


def check(row: Row, params: Any, state: Any, want: Expected, scales: list | None = None) -> None:
    """The row's result against the oracle: parameters, scale, skipped steps."""
    assert_params(params, want.params, clip=row.clip)
    scale = float(np.asarray(scale_of(state)).reshape(-1)[0])
    assert scale == want.scales[-1], f"scale {scale}, the oracle's {want.scales[-1]}"
    if scales is not None:
        assert scales == want.scales, f"scales {scales}, the oracle's {want.scales}"
    skipped = skipped_of(state)
    if skipped is not None:
        got = int(skipped)
        assert got == want.skipped, f"skipped_steps {got}, the oracle's {want.skipped}"


# --------------------------------------------------------------- the columns

OPTAX_ONLY = "n/a: not an optax transformation"
NO_CONFIG = "n/a: no transformation holds a configuration"


@dataclasses.dataclass(frozen=True)
class Column:
    """One way a user holds what a row returns.

    where: "here" (this process, one device), "fresh" (a fresh process),
    "devices" (a process with eight devices).  optax_only: only rows that
    are optax transformations (others read ``na``).
    """

    name: str
    where: str = "here"
    na_kinds: tuple[str, ...] = ()
    na_reason: str = OPTAX_ONLY


COLUMNS = [
    Column("jit, state donated"),
    Column("init twice, and after a donation"),
    Column("jax.tree.map(jnp.copy)"),
    Column("copy.deepcopy"),
    Column("pickle"),
    Column("orbax restore, fresh process", "fresh"),
    Column("jax.export, fresh process", "fresh"),
    Column("lax.scan, 1,000 steps"),
    Column("vmap population"),
    Column("shard_map, 8 devices", "devices"),
    Column("pmap, 8 devices", "devices"),
    Column("FSDP NamedSharding, 8 devices", "devices"),
    Column("optax.chain, each position", na_kinds=("trainer", "function", "scaler")),
    Column("optax.inject_hyperparams", na_kinds=("trainer", "function", "scaler")),
    Column("optax.MultiSteps inside", na_kinds=("function", "scaler")),
    Column("optax.MultiSteps around", na_kinds=("trainer", "function", "scaler")),
    Column("optax.apply_if_finite", na_kinds=("trainer", "function", "scaler")),
    Column("flax TrainState", na_kinds=("trainer", "function", "scaler")),
    Column("flax nnx.Optimizer", na_kinds=("trainer", "function", "scaler")),
    Column("equinox filter_jit"),
    Column("float16 params"),
    Column("bfloat16 params"),
    Column("float32 params"),
    Column(
        "state of another configuration",
        na_kinds=("function", "scaler"),
        na_reason=NO_CONFIG,
    ),
]
COLUMN = {c.name: c for c in COLUMNS}

# The documented errors (docs/guide/*, /work decisions): (column, row) -> (type, fragment).
EXPECTED_ERRORS: dict[tuple[str, str], tuple[type[BaseException], str]] = {}
for _r in ROWS:
    if _r.kind == "optax":
        EXPECTED_ERRORS["optax.MultiSteps around", _r.name] = (TypeError, "accumulate_gradients")
        EXPECTED_ERRORS["optax.apply_if_finite", _r.name] = (TypeError, "never backs off")
    if _r.kind in ("optax", "trainer"):
        EXPECTED_ERRORS["state of another configuration", _r.name] = (
            ValueError,
            "drop_overflow_update",
        )


def na(column: Column, row: Row) -> str | None:
    """Why the cell does not apply, or None."""
    # (Trainer(optax.MultiSteps(...)) is a legal optimizer: that cell applies.)
    return column.na_reason if row.kind in column.na_kinds else None


def cells() -> list[tuple[str, str]]:
    """Every (column, row) that applies."""
    return [(c.name, r.name) for c in COLUMNS for r in ROWS if na(c, r) is None]


# One quick cell per in-process holding in the default tier (the rest: slow).
REPRESENTATIVE = "loss_scaled(dynamic_scaler())"
# ("float32 params" is every other cell's dtype: slow tier only.)
DEFAULT_TIER = {
    (c.name, REPRESENTATIVE) for c in COLUMNS if c.where == "here" and c.name != "float32 params"
} | {
    ("jit, state donated", "Trainer"),
    ("jit, state donated", "accumulate_gradients(loss_scaled(...), 2)"),
}
