"""`watch_amax` on eight devices: a shared probe's gradient is the max over the
devices (a pmax in the backward pass under shard_map's varying-axes checking;
XLA's own reduction under jit), a per-device probe's each device's own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_amp_scale as jas
from tests.jax_compat import BEFORE_0_7, GRAD_OF_VARYING_LOSS, shard_map

NO_VMA = "jax < 0.7 has no varying-axes types: a shared probe's gradient is a sum there"


def _data():
    x = jnp.arange(32.0).reshape(8, 4) - 5.0
    w = jnp.linspace(-1.0, 1.0, 32).reshape(8, 4) * 3.0
    w = w.at[2, 1].set(jnp.inf).at[5, 3].set(jnp.nan)  # left out of the amax
    finite = np.asarray(w)[np.isfinite(np.asarray(w))]
    return x, w, np.float32(np.abs(finite).max())


def _mesh():
    return jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))


def _local(x, w, p):
    return jnp.sum(jas.watch_amax(x, p) * w)


@pytest.mark.skipif(BEFORE_0_7, reason=NO_VMA)
def test_shard_map_shared_probe_is_the_max_over_devices():
    x, w, want = _data()
    f = shard_map(
        lambda x, w, p: jax.lax.psum(_local(x, w, p), "data"),
        mesh=_mesh(),
        in_specs=(P("data"), P("data"), P()),
        out_specs=P(),
    )
    assert float(jax.jit(jax.grad(f, argnums=2))(x, w, jnp.float32(0))) == want
    # jax.grad inside the shard_map: the same
    g = shard_map(
        jax.grad(_local, argnums=2),
        mesh=_mesh(),
        in_specs=(P("data"), P("data"), P()),
        out_specs=P(),
    )
    assert float(jax.jit(g)(x, w, jnp.float32(0))) == want


def test_shard_map_unchecked_sums_the_devices_amaxes_as_documented():
    x, w, _ = _data()
    f = shard_map(
        lambda x, w, p: jax.lax.psum(_local(x, w, p), "data"),
        mesh=_mesh(),
        in_specs=(P("data"), P("data"), P()),
        out_specs=P(),
        check_vma=False,
    )
    rows = np.abs(np.asarray(w))
    want = sum(np.float32(r[np.isfinite(r)].max()) for r in rows)
    got = float(jax.jit(jax.grad(f, argnums=2))(x, w, jnp.float32(0)))
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.xfail(BEFORE_0_7, reason=GRAD_OF_VARYING_LOSS, strict=True)
def test_shard_map_per_device_probes_are_each_devices_own():
    x, w, _ = _data()
    f = shard_map(
        lambda x, w, p: jax.grad(_local, argnums=2)(x, w, p[0])[None],
        mesh=_mesh(),
        in_specs=(P("data"), P("data"), P("data")),
        out_specs=P("data"),
    )
    rows = np.abs(np.asarray(w))
    want = [r[np.isfinite(r)].max() for r in rows]
    np.testing.assert_array_equal(jax.jit(f)(x, w, jnp.zeros(8)), np.float32(want))


def test_jit_with_sharded_operands_is_the_global_max():
    x, w, want = _data()
    put = lambda a: jax.device_put(a, NamedSharding(_mesh(), P("data")))  # noqa: E731
    got = jax.jit(jax.grad(_local, argnums=2))(put(x), put(w), jnp.float32(0))
    assert float(got) == want
