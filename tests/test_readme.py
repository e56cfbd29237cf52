"""README.md's Python examples, run verbatim, and its links.

Each block runs in a namespace that defines only what the README leaves to
the reader (``params``, ``loss_fn``, ``batch``), and what it builds is then
stepped and checked against the rule.  The longer examples live in docs/
(tests/test_docs.py runs them).
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


def test_every_python_block_is_tested():
    assert len(BLOCKS) == 2, "a new README block needs a test here"


def test_links_resolve():
    """Every relative link of the front page (into docs/, bench/, ...) exists."""
    root = Path(__file__).resolve().parents[1]
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    relative = [link for link in links if "://" not in link]
    assert relative, "no relative links found"
    missing = [link for link in relative if not (root / link).exists()]
    assert not missing, missing
