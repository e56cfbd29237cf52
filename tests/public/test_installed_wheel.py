"""Smoke test of the installed package: what a user of the wheel gets.

.ci/run copies this file out of the checkout and runs it against the wheel
installed into a fresh environment that has no compiler and no CMake, with
``JAS_EXPECT_INSTALLED=1`` (then the package must come from site-packages,
not from a source tree).  In the ordinary test run it checks the same
things against the development install.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re
import sysconfig

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_amp_scale as jas
from jax_amp_scale.mechanisms import handlers

PACKAGE = pathlib.Path(jas.__file__).resolve().parent

# The native modules are compiled against the OLDEST supported jaxlib's XLA
# FFI headers (pyproject.toml's [build-system] pins jaxlib==0.6.0), which
# stamp the API version into every handler; newer jaxlibs accept older
# stamps, not newer ones.  jaxlib 0.6.0's xla/ffi/api/c_api.h defines
# XLA_FFI_API_MAJOR 0 and XLA_FFI_API_MINOR 1 (jaxlib 0.10.2's: 0 and 3).
OLDEST_JAXLIB = "0.6.0"
OLDEST_FFI_API = (0, 1)


def test_installed_from_site_packages():
    if os.environ.get("JAS_EXPECT_INSTALLED") != "1":
        pytest.skip("set JAS_EXPECT_INSTALLED=1 to check an installed wheel")
    site = {pathlib.Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    assert any(PACKAGE.is_relative_to(s) for s in site), PACKAGE
    assert not (PACKAGE.parent / "CMakeLists.txt").exists()  # not a checkout
    # Only the extension modules that users run: no test-only one.
    assert not list(PACKAGE.glob("_ascend_testing*"))


def test_version_has_one_source():
    assert jas.__version__ == importlib.metadata.version("jax-amp-scale")


def test_typed_package():
    assert (PACKAGE / "py.typed").is_file()


def test_native_cpu_module_serves_auto():
    handlers.platforms(handlers.UPDATE_SCALE)  # loads the modules, recording any failure
    assert "cpu" not in handlers.LOAD_ERRORS, handlers.LOAD_ERRORS
    assert jas.available_backends("cpu") == ("reference", "ffi")
    assert jas.auto_backend("cpu") == "ffi"


def test_a_training_step_agrees_on_both_backends():
    params = {"w": jnp.full((4, 1), 0.1, jnp.float32)}
    x = jnp.linspace(-1, 1, 32, dtype=jnp.float32).reshape(8, 4)
    y = x.sum(1, keepdims=True)

    def step(params, state, x, backend):
        def loss(p):
            return jas.scale_loss(jnp.mean((x @ p["w"] - y) ** 2), state)

        grads = jax.grad(loss)(params)
        grads, found_inf = jas.unscale_and_check(grads, state, backend=backend)
        params = jax.tree.map(lambda p, g: jnp.where(found_inf, p, p - 0.1 * g), params, grads)
        return params, jas.update_scale(state, found_inf, backend=backend), found_inf

    state = jas.init_scale_state(init_scale=2.0**16, growth_interval=1)
    for backend in ("ffi", "reference"):
        p1, s1, f1 = jax.jit(step, static_argnums=3)(params, state, x, backend)
        assert not bool(f1) and float(s1.scale) == 2.0**17
        bad = x.at[0, 0].set(jnp.inf)
        p2, s2, f2 = jax.jit(step, static_argnums=3)(p1, s1, bad, backend)
        assert bool(f2) and float(s2.scale) == 2.0**16
        np.testing.assert_array_equal(np.asarray(p2["w"]), np.asarray(p1["w"]))
        if backend == "ffi":
            native_w = np.asarray(p1["w"])
        else:
            np.testing.assert_array_equal(np.asarray(p1["w"]), native_w)


def _header_ffi_api(jaxlib_dir: pathlib.Path) -> tuple[int, int] | None:
    header = jaxlib_dir / "include" / "xla" / "ffi" / "api" / "c_api.h"
    if not header.is_file():
        return None
    text = header.read_text()
    major, minor = (
        int(re.search(rf"#define XLA_FFI_API_{part}\s+(\d+)", text).group(1))
        for part in ("MAJOR", "MINOR")
    )
    return major, minor


def test_native_module_carries_the_oldest_jaxlibs_ffi_api_version():
    """A module stamped with a newer jaxlib's version would be refused by older jaxlibs."""
    import jaxlib

    from jax_amp_scale import _native_cpu

    stamp = _native_cpu.ffi_api_version()
    # The running jaxlib's own headers: the same version on the oldest
    # jaxlib (CI's oldest job), a version at least as new on any later one.
    running = _header_ffi_api(pathlib.Path(jaxlib.__file__).parent)
    # A wheel carries the oldest version.  A development install built with
    # --no-build-isolation (the GPU machine's) compiled against the running
    # jaxlib's headers instead, whose version that jaxlib accepts.
    built_here = os.environ.get("JAS_EXPECT_INSTALLED") != "1" and stamp == running
    assert stamp == OLDEST_FFI_API or built_here, (stamp, running)
    if running is None:
        pytest.skip("this jaxlib ships no XLA FFI headers")
    if jaxlib.__version__ == OLDEST_JAXLIB:
        assert running == OLDEST_FFI_API
    else:
        assert running >= OLDEST_FFI_API
