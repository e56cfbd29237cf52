"""README.md's Python examples, run verbatim (the Ascend one needs a plugin: not here).

Each block runs in a namespace that defines only what the README leaves to
the reader (``params``, ``loss_fn``, ``batch``, the operator's arrays), and
what it builds is then stepped and checked against the rule.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def _block(marker: str) -> str:
    (code,) = [b for b in BLOCKS if marker in b]
    return code


def _reader_namespace(poison: bool = False) -> dict:
    def loss_fn(p, batch):
        return jnp.mean((batch["x"] @ p["w"] + p["b"] - batch["y"]) ** 2)

    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)
    return {
        "params": {"w": jnp.full((4, 1), 0.1, jnp.float32), "b": jnp.zeros((1,), jnp.float32)},
        "loss_fn": loss_fn,
        "batch": {"x": jnp.asarray(x), "y": jnp.asarray(x.sum(1, keepdims=True))},
    }


def _poisoned(batch):
    return {**batch, "x": batch["x"].at[0, 0].set(jnp.inf)}


def test_quick_start_loss_scaled():
    ns = _reader_namespace()
    exec(_block("tx = loss_scaled(optax.adamw(1e-3))"), ns)
    params, opt_state = ns["params"], ns["opt_state"]
    p1, s1 = ns["step"](params, opt_state, ns["batch"])
    assert float(s1.scale) == 2.0**16 and not bool(s1.found_inf)
    assert not np.array_equal(np.asarray(p1["w"]), np.asarray(params["w"]))
    p2, s2 = ns["step"](p1, s1, _poisoned(ns["batch"]))
    assert float(s2.scale) == 2.0**15 and bool(s2.found_inf)
    np.testing.assert_array_equal(np.asarray(p2["w"]), np.asarray(p1["w"]))


def test_trainer_example():
    ns = _reader_namespace()
    exec("import jax, optax\nimport jax_amp_scale as jas\n" + _block("jas.Trainer("), ns)
    # O2 computes in float16: at 2**16 the first backward pass may overflow,
    # which halves the scale and keeps the params (the rule, step by step).
    state, params, metrics = ns["state"], ns["params"], ns["metrics"]
    assert float(metrics["scale"]) == 2.0**16 and np.isfinite(float(metrics["loss"]))
    for _ in range(3):
        used, skipped = float(metrics["scale"]), bool(metrics["skipped"])
        assert float(state.scale) == (used / 2 if skipped else used)
        before = params
        params, state, metrics = ns["step"](params, state, ns["batch"], ns["loss_fn"])
        changed = not np.array_equal(np.asarray(params["w"]), np.asarray(before["w"]))
        assert changed != bool(metrics["skipped"])


def test_pieces_example():
    """The composable pieces: accumulation outside, clipping inside loss_scaled."""
    import jax
    import optax

    import jax_amp_scale as jas
    from jax_amp_scale.optax import ClipGradNormState, get_loss_scaled_state

    ns = _reader_namespace()
    exec(_block("tx = accumulate_gradients("), ns)
    tx, params, opt_state, batch = ns["tx"], ns["params"], ns["opt_state"], ns["batch"]

    @jax.jit
    def micro(params, opt_state, batch):
        grads = jax.grad(lambda p: jas.scale_loss(ns["loss_fn"](p, batch), opt_state))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for _ in range(3):
        p, opt_state = micro(params, opt_state, batch)
        np.testing.assert_array_equal(np.asarray(p["w"]), np.asarray(params["w"]))
    p, opt_state = micro(params, opt_state, batch)  # the 4th call steps
    assert not np.array_equal(np.asarray(p["w"]), np.asarray(params["w"]))
    ls = get_loss_scaled_state(opt_state)
    assert int(ls.total_steps) == 1 and int(ls.skipped_steps) == 0
    assert float(ls.inner_state[0].norm) > 0 and isinstance(ls.inner_state[0], ClipGradNormState)


def test_operator_example():
    ns = {
        "current_scale": jnp.float32(1024.0),
        "growth_tracker": jnp.int32(0),
        "found_inf": True,
    }
    exec("import jax.numpy as jnp\nimport jax_amp_scale as jas\n" + _block("amp_update_scale"), ns)
    assert float(ns["state"].scale) == 2.0**15 and int(ns["state"].growth_tracker) == 0
    assert float(ns["scale"]) == 512.0 and int(ns["tracker"]) == 0


def test_core_api_step():
    ns = _reader_namespace()
    exec(_block("def train_step("), ns)
    params, state = ns["params"], ns["state"]
    p1, s1 = ns["train_step"](params, state, ns["batch"])
    assert float(s1.scale) == 2.0**16 and int(s1.growth_tracker) == 1
    assert not np.array_equal(np.asarray(p1["w"]), np.asarray(params["w"]))
    p2, s2 = ns["train_step"](p1, s1, _poisoned(ns["batch"]))
    assert float(s2.scale) == 2.0**15 and int(s2.growth_tracker) == 0
    np.testing.assert_array_equal(np.asarray(p2["w"]), np.asarray(p1["w"]))
