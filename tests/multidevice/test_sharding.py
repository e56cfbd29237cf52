"""One process, many devices: `update_scale` under `jax.jit` with `NamedSharding`.

Params and gradients are sharded over 8 virtual CPU devices (tests/conftest.py),
in data-parallel, fully sharded (ZeRO-3 style, one mesh axis) and fully
sharded x tensor-parallel (two mesh axes) layouts, in both explicit and auto
mesh modes, with both backends.  Under jit the program is global, so the
found_inf of the whole gradient is one value; these tests check that XLA
turns it into a decision every device shares, that the scale state stays
replicated, and that the compiled program pays no collective beyond the
reduction that decision needs.
"""

import functools
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_amp_scale as jas
from tests.jax_compat import BEFORE_0_7, reshard, set_mesh
from tests.multidevice.steps import plain_and_scaled

MODES = [AxisType.Explicit, AxisType.Auto]
BACKENDS = ["reference", "ffi"]
LR = 0.1

# layout -> (mesh shape, axis names, param specs, batch spec)
LAYOUTS = {
    "data_parallel": ((8,), ("data",), {"w": P(), "b": P()}, P("data")),
    "fully_sharded": ((8,), ("data",), {"w": P("data", None), "b": P("data")}, P("data")),
    "fsdp_tp": ((4, 2), ("data", "model"), {"w": P("data", "model"), "b": P("model")}, P("data")),
}
SHARDED_LAYOUTS = ["fully_sharded", "fsdp_tp"]


def _mesh(layout, mode):
    shape, names, _, _ = LAYOUTS[layout]
    return jax.make_mesh(shape, names, axis_types=(mode,) * len(names))


def _put(tree, mesh, specs):
    return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), tree, specs)


def _params(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "w": (0.1 * rng.standard_normal((16, 8))).astype(np.float32),
        "b": (0.1 * rng.standard_normal((8,))).astype(np.float32),
    }


def _batch(seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    y = rng.standard_normal((32, 8)).astype(np.float32)
    return x, y


def _found_inf(grads):
    return ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))


def _apply(state, params, grads, backend):
    """The decision: skip the update and back off on overflow, else step."""
    found = _found_inf(grads)
    new_params = jax.tree.map(lambda p, g: jnp.where(found, p, p - LR * g), params, grads)
    return jas.update_scale(state, found, backend), new_params, found


def _gathered(*params):
    """Fully sharded params are gathered before use (FSDP); a no-op unsharded."""
    if jax.sharding.get_abstract_mesh().empty:
        return params
    return tuple(reshard(p, P()) for p in params)


def _loss(params, x, y):
    # float16 compute, as in O2 mixed precision: the scaled cotangent overflows.
    w, b = (p.astype(jnp.float16) for p in _gathered(params["w"], params["b"]))
    pred = x.astype(jnp.float16) @ w + b
    return jnp.mean((pred.astype(jnp.float32) - y) ** 2)


def _train_step(state, params, x, y, backend):
    grads = jax.grad(lambda p: _loss(p, x, y) * state.scale)(params)
    grads = jax.tree.map(lambda g: g / state.scale, grads)
    return _apply(state, params, grads, backend)


def _plain_step(params, x, y):
    grads = jax.grad(_loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - LR * g, params, grads)


def _assert_sharded_as(x, mesh, spec):
    assert x.sharding.is_equivalent_to(NamedSharding(mesh, spec), x.ndim), (x.sharding, spec)


def _assert_replicated(x, expected):
    assert x.sharding.is_fully_replicated
    values = [np.asarray(s.data) for s in x.addressable_shards]
    assert len(values) == 8
    for v in values:
        np.testing.assert_array_equal(v, expected)


# --- an overflow in one shard makes every device skip ----------------------


