"""Data parallelism as torch DDP means it: the update of the mean gradient.

Eight replicas, each with an equal shard of the batch, must make torch's
full-batch update (the mean of the per-replica gradients), in every way JAX
spells data parallelism: ``shard_map`` with varying-axes checking on
(parameters replicated ``P()``, whose gradient JAX returns already summed
over the axis, or already varying), ``check_vma=False``, ``pmap``, and
``jit`` over a sharded batch with no axis name.  Oracle: torch's autograd
on the whole batch (SGD, no overflow), and a NumPy replay of the scale.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_amp_scale.training.replicas import mean_gradients
from tests.jax_compat import BEFORE_0_7, GRAD_OF_VARYING_LOSS, pcast_varying, shard_map

torch = pytest.importorskip("torch")

N = 8
LR = 0.1


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    params = {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": rng.standard_normal((3,)).astype(np.float32),
    }
    x = rng.standard_normal((32, 4)).astype(np.float32)
    y = rng.standard_normal((32, 3)).astype(np.float32)
    return params, x, y


def loss_fn(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def torch_full_batch_grads(params, x, y):
    """torch autograd of the whole batch's loss: what DDP's update averages to."""
    p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    loss = ((torch.tensor(x) @ p["w"] + p["b"] - torch.tensor(y)) ** 2).mean()
    loss.backward()
    return {k: v.grad.numpy() for k, v in p.items()}


def _assert_mean(got, params, x, y):
    want = torch_full_batch_grads(params, x, y)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=2e-5, atol=1e-6)


def _mesh():
    return jax.sharding.Mesh(np.array(jax.devices()[:N]), ("dp",))


VMA_GRAD = pytest.mark.xfail(BEFORE_0_7, reason=GRAD_OF_VARYING_LOSS, strict=True)


def _shard_map_grads(check_vma, varying_params):
    params, x, y = _problem()

    def body(params, x, y):
        if varying_params:
            params = jax.tree.map(lambda p: pcast_varying(p, ("dp",)), params)
        grads = jax.grad(loss_fn)(params, x, y)
        return mean_gradients(grads, "dp")

    run = shard_map(
        body,
        mesh=_mesh(),
        in_specs=(P(), P("dp"), P("dp")),
        out_specs=P(),
        check_vma=check_vma,
    )
    return jax.jit(run)(params, x, y), (params, x, y)


@VMA_GRAD
def test_shard_map_checked_replicated_params():
    # The gradient of a P() parameter comes back summed over "dp": divided,
    # not averaged again (the 8x of issue 23).
    got, problem = _shard_map_grads(check_vma=True, varying_params=False)
    _assert_mean(got, *problem)


@VMA_GRAD
def test_shard_map_checked_varying_params():
    got, problem = _shard_map_grads(check_vma=True, varying_params=True)
    _assert_mean(got, *problem)


def test_shard_map_unchecked():
    got, problem = _shard_map_grads(check_vma=False, varying_params=False)
    _assert_mean(got, *problem)


def test_pmap():
    params, x, y = _problem()
    run = jax.pmap(
        lambda p, x, y: mean_gradients(jax.grad(loss_fn)(p, x, y), "dp"),
        axis_name="dp",
        in_axes=(None, 0, 0),
    )
    got = run(params, x.reshape(N, -1, 4), y.reshape(N, -1, 3))
    _assert_mean(jax.tree.map(lambda g: g[0], got), params, x, y)
    for k in got:  # every replica makes the same update
        assert all(np.array_equal(np.asarray(got[k][0]), np.asarray(r)) for r in got[k])


def test_jit_over_a_sharded_batch_needs_no_axis_name():
    params, x, y = _problem()
    mesh = jax.make_mesh((N,), ("dp",), axis_types=(AxisType.Auto,))
    xs = jax.device_put(x, NamedSharding(mesh, P("dp")))
    ys = jax.device_put(y, NamedSharding(mesh, P("dp")))
    got = jax.jit(lambda p, x, y: mean_gradients(jax.grad(loss_fn)(p, x, y), None))(params, xs, ys)
    _assert_mean(got, params, x, y)


def test_a_loss_already_reduced_over_the_axis_is_refused_at_trace_time():
    params, x, y = _problem()

    def body(params, x, y):
        def reduced(p):
            return jax.lax.pmean(loss_fn(p, x, y), "dp")

        loss, grads = jax.value_and_grad(reduced)(params)
        return mean_gradients(grads, "dp", loss=loss)

    run = shard_map(body, mesh=_mesh(), in_specs=(P(), P("dp"), P("dp")), out_specs=P())
    with pytest.raises(ValueError, match="already reduced over axis 'dp'"):
        jax.jit(run)(params, x, y)
