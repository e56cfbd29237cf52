"""The fused gradient pass with eight devices: shard_map, explicit sharding, "auto"."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

import jax_amp_scale as jas
from jax_amp_scale.training import helpers
from tests.jax_compat import set_mesh


def _check(backend):
    return lambda g, s: jas.unscale_and_check(g, s, backend=backend)


def test_auto_takes_the_reference_when_jit_may_partition():
    assert jax.device_count() == 8
    text = jax.jit(jas.unscale_and_check).lower([jnp.ones(4)], jnp.float32(2.0)).as_text()
    assert "jas_unscale_and_check" not in text
    text = jax.jit(jas.update_scale).lower(jas.init_scale_state(), True).as_text()
    assert "jas_update_scale" not in text
    assert jas.auto_backend("cpu") == "reference"
    assert not helpers.fused_pass_expected([jnp.ones(4)], "auto")


def test_inside_shard_map_each_device_checks_its_shard():
    try:
        from jax import shard_map
    except ImportError:  # jax < 0.7
        from jax.experimental.shard_map import shard_map
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    g = jnp.arange(64.0, dtype=jnp.float32).reshape(8, 8).at[5, 3].set(jnp.inf)

    def run(backend):
        def body(g):
            out, found = jas.unscale_and_check(g, jnp.float32(2.0), backend=backend)
            return out, found.reshape(1)

        spec = PartitionSpec("x")
        return jax.jit(shard_map(body, mesh=mesh, in_specs=spec, out_specs=(spec, spec)))(g)

    out, found = run("ffi")
    np.testing.assert_array_equal(np.asarray(found), np.arange(8) == 5)
    for a, b in zip(jax.tree.leaves((out, found)), jax.tree.leaves(run("reference")), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_ffi_backend_refuses_explicitly_sharded_leaves():
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
    g = jax.device_put(jnp.ones((16,), jnp.float32), NamedSharding(mesh, PartitionSpec("x")))
    with set_mesh(mesh):
        with pytest.raises(ValueError, match="backend='ffi' cannot take explicitly sharded"):
            _check("ffi")([g], jnp.float32(2.0))
        out, found = _check("auto")([g], jnp.float32(2.0))
    np.testing.assert_array_equal(np.asarray(out[0]), np.full(16, 0.5, np.float32))
    assert not bool(found)