@pytest.mark.parametrize("layout", SHARDED_LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize(
    ("leaf", "index", "bad"),
    [
        ("w", (0, 0), np.inf),
        # The other positions and values widen the grid: the slow tier.
        pytest.param("w", (15, 7), np.nan, marks=pytest.mark.slow),
        pytest.param("b", (5,), -np.inf, marks=pytest.mark.slow),
    ],
)
def test_overflow_in_one_shard_makes_every_device_skip(layout, backend, mode, leaf, index, bad):
    mesh = _mesh(layout, mode)
    _, _, specs, _ = LAYOUTS[layout]
    params = _params()
    grads_np = _params(seed=7)
    grads_np[leaf][index] = bad
    state0 = jas.init_scale_state(2.0**10, growth_interval=3)
    with set_mesh(mesh):
        params_d = _put(params, mesh, specs)
        grads_d = _put(grads_np, mesh, specs)
        state_d = jax.device_put(state0, NamedSharding(mesh, P()))
        # The bad value lives in some shards only (one device for w; for b
        # under fsdp_tp, the 4 data-replicas of one model column).
        holders = {
            s.device.id
            for s in grads_d[leaf].addressable_shards
            if not np.all(np.isfinite(np.asarray(s.data)))
        }
        assert 1 <= len(holders) <= 4
        state, new_params, found = jax.jit(_apply, static_argnums=3)(
            state_d, params_d, grads_d, backend
        )
    _assert_replicated(found, True)
    _assert_replicated(state.scale, np.float32(512.0))
    _assert_replicated(state.growth_tracker, np.int32(0))
    for name, spec in specs.items():
        _assert_sharded_as(new_params[name], mesh, spec)
        # Skipped on every device: every shard is bit for bit the old one.
        for s in new_params[name].addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), params[name][s.index])


@pytest.mark.parametrize("layout", SHARDED_LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_finite_step_updates_every_shard(layout, backend, mode):
    mesh = _mesh(layout, mode)
    _, _, specs, _ = LAYOUTS[layout]
    params, grads = _params(), _params(seed=7)
    with set_mesh(mesh):
        state, new_params, found = jax.jit(_apply, static_argnums=3)(
            jax.device_put(
                jas.init_scale_state(2.0**10, growth_interval=3), NamedSharding(mesh, P())
            ),
            _put(params, mesh, specs),
            _put(grads, mesh, specs),
            backend,
        )
    _assert_replicated(found, False)
    _assert_replicated(state.scale, np.float32(1024.0))
    _assert_replicated(state.growth_tracker, np.int32(1))
    for name in params:
        np.testing.assert_allclose(
            np.asarray(new_params[name]), params[name] - np.float32(LR) * grads[name], rtol=1e-6
        )


# --- a short training run: sharded equals unsharded -------------------------


def _run(step, state, params, x, y, n):
    trace = []
    for _ in range(n):
        state, params, found = step(state, params, x, y)
        trace.append((bool(found), float(state.scale), int(state.growth_tracker)))
    return trace, state, params


# 2**20 overflows the float16 cotangents: the run backs off until the step
# is finite, grows every 2 finite steps, and overflows again.
_TRAIN_STATE0 = jas.init_scale_state(2.0**20, growth_interval=2)
_TRAIN_STEPS = 10


@functools.cache
def _single_device_run():
    return _run(
        jax.jit(lambda *a: _train_step(*a, "reference")),
        _TRAIN_STATE0,
        _params(),
        *_batch(),
        _TRAIN_STEPS,
    )


def test_single_device_run_backs_off_and_grows():
    # The reference run below is not vacuous: skips and steps, both ways.
    trace, _, _ = _single_device_run()
    founds = [t[0] for t in trace]
    scales = [t[1] for t in trace]
    assert 2 <= sum(founds) <= _TRAIN_STEPS - 4, trace
    assert any(b > a for a, b in itertools.pairwise(scales)), trace


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_sharded_training_matches_single_device(layout, backend, mode):
    state0, params, (x, y) = _TRAIN_STATE0, _params(), _batch()
    want_trace, want_state, want_params = _single_device_run()

    mesh = _mesh(layout, mode)
    _, _, specs, batch_spec = LAYOUTS[layout]
    with set_mesh(mesh):
        trace, state, new_params = _run(
            jax.jit(lambda *a: _train_step(*a, backend)),
            jax.device_put(state0, NamedSharding(mesh, P())),
            _put(params, mesh, specs),
            jax.device_put(x, NamedSharding(mesh, batch_spec)),
            jax.device_put(y, NamedSharding(mesh, batch_spec)),
            _TRAIN_STEPS,
        )
    assert trace == want_trace
    _assert_replicated(state.scale, np.asarray(want_state.scale))
    _assert_replicated(state.growth_tracker, np.asarray(want_state.growth_tracker))
    for name, spec in specs.items():
        _assert_sharded_as(new_params[name], mesh, spec)
        # Reduction order differs between layouts; the decisions may not.
        np.testing.assert_allclose(
            np.asarray(new_params[name]), np.asarray(want_params[name]), rtol=2e-3, atol=1e-5
        )


# --- the compiled program: one reduction for the decision, nothing else -----

_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%\S+ = (.+?) "
    r"(all-reduce|all-gather|reduce-scatter|all-to-all|ragged-all-to-all|"
    r"collective-permute|collective-broadcast)(?:-start)?\(",
    re.MULTILINE,
)


