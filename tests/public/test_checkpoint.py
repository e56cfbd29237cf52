"""Whole training states save and restore (orbax, flax msgpack, npz) and continue bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_amp_scale as jas
from jax_amp_scale.interop import from_state_dict, to_state_dict

optax = pytest.importorskip("optax")


def loss_fn(p, b):
    h = jnp.tanh(b["x"] @ p["dense"]["kernel"]) * p["norm"]["scale"]
    return jnp.mean((h.sum(-1).astype(jnp.float32) - b["y"]) ** 2)


def batches(n):
    rng = np.random.default_rng(1)
    out = []
    for t in range(n):
        x = rng.standard_normal((8, 4)).astype(np.float32)
        y = x.sum(-1).astype(np.float32)
        if t in (3, 9):
            y[0] = np.inf  # overflow steps: skipped, scale backs off
        out.append({"x": x, "y": y})
    return out


def make():
    params = {
        "dense": {
            "kernel": jnp.asarray(np.random.default_rng(0).standard_normal((4, 3)), jnp.float32)
        },
        "norm": {"scale": jnp.ones(3, jnp.float32)},
    }
    kind = jas.dynamic_scaler(
        2.0**8, growth_interval=3, min_scale=1.0, hysteresis=2, dtype=jnp.bfloat16
    )
    inner = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))
    trainer = jas.Trainer(inner, kind, policy=jas.get_policy("O2"))
    return trainer, params, trainer.init(params)


def run(trainer, params, state, bs):
    step = jax.jit(trainer.step, static_argnums=3)
    for b in bs:
        params, state, _ = step(params, state, b, loss_fn)
    return params, state


def assert_bitwise(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


@pytest.fixture(scope="module")
def midway():
    trainer, params, state = make()
    bs = batches(16)
    params, state = run(trainer, params, state, bs[:8])
    final = run(trainer, params, state, bs[8:])
    return trainer, params, state, bs[8:], final


def check_continues(midway, restored_params, restored_state):
    trainer, params, state, rest, final = midway
    assert_bitwise((restored_params, restored_state), (params, state))
    again = run(trainer, restored_params, restored_state, rest)
    assert_bitwise(again, final)
    ls = again[1]
    assert int(ls.skipped_steps) == 2 and int(ls.total_steps) == 16


def test_npz_roundtrip(midway, tmp_path):
    _, params, state, _, _ = midway
    sd = to_state_dict({"params": params, "opt": state})
    flat = {}

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, prefix + k + "/")
            else:
                flat[prefix + k] = v

    walk(sd, "")
    path = tmp_path / "ckpt.npz"
    # bfloat16 is stored as raw bits with its dtype name
    np.savez(
        path, **{k: v.view(np.uint16) if v.dtype == jnp.bfloat16 else v for k, v in flat.items()}
    )
    loaded = np.load(path)
    target = to_state_dict({"params": params, "opt": state})

    def rebuild(node, prefix):
        out = {}
        for k, v in node.items():
            if isinstance(v, dict):
                out[k] = rebuild(v, prefix + k + "/")
            else:
                a = loaded[prefix + k]
                out[k] = a.view(jnp.bfloat16) if v.dtype == jnp.bfloat16 else a
        return out

    _, _, fresh_state = make()
    r = from_state_dict({"params": params, "opt": fresh_state}, rebuild(target, ""))
    check_continues(midway, r["params"], r["opt"])


def test_flax_msgpack_roundtrip(midway):
    serialization = pytest.importorskip("flax.serialization")
    _, params, state, _, _ = midway
    blob = serialization.msgpack_serialize(to_state_dict({"params": params, "opt": state}))
    _trainer, fresh_params, fresh_state = make()
    r = from_state_dict(
        {"params": fresh_params, "opt": fresh_state}, serialization.msgpack_restore(blob)
    )
    check_continues(midway, r["params"], r["opt"])


def test_orbax_roundtrip(midway, tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    _, params, state, _, _ = midway
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "ckpt", {"params": params, "opt": state})
    ckpt.wait_until_finished()
    _, fresh_params, fresh_state = make()
    target = jax.tree_util.tree_map(
        ocp.utils.to_shape_dtype_struct, {"params": fresh_params, "opt": fresh_state}
    )
    r = ckpt.restore(tmp_path / "ckpt", target)
    check_continues(midway, r["params"], r["opt"])


def test_from_state_dict_errors(midway):
    _, _params, state, _, _ = midway
    sd = to_state_dict(state)
    del sd["total_steps"]
    with pytest.raises(ValueError, match="total_steps"):
        from_state_dict(state, sd)
    sd = to_state_dict(state)
    sd["skipped_steps"] = np.float32(0)
    with pytest.raises(ValueError, match=r"skipped_steps.*int32"):
        from_state_dict(state, sd)


def test_to_state_dict_keys_that_become_the_same_string():
    # Before: the second leaf silently overwrote the first, a sub-tree and a
    # leaf crashed (IndexError), or two sub-trees were merged into one dict.
    # (A plain dict cannot mix 1 and "1": JAX cannot sort its keys.)
    from collections import OrderedDict

    x, y = np.float32(1), np.float32(2)
    trees = [
        OrderedDict([(1, x), ("1", y)]),
        OrderedDict([(1, {"a": x}), ("1", y)]),
        OrderedDict([("1", x), (1, {"a": y})]),
        OrderedDict([(1, {"a": x}), ("1", {"b": y})]),
    ]
    for tree in trees:
        with pytest.raises(
            ValueError,
            match=r"to_state_dict: keys (1 and .1.|.1. and 1) at the top level both become .1.",
        ):
            to_state_dict(tree)
    nested = {"opt": [OrderedDict([(1, x), ("1", y)])]}
    with pytest.raises(ValueError, match=r"keys 1 and '1' at \['opt'\]\[0\] both become '1'"):
        to_state_dict(nested)
    # Keys that stay distinct are unchanged.
    assert to_state_dict(OrderedDict([(1, x), ("2", y)])) == {"1": x, "2": y}
