"""A population sharded over eight devices: placement, collectives, shard_map."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_amp_scale as jas
from tests.jax_compat import BEFORE_0_7, VMAP_SELECT_EXPLICIT, set_mesh, shard_map
from tests.population import N, expected_member, population, random_founds, run_population

MODES = [AxisType.Explicit, AxisType.Auto]


OLD_EXPLICIT = pytest.mark.xfail(BEFORE_0_7, reason=VMAP_SELECT_EXPLICIT, strict=True)


def _pop_mesh(mode):
    return jax.make_mesh((8,), ("pop",), axis_types=(mode,))


def _one_step(backend):
    return jax.jit(jax.vmap(lambda s, f: jas.update_scale(s, f, backend)))


@pytest.mark.parametrize(
    ("mode", "backend"),
    [
        pytest.param(AxisType.Explicit, "reference", marks=OLD_EXPLICIT),
        (AxisType.Auto, "reference"),
        (AxisType.Explicit, "ffi"),
        (AxisType.Auto, "ffi"),
    ],
    ids=str,
)
def test_population_sharded_over_devices(mode, backend):
    # Members spread over the mesh (2 per device): the same trajectories.
    states, founds = population(), random_founds(seed=4)[:6]
    want = [expected_member(jax.tree.map(lambda a: a[0], states), founds[:, m]) for m in range(N)]
    step = _one_step(backend)
    mesh = _pop_mesh(mode)
    with set_mesh(mesh):
        states = jax.device_put(states, NamedSharding(mesh, P("pop")))
        for t, found in enumerate(founds):
            states = step(states, jax.device_put(found, NamedSharding(mesh, P("pop"))))
            np.testing.assert_array_equal(np.asarray(states.scale), [w[t][0] for w in want])
            np.testing.assert_array_equal(
                np.asarray(states.growth_tracker), [w[t][1] for w in want]
            )


def _collectives(text):
    ops = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")
    return [line for line in text.splitlines() if any(f" {op}(" in line for op in ops)]


def _stays_sharded(mode, backend):
    mesh = _pop_mesh(mode)
    with set_mesh(mesh):
        sharding = NamedSharding(mesh, P("pop"))
        states = jax.device_put(population(), sharding)
        found = jax.device_put(random_founds(seed=4)[0], sharding)
        out = _one_step(backend)(states, found)
        text = _one_step(backend).lower(states, found).compile().as_text()
    assert out.scale.sharding.is_equivalent_to(sharding, 1), out.scale.sharding
    assert _collectives(text) == []


@pytest.mark.parametrize(
    "mode", [pytest.param(AxisType.Explicit, marks=OLD_EXPLICIT), AxisType.Auto], ids=str
)
def test_sharded_population_stays_sharded_reference(mode):
    _stays_sharded(mode, "reference")


# The native call partitioned per element (lowering/partitioning.py): each
# device updates the members it holds, under jit, with no collective.
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_sharded_population_stays_sharded_ffi(mode):
    _stays_sharded(mode, "ffi")


@pytest.mark.parametrize(
    "backend",
    [
        "reference",
        "ffi",
    ],
)
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_sharded_population_under_shard_map(mode, backend):
    # Each device updates its own members (vmap inside shard_map): no
    # collective, the population stays where it is, and the trajectories are
    # those of the members alone.
    states, founds = population(), random_founds(seed=5)
    want_scales, want_trackers = run_population("reference")(states, founds)
    mesh = _pop_mesh(mode)
    with set_mesh(mesh):
        run = jax.jit(
            shard_map(
                run_population(backend),
                mesh=mesh,
                in_specs=(P("pop"), P(None, "pop")),
                out_specs=P(None, "pop"),
            )
        )
        args = (
            jax.device_put(states, NamedSharding(mesh, P("pop"))),
            jax.device_put(founds, NamedSharding(mesh, P(None, "pop"))),
        )
        scales, trackers = run(*args)
        assert _collectives(run.lower(*args).compile().as_text()) == []
    np.testing.assert_array_equal(np.asarray(scales), np.asarray(want_scales))
    np.testing.assert_array_equal(np.asarray(trackers), np.asarray(want_trackers))