def _collectives(fn, *args):
    """(result type, op) of every collective in the compiled HLO of `fn`.

    A combined collective's tuple type is written with its element types
    sorted: XLA's combiner does not keep one order from program to program.
    """
    text = jax.jit(fn).lower(*args).compile().as_text()
    out = []
    for m in _COLLECTIVE.finditer(text):
        parts = sorted(re.findall(r"\w+\[[^\]]*\](?:\{[^}]*\})?", m.group(1)))
        out.append(("(" + ", ".join(parts) + ")", m.group(2)))
    return out


def _is_scalar_all_reduce(collective):
    result_type, op = collective
    dims = re.findall(r"\w+\[([^\]]*)\]", result_type)
    return op == "all-reduce" and bool(dims) and all(d == "" for d in dims)


def test_collective_parser_sees_a_gather():
    # Guards the HLO checks below against a parser that finds nothing.
    mesh = _mesh("fully_sharded", AxisType.Auto)
    x = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("data")))
    with set_mesh(mesh):
        found = _collectives(
            lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P())) * 2, x
        )
    assert [op for _, op in found] == ["all-gather"]
    assert not _is_scalar_all_reduce(found[0])


# Reductions XLA emits for the decision: one (combined over all leaves) per
# mesh axis the gradients are sharded over; none when they are replicated.
DECISION_REDUCTIONS = {"data_parallel": 0, "fully_sharded": 1, "fsdp_tp": 2}
# The native pass partitioned (lowering/partitioning.py): one all-reduce of
# the flag over every sharded axis at once.
NATIVE_DECISION_REDUCTIONS = {"data_parallel": 0, "fully_sharded": 1, "fsdp_tp": 1}


def _assert_decision_only(extra, layout, native=False):
    """`extra` (collectives beyond the plain step's) is the decision alone:
    scalar all-reduces, as many as DECISION_REDUCTIONS says.  jax < 0.7's
    XLA does not combine the per-leaf ones (2 and 3 of them here, for
    fully_sharded and fsdp_tp: at most one per leaf per sharded axis)."""
    assert all(_is_scalar_all_reduce(c) for c in extra), extra
    if native:
        # jax < 0.7's GSPMD may place the pass after the gradients' own
        # all-reduce, on replicated gradients: then no reduction is needed.
        want = NATIVE_DECISION_REDUCTIONS[layout]
        assert len(extra) == want or (BEFORE_0_7 and len(extra) < want), extra
        return
    want = DECISION_REDUCTIONS[layout]
    if BEFORE_0_7:
        assert want <= len(extra) <= want * len(_params()), extra
    else:
        assert len(extra) == want, extra


def _apply_library(state, params, grads, backend):
    """The decision with the library's helpers: unscale_and_check, update_scale."""
    grads, found = jas.unscale_and_check(grads, state)
    new_params = jax.tree.map(lambda p, g: jnp.where(found, p, p - LR * g), params, grads)
    return jas.update_scale(state, found, backend), new_params, found


