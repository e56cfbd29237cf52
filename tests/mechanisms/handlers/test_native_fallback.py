"""Without the compiled modules the package imports, and the reference serves.

Each case runs in a fresh interpreter (the native modules load once per
process): once with the user switch JAX_AMP_SCALE_DISABLE_NATIVE=1, once
with the import of the compiled modules made to fail, as it does for an
install whose extension does not load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# Makes the compiled modules unimportable, as in an install that lacks them.
_BLOCK = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.startswith("jax_amp_scale._native"):
            raise ImportError(f"No module named {name!r} (hidden by the test)")
        return None
sys.meta_path.insert(0, _Block())
"""

# What a user does: import, train a step on "auto", ask for "ffi".
_USE = """
import json, warnings
warnings.simplefilter("always")
import numpy as np
import jax, jax.numpy as jnp
with warnings.catch_warnings(record=True) as caught:
    import jax_amp_scale as jas
    from jax_amp_scale.mechanisms import handlers
    imported = [str(w.message) for w in caught]
    state = jas.init_scale_state(init_scale=2.0**16, growth_interval=1)
    grads = {"w": jnp.array([1.0, 2.0]), "b": jnp.array([jnp.inf])}
    out = []
    for _ in range(2):  # the second use must not warn again
        g, found = jax.jit(jas.unscale_and_check)(grads, state)
        state = jax.jit(jas.update_scale)(state, found)
        out.append(float(state.scale))
    ref_state = jas.update_scale(jas.init_scale_state(init_scale=2.0**16, growth_interval=1),
                                 jnp.array(True), backend="reference")
    try:
        jax.jit(lambda s: jas.update_scale(s, jnp.array(False), backend="ffi"))(state)
        ffi = "ran"
    except Exception as e:
        ffi = f"{type(e).__name__}: {e}"
warned = [w for w in caught if issubclass(w.category, RuntimeWarning)]
warned = [w for w in warned if "jax_amp_scale" in str(w.message)]
print(json.dumps({
    "imported": imported,
    "warned": [str(w.message) for w in warned],
    "warned_at": [w.filename for w in warned],
    "backends": jas.available_backends("cpu"),
    "auto": jas.auto_backend("cpu"),
    "scales": out,
    "reference": float(ref_state.scale),
    "ffi": ffi,
    "load_errors": dict(handlers.LOAD_ERRORS),
}))
"""


def _run(prelude: str, **env: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(prelude) + _USE],
        env={**os.environ, "JAX_PLATFORMS": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _common(r: dict) -> None:
    assert r["imported"] == []  # importing says nothing: the first use does
    assert r["backends"] == ["reference"] and r["auto"] == "reference"
    # found_inf halves the scale, on the reference, as the native path does.
    assert r["scales"] == [2.0**15, 2.0**14] and r["reference"] == 2.0**15
    assert r["ffi"].startswith("RuntimeError") and "backend='ffi'" in r["ffi"]


@pytest.mark.slow
@pytest.mark.trimmed
def test_missing_module_warns_once_and_the_reference_serves():
    r = _run(_BLOCK)
    _common(r)
    (message,) = r["warned"]  # one warning, at first use, naming what is missing
    assert r["warned_at"] == ["<string>"]  # pointing at the user's code
    assert "jax_amp_scale._native_cpu could not be loaded" in message
    assert "hidden by the test" in message  # the import error itself
    assert 'backend="auto"' in message and "JAX_AMP_SCALE_DISABLE_NATIVE=1" in message
    assert "_native_cpu" in r["load_errors"]["cpu"]
    assert "_native_cpu" in r["ffi"]


def test_disable_switch_uses_the_reference_silently():
    r = _run("", JAX_AMP_SCALE_DISABLE_NATIVE="1")
    _common(r)
    assert r["warned"] == []
    assert "JAX_AMP_SCALE_DISABLE_NATIVE" in r["load_errors"]["cpu"]


@pytest.mark.slow
@pytest.mark.trimmed
def test_switch_off_keeps_the_native_path():
    from jax_amp_scale.mechanisms import handlers

    if "cpu" not in handlers.platforms("update_scale"):
        pytest.skip("no native CPU module in this process")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import jax_amp_scale as jas; print(jas.auto_backend('cpu'))",
        ],
        env={**os.environ, "JAX_PLATFORMS": "cpu", "JAX_AMP_SCALE_DISABLE_NATIVE": "0"},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert proc.stdout.strip() == "ffi"
