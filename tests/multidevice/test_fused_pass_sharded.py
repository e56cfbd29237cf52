"""The native passes with eight devices: each device works on its own shards.

Under ``jit`` with sharded operands (auto and explicit axes, a 1-D FSDP
layout, a 2-D data x model mesh, replicated; Shardy and GSPMD) the fused
gradient pass runs the native handler on each device's local shards, the
flag is OR-reduced with one scalar all-reduce, the outputs keep the
operands' shardings, and no gradient is gathered, exchanged or permuted.
The bits are the reference's on every device.  `update_scale` on a
replicated state stays local; a population sharded on its batch axis is
updated where it lies (tests/multidevice/test_sharded_population.py).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_amp_scale as jas
from jax_amp_scale.operators.unscale_and_check import reference_pass
from tests.jax_compat import BEFORE_0_7, EXPLICIT_NATIVE_PASS, set_mesh, shard_map

MODES = [AxisType.Auto, AxisType.Explicit]
DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16]
SHAPES = [(16, 8), (16,), (8, 16)]

# layout -> (mesh shape, axis names, one spec per leaf of SHAPES)
LAYOUTS = {
    "fsdp": ((8,), ("d",), [P("d", None), P("d"), P(None, "d")]),
    "data_model": ((4, 2), ("data", "model"), [P("data", "model"), P("model"), P()]),
    "replicated": ((8,), ("d",), [P(), P(), P()]),
}

_COLLECTIVE = re.compile(
    r"= (\S+) (all-reduce|all-gather|reduce-scatter|all-to-all|ragged-all-to-all|"
    r"collective-permute|collective-broadcast)(?:-start)?\("
)


def collectives(text):
    """(result type, op) of every collective in compiled HLO text."""
    return [(m.group(1), m.group(2)) for m in _COLLECTIVE.finditer(text)]


def _is_scalar(hlo_type):
    return re.fullmatch(r"\(?\w+\[\](\{\})?\)?", hlo_type) is not None


def _grads(bad=None):
    rng = np.random.default_rng(3)
    out = []
    for k, (shape, dtype) in enumerate(zip(SHAPES, DTYPES, strict=True)):
        x = (rng.standard_normal(shape) * 100).astype(np.float32)
        if bad is not None and bad[0] == k:
            x[bad[1]] = bad[2]
        out.append(jnp.asarray(x, dtype))
    return out


def _bits(x):
    x = np.asarray(x)
    return x.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[x.dtype.itemsize])


def _put(leaves, mesh, specs):
    return [jax.device_put(x, NamedSharding(mesh, s)) for x, s in zip(leaves, specs, strict=True)]


def _pass(backend):
    def run(inv, leaves):
        out, found = jas.unscale_and_check(leaves, jnp.float32(1.0) / inv, backend=backend)
        return found, out

    return run


# An overflow in one shard of one leaf (the last device's rows, say), a NaN,
# a finite value that overflows only once unscaled (scale < 1), and none.
# The last two widen the grid: the slow tier.
SLOW = pytest.mark.slow
CASES = [
    pytest.param("none", None, 0.5, id="none"),
    pytest.param("inf", (0, (15, 7), np.inf), 0.5, id="inf"),
    pytest.param("nan", (2, (0, 15), np.nan), 0.5, id="nan", marks=SLOW),
    pytest.param("unscaled_overflow", (1, (9,), 6e4), 4.0, id="unscaled_overflow", marks=SLOW),
]


@pytest.mark.parametrize(("case", "bad", "inv"), CASES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_each_device_unscales_its_shards(partitioner, mode, layout, case, bad, inv, request):
    if BEFORE_0_7 and mode == AxisType.Explicit and layout != "replicated":
        request.applymarker(
            pytest.mark.xfail(strict=True, raises=ValueError, reason=EXPLICIT_NATIVE_PASS)
        )
    shape, names, specs = LAYOUTS[layout]
    mesh = jax.make_mesh(shape, names, axis_types=(mode,) * len(names))
    leaves = _grads(bad)
    want_found, want = jax.jit(reference_pass)(jnp.float32(inv), leaves)
    with set_mesh(mesh):
        sharded = _put(leaves, mesh, specs)
        step = jax.jit(_pass("ffi"))
        text = step.lower(jnp.float32(inv), sharded).compile().as_text()
        found, out = step(jnp.float32(inv), sharded)
    # Compiled program: the native call on local shapes, nothing gathered,
    # one scalar all-reduce for the flag (none when nothing is sharded).
    assert "jas_unscale_and_check" in text
    ops = collectives(text)
    assert all(op == "all-reduce" and _is_scalar(t) for t, op in ops), ops
    assert len(ops) == (0 if layout == "replicated" else 1), ops
    # Bits: the reference's, on every device; the shardings are kept.
    assert bool(found) == bool(want_found) == (case != "none")
    assert found.sharding.is_fully_replicated
    for y, w, s in zip(out, want, specs, strict=True):
        assert y.sharding.is_equivalent_to(NamedSharding(mesh, s), y.ndim), (y.sharding, s)
        assert len(y.addressable_shards) == 8
        for shard in y.addressable_shards:
            np.testing.assert_array_equal(_bits(shard.data), _bits(np.asarray(w)[shard.index]))


@pytest.mark.parametrize(
    "mode",
    [
        AxisType.Auto,
        pytest.param(
            AxisType.Explicit,
            marks=pytest.mark.xfail(
                BEFORE_0_7, strict=True, raises=AssertionError, reason=EXPLICIT_NATIVE_PASS
            ),
        ),
    ],
    ids=str,
)
def test_auto_prefers_the_partitioned_native_pass(mode):
    assert jax.device_count() == 8
    assert jas.auto_backend("cpu") == "ffi"
    mesh = jax.make_mesh((8,), ("d",), axis_types=(mode,))
    leaves = _grads((0, (3, 3), np.inf))
    with set_mesh(mesh):
        sharded = _put(leaves, mesh, LAYOUTS["fsdp"][2])
        step = jax.jit(_pass("auto"))
        text = step.lower(jnp.float32(0.5), sharded).compile().as_text()
        found, out = step(jnp.float32(0.5), sharded)
    assert "jas_unscale_and_check" in text
    assert [op for _, op in collectives(text)] == ["all-reduce"]
    want_found, want = reference_pass(jnp.float32(0.5), leaves)
    assert bool(found) and bool(want_found)
    for y, w in zip(out, want, strict=True):
        np.testing.assert_array_equal(_bits(y), _bits(w))


def test_update_scale_on_a_replicated_state_stays_local():
    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Auto,))
    rep = NamedSharding(mesh, P())
    state = jax.device_put(jas.init_scale_state(8.0), rep)
    found = jax.device_put(jnp.array(True), rep)
    step = jax.jit(lambda s, f: jas.update_scale(s, f))
    text = step.lower(state, found).compile().as_text()
    assert "jas_update_scale" in text and collectives(text) == []
    out = step(state, found)
    assert out.scale.sharding.is_fully_replicated
    for shard in out.scale.addressable_shards:
        assert float(shard.data) == 4.0


def test_inside_shard_map_each_device_checks_its_shard():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))
    g = jnp.arange(64.0, dtype=jnp.float32).reshape(8, 8).at[5, 3].set(jnp.inf)

    def run(backend):
        def body(g):
            out, found = jas.unscale_and_check(g, jnp.float32(2.0), backend=backend)
            return out, found.reshape(1)

        spec = P("x")
        return jax.jit(shard_map(body, mesh=mesh, in_specs=spec, out_specs=(spec, spec)))(g)

    out, found = run("ffi")
    np.testing.assert_array_equal(np.asarray(found), np.arange(8) == 5)
    for a, b in zip(jax.tree.leaves((out, found)), jax.tree.leaves(run("reference")), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# --- the Ascend path with eight devices (tests/ascend_harness.py) ------------


@pytest.mark.parametrize(
    "mode",
    [
        AxisType.Auto,
        pytest.param(
            AxisType.Explicit,
            marks=pytest.mark.xfail(
                BEFORE_0_7, strict=True, raises=AssertionError, reason=EXPLICIT_NATIVE_PASS
            ),
        ),
    ],
    ids=str,
)
def test_ascend_on_cpu_calls_cann_once_per_local_shard(cann, mode):
    from tests import ascend_harness

    shape, names, specs = LAYOUTS["fsdp"]
    mesh = jax.make_mesh(shape, names, axis_types=(mode,) * len(names))
    leaves = _grads((1, (12,), np.inf))
    want_found, want = jax.jit(reference_pass)(jnp.float32(0.5), leaves)
    cann.logging(True)
    with ascend_harness.ascend_on_cpu(), set_mesh(mesh):
        sharded = _put(leaves, mesh, specs)
        found, out = jax.jit(_pass("auto"))(jnp.float32(0.5), sharded)
        jax.block_until_ready(out)
    gws = [e for e in cann.log() if e["ev"] == "foreach_gws"]
    # One call per device per dtype group, each on that device's shard only.
    assert len(gws) == 8 * len(DTYPES), gws
    assert sorted(e["elements"] for e in gws) == sorted(
        [int(np.prod(s)) // 8 for s in SHAPES] * 8
    ), gws
    assert all(e["n"] == 1 for e in gws)
    assert bool(found) and bool(want_found)
    for y, w in zip(out, want, strict=True):
        for shard in y.addressable_shards:
            np.testing.assert_array_equal(_bits(shard.data), _bits(np.asarray(w)[shard.index]))