@pytest.mark.parametrize(
    "apply",
    [pytest.param(_apply, marks=pytest.mark.slow), _apply_library],
    ids=["by_hand", "library"],
)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_decision_compiles_to_one_scalar_reduction(layout, backend, mode, apply):
    mesh = _mesh(layout, mode)
    _, _, specs, _ = LAYOUTS[layout]
    with set_mesh(mesh):
        args = (
            jax.device_put(jas.init_scale_state(), NamedSharding(mesh, P())),
            _put(_params(), mesh, specs),
            _put(_params(seed=7), mesh, specs),
        )
        found = _collectives(lambda s, p, g: apply(s, p, g, backend), *args)
    # The library's unscale_and_check takes "auto": the native pass on CPU.
    native = apply is _apply_library and (mode == AxisType.Auto or not BEFORE_0_7)
    _assert_decision_only(found, layout, native=native)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_loss_scaling_adds_only_the_decision_to_a_training_step(layout, backend, mode):
    mesh = _mesh(layout, mode)
    _, _, specs, batch_spec = LAYOUTS[layout]
    x, y = _batch()
    with set_mesh(mesh):
        params = _put(_params(), mesh, specs)
        x = jax.device_put(x, NamedSharding(mesh, batch_spec))
        y = jax.device_put(y, NamedSharding(mesh, batch_spec))
        state = jax.device_put(jas.init_scale_state(), NamedSharding(mesh, P()))
        plain = _collectives(_plain_step, params, x, y)
        scaled = _collectives(lambda *a: _train_step(*a, backend), state, params, x, y)
    assert plain, "the gradient itself needs collectives"
    extra = list(scaled)
    for c in plain:
        extra.remove(c)  # ValueError: scaling changed a gradient collective
    _assert_decision_only(extra, layout)


# --- the optax wrapper under jit with shardings ------------------------------


def _optax_steps(backend):
    optax = pytest.importorskip("optax")
    import jax_amp_scale.optax

    inner = optax.sgd(LR)
    tx = jax_amp_scale.optax.loss_scaled(
        inner, jas.dynamic_scaler(2.0**10, growth_interval=3), backend=backend
    )

    return inner, tx, *plain_and_scaled(_loss, inner, tx)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_loss_scaled_under_sharding(layout, backend, mode):
    inner, tx, plain, scaled = _optax_steps(backend)
    mesh = _mesh(layout, mode)
    _, _, specs, batch_spec = LAYOUTS[layout]
    x, y = _batch()
    x_bad = x.copy()
    x_bad[3, 0] = np.inf  # one example, on one device's rows
    with set_mesh(mesh):
        params = _put(_params(), mesh, specs)
        put = lambda a: jax.device_put(a, NamedSharding(mesh, batch_spec))  # noqa: E731
        x, x_bad, y = put(x), put(x_bad), put(y)
        opt_state = jax.device_put(tx.init(params), NamedSharding(mesh, P()))
        step = jax.jit(scaled)
        bad_params, bad_state = step(params, opt_state, x_bad, y)
        ok_params, ok_state = step(bad_params, bad_state, x, y)
        extra = list(_collectives(scaled, params, opt_state, x, y))
        for c in _collectives(plain, params, inner.init(params), x, y):
            extra.remove(c)
    native = backend == "ffi" and (mode == AxisType.Auto or not BEFORE_0_7)
    _assert_decision_only(extra, layout, native=native)
    # The overflow step is skipped on every device; the next one is not.
    for name, spec in specs.items():
        _assert_sharded_as(bad_params[name], mesh, spec)
        for s in bad_params[name].addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), _params()[name][s.index])
        assert not np.array_equal(np.asarray(ok_params[name]), _params()[name])
    _assert_replicated(bad_state.scale_state.scale, np.float32(512.0))
    _assert_replicated(ok_state.scale_state.scale, np.float32(512.0))
    _assert_replicated(ok_state.scale_state.growth_tracker, np.int32(1))
    _assert_replicated(ok_state.skipped_steps, np.int32(1))
    _assert_replicated(ok_state.total_steps, np.int32(2))
    _assert_replicated(ok_state.found_inf, False)
