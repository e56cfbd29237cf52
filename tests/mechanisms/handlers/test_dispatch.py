"""What the backend choice puts in the lowered program (one CPU device, this process).

Claims from README.md "Platforms and backends" checked on the program
itself, not on values: which custom call appears, its in-place aliasing,
and what vmap and explicit sharding change.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import jax_amp_scale as jas

GRADS = {"a": jnp.ones((4, 3), jnp.float32), "b": jnp.ones((5,), jnp.float16)}


def _text(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text()


def test_fused_pass_runs_in_place():
    text = _text(lambda g: jas.unscale_and_check(g, 2.0), GRADS)
    (call,) = [line for line in text.splitlines() if "@jas_unscale_and_check" in line]
    # Operand k (k >= 1, after the inverse scale) is aliased to result k.
    aliases = re.findall(r"output_tuple_indices = \[(\d+)\], operand_index = (\d+)", call)
    assert sorted((int(o), int(i)) for o, i in aliases) == [(1, 1), (2, 2)]


def test_update_scale_runs_in_place():
    text = _text(lambda s: jas.update_scale(s, True), jas.init_scale_state())
    (call,) = [line for line in text.splitlines() if "@jas_update_scale" in line]
    aliases = re.findall(r"output_tuple_indices = \[(\d+)\], operand_index = (\d+)", call)
    assert sorted((int(o), int(i)) for o, i in aliases) == [(0, 0), (1, 1)]


def test_under_vmap_the_fused_pass_runs_the_reference():
    batched = jax.tree.map(lambda x: jnp.stack([x, x]), GRADS)
    text = _text(jax.vmap(lambda g: jas.unscale_and_check(g, 2.0)), batched)
    assert "jas_unscale_and_check" not in text
    out, found = jax.jit(jax.vmap(lambda g: jas.unscale_and_check(g, 2.0)))(batched)
    np.testing.assert_array_equal(np.asarray(found), [False, False])
    np.testing.assert_array_equal(np.asarray(out["b"]), np.full((2, 5), 0.5, np.float16))


def test_under_vmap_update_scale_is_one_call_for_the_batch():
    states = jax.tree.map(lambda x: jnp.stack([x] * 3), jas.init_scale_state(8.0))
    step = jax.vmap(lambda s, f: jas.update_scale(s, f))
    text = _text(step, states, jnp.array([True, False, True]))
    assert text.count("@jas_update_scale") == 1
    out = jax.jit(step)(states, jnp.array([True, False, True]))
    np.testing.assert_array_equal(np.asarray(out.scale), [4.0, 8.0, 4.0])


def test_explicitly_sharded_state_runs_natively_and_keeps_its_type():
    # The native call's results carry the state's explicit sharding
    # (operators/update_scale.py, per_element), so "auto" need not avoid it.
    mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))
    one = jas.init_scale_state(8.0, shape=(1,))
    sharding = NamedSharding(mesh, PartitionSpec("x"))
    step = jax.jit(lambda s, f: jas.update_scale(s, f))
    with jax.set_mesh(mesh):
        state = jax.device_put(one, sharding)
        found = jax.device_put(jnp.array([True]), sharding)
        text = step.lower(state, found).as_text()
        out = step(state, found)
        assert jax.typeof(out.scale).sharding.spec == PartitionSpec("x")
    assert "jas_update_scale" in text
    np.testing.assert_array_equal(np.asarray(out.scale), [4.0])


def test_auto_follows_the_dispatch_tables_only_inside_the_block():
    from jax_amp_scale.mechanisms import handlers
    from tests.ascend_harness import dispatch_tables

    before = dict(handlers.AUTO_NATIVE), handlers.CANN_PLATFORMS
    step = lambda s: jas.update_scale(s, True)  # noqa: E731
    state = jas.init_scale_state()
    with dispatch_tables(auto_native={}):
        assert before[1] == handlers.CANN_PLATFORMS
        assert jas.auto_backend("cpu") == "reference"
        assert "jas_update_scale" not in jax.jit(step).lower(state).as_text()
    assert (dict(handlers.AUTO_NATIVE), handlers.CANN_PLATFORMS) == before
    assert jas.auto_backend("cpu") == "ffi"
    assert "jas_update_scale" in jax.jit(step).lower(state).as_text()


def test_an_unknown_op_is_a_value_error_naming_op_and_the_public_operators():
    # Before: available_backends raised a bare KeyError('bogus') and
    # auto_backend answered "reference" for any op it did not know; the
    # internal host report is not one of the documented operators.
    allowed = r"\('update_scale', 'unscale_and_check', 'unscale_check_amax'\)"
    for fn in (jas.available_backends, jas.auto_backend):
        for op in ("bogus", "host_report", 3):
            with pytest.raises(ValueError, match=rf"op must be one of {allowed}, got {op!r}"):
                fn("cpu", op)
