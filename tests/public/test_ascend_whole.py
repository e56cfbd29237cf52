"""The Ascend path run whole on CPU (``tests/ascend_harness.ascend_on_cpu``).

The public functions (``update_scale(..., backend="auto")``,
``unscale_and_check``, ``loss_scaled``) take exactly the decisions they take
on an Ascend platform (rule choice, guard, the fused pass's calling
convention) and make every CANN call, against the CANN test double, whose
operators follow CANN's published kernels.  Oracle: the same functions with
``backend="reference"`` on plain CPU (the pure-JAX reference): "auto" on
Ascend must give exactly the reference's bits for the same state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jax_amp_scale as jas
from jax_amp_scale.optax import loss_scaled
from tests import ascend_harness
from tests._budget import tiered


def _bits(x):
    x = np.asarray(x)
    return x.view({8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}[x.dtype.itemsize])


def _run(states, found, backend):
    def body(st, f):
        st = jas.update_scale(st, f, backend=backend)
        return st, (st.scale, st.growth_tracker)

    return jax.jit(lambda st: jax.lax.scan(body, st, found)[1])(states)


def _ops(log, kind):
    return [e for e in log if e["ev"] == kind]


CASES = [
    ("cann", 1.1, 0.3, True),
    ("cann", 2.0, 0.5, True),
    ("torch", 2.0, 0.5, True),  # power-of-two factors: the operator serves torch's rule
    ("torch", 1.1, 0.3, False),  # otherwise "auto" plans the reference on Ascend
]


@pytest.mark.parametrize(
    "dtype", tiered([jnp.float32, jnp.float16, jnp.bfloat16], keep=[jnp.float16])
)
@pytest.mark.parametrize(("rule", "gf", "bf", "native"), CASES)
def test_update_scale_auto_on_ascend_is_the_reference_bit_for_bit(
    cann, dtype, rule, gf, bf, native
):
    rng = np.random.default_rng(4)
    found = jnp.asarray(rng.random(40) < 0.2)
    init = {jnp.float32: 3e37, jnp.float16: 2.0**14, jnp.bfloat16: 3e37}[dtype]
    state = jas.init_scale_state(
        init, gf, bf, growth_interval=2, dtype=dtype, shape=(1,), rule=rule
    )
    want = _run(state, found, "reference")
    with ascend_harness.ascend_on_cpu():
        got = _run(state, found, "auto")
    np.testing.assert_array_equal(_bits(got[0]), _bits(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    assert len(_ops(cann.log(), "gws")) == (40 if native else 0)
    # Growth reached the top: the kernel would store inf in float16, the guard keeps it.
    assert np.isfinite(np.asarray(got[0], np.float32)).all()


def test_float16_example_of_the_readme(cann):
    s = jas.init_scale_state(2.0**15, dtype=jnp.float16, shape=(1,), growth_interval=1)
    with ascend_harness.ascend_on_cpu():
        out = jax.jit(lambda s: jas.update_scale(s, False))(s)
    assert float(out.scale[0]) == 2.0**15 and int(out.growth_tracker[0]) == 0
    assert len(_ops(cann.log(), "gws")) == 1


def _grads(rng):
    return {
        "w16": jnp.asarray(rng.standard_normal((8, 5)) * 1e3, jnp.float16),
        "b16": jnp.asarray(rng.standard_normal(7) * 1e3, jnp.bfloat16),
        "w32": jnp.asarray(rng.standard_normal((3, 4)) * 1e3, jnp.float32),
        "empty": jnp.zeros((0,), jnp.float32),
        "step": jnp.int32(3),
    }


@pytest.mark.parametrize("bad", [False, True])
def test_unscale_and_check_on_ascend_is_the_reference_bit_for_bit(cann, bad):
    grads = _grads(np.random.default_rng(6))
    if bad:
        grads["w16"] = grads["w16"].at[2, 3].set(jnp.inf)
    state = jas.init_scale_state(1024.0)
    want = jax.jit(lambda g: jas.unscale_and_check(g, state, backend="reference"))(grads)
    with ascend_harness.ascend_on_cpu():
        got = jax.jit(lambda g: jas.unscale_and_check(g, state))(grads)
    assert bool(got[1]) == bool(want[1]) == bad
    for k in grads:
        np.testing.assert_array_equal(_bits(got[0][k]), _bits(want[0][k]))
    gws = _ops(cann.log(), "foreach_gws")
    assert sorted((e["dtype"], e["n"]) for e in gws) == [(0, 1), (1, 1), (27, 1)]


def test_loss_scaled_steps_on_ascend(cann):
    # The updates loss_scaled hands the inner optimizer (optax.identity: the
    # unscaled gradients themselves) and the scale's course, step by step,
    # through overflow and growth.  (Parameters are not compared: XLA:CPU may
    # contract or reassociate the reference's unscale with the optimizer's
    # arithmetic inside one fusion, which a custom call's result prevents.)
    params = {"w": jnp.full((4, 3), 0.5, jnp.float16), "b": jnp.zeros((3,), jnp.float32)}
    xs = jnp.asarray(np.random.default_rng(8).standard_normal((6, 5, 4)) * 2, jnp.float16)

    def loss(p, x):
        y = (x @ p["w"]).astype(jnp.float32) + p["b"]
        return jnp.mean(y**2)

    def train(backend):
        tx = loss_scaled(
            optax.identity(),
            jas.dynamic_scaler(init_scale=2.0**14, growth_interval=2, dtype=jnp.float16),
            backend=backend,
        )

        def step(s, x):
            g = jax.grad(lambda q: jas.scale_loss(loss(q, x), s))(params)
            u, s = tx.update(g, s, params)
            return s, (u, s.found_inf, s.scale)

        return jax.jit(lambda x: jax.lax.scan(step, tx.init(params), x)[1])(xs)

    want = train("reference")
    with ascend_harness.ascend_on_cpu():
        got = train("auto")
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_array_equal(_bits(g), _bits(w))
    assert np.asarray(want[1]).any() and not np.asarray(want[1]).all()  # both kinds of step
    log = cann.log()
    assert len(_ops(log, "gws")) == 6 and len(_ops(log, "foreach_gws")) == 12
    assert cann.stats()["live_tensors"] == 0 and cann.stats()["live_lists"] == 0


SUBNORMALS = [
    (jnp.float32, float(np.finfo(np.float32).smallest_subnormal)),
    (jnp.float16, float(np.finfo(np.float16).smallest_subnormal)),
    (jnp.bfloat16, 2.0**-133),
]


@pytest.mark.parametrize(("dtype", "tiny"), SUBNORMALS)
def test_subnormal_found_inf_backs_off_on_ascend(cann, dtype, tiny):
    # found_inf reaches the operator as 1/0 in the scale's dtype, decided from
    # its bits (ops/operators.found_to_bool): a subnormal is an overflow
    # eagerly, under jit and under vmap, though XLA:CPU flushes subnormals.
    s = jas.init_scale_state(1024.0, shape=(1,), rule="cann")
    found = jnp.asarray(tiny, dtype)
    assert float(found) != 0.0
    with ascend_harness.ascend_on_cpu():
        eager = jas.update_scale(s, found)
        jitted = jax.jit(lambda s, f: jas.update_scale(s, f))(s, found)
        mapped = jax.vmap(lambda f: jas.update_scale(s, f).scale)(jnp.stack([found, found * 0]))
    assert float(eager.scale[0]) == float(jitted.scale[0]) == 512.0
    np.testing.assert_array_equal(np.asarray(mapped).ravel(), [512.0, 1024.0])
    assert all(e["status"] == 0 for e in _ops(cann.log(), "gws"))
