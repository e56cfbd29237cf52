"""Finding CANN at run time: search order, override, absent libraries and symbols.

dlopen of a bare soname also matches a library this process already loaded,
so each search runs in a fresh interpreter (`_load_in_subprocess`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from jax_amp_scale.mechanisms import handlers
from tests import ascend_harness
from tests.cann_double import control


@pytest.fixture(autouse=True)
def _forget():
    yield
    ascend_harness.testing().forget_cann()


_SCRIPT = """
import json
from jax_amp_scale.mechanisms import handlers
try:
    print(json.dumps({"ok": handlers.load_cann()}))
except handlers.CannLoadError as e:
    print(json.dumps({"error": str(e)}))
"""


def _load_in_subprocess(monkeypatch, **env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ),
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "error" in result:
        raise handlers.CannLoadError(result["error"])
    return result["ok"]


def _run_once():
    s, t = jnp.ones((1,), jnp.float32), jnp.zeros((1,), jnp.int32)
    f = jax.jit(
        lambda s, t: ascend_harness.update_scale(
            s, t, False, growth_factor=2.0, backoff_factor=0.5, growth_interval=10
        )
    )
    return jax.block_until_ready(f(s, t))


def test_math_library_is_preferred(double, monkeypatch):
    control.use(monkeypatch, double, "full")
    home = double.home("full")
    paths = _load_in_subprocess(monkeypatch)
    assert paths == {
        "opapi": f"{home}/lib64/libopapi_math.so",
        "nnopbase": f"{home}/lib64/libnnopbase.so",
        "ascendcl": f"{home}/lib64/libascendcl.so",
        "opapi_nn": f"{home}/lib64/libopapi_nn.so",
        "fused_pass_error": "",
        "soc": "Ascend910B2",  # the double's default device: an Atlas A2 in INF_NAN mode
        "overflow_mode": "inf_nan",
    }
    _run_once()
    assert {e["lib"] for e in double.log() if e["ev"] in ("gws", "run")} == {"libopapi_math.so"}


@pytest.mark.slow
@pytest.mark.trimmed
def test_older_cann_falls_back_to_libopapi(double, monkeypatch):
    control.use(monkeypatch, double, "legacy")
    home = double.home("legacy")
    assert _load_in_subprocess(monkeypatch)["opapi"] == f"{home}/lib64/libopapi.so"


@pytest.mark.slow
@pytest.mark.trimmed
def test_math_library_without_the_operator_is_skipped(double, monkeypatch):
    control.use(monkeypatch, double, "no_op")
    home = double.home("no_op")
    assert _load_in_subprocess(monkeypatch)["opapi"] == f"{home}/lib64/libopapi.so"


@pytest.mark.slow
@pytest.mark.trimmed
def test_toolkit_home_is_searched(double, monkeypatch):
    control.use(monkeypatch, double, "full")
    monkeypatch.delenv("ASCEND_HOME_PATH")
    home = double.home("legacy")
    got = _load_in_subprocess(monkeypatch, ASCEND_TOOLKIT_HOME=str(home))
    assert got["opapi"] == f"{home}/lib64/libopapi.so"


def test_override_variable_wins(double, monkeypatch):
    control.use(monkeypatch, double, "legacy")
    path = str(double.root / "legacy" / "libopapi.so")
    got = _load_in_subprocess(monkeypatch, JAX_AMP_SCALE_CANN_OPAPI=path)
    assert got["opapi"] == path and got["opapi_nn"] == path  # older CANN: one library
    # The descriptors and the runtime come from the operator's own dependencies.
    assert got["nnopbase"] == f"{double.home('legacy')}/lib64/libnnopbase.so"


@pytest.mark.slow
@pytest.mark.trimmed
def test_mixed_installation_is_refused(double, monkeypatch):
    # The case: the operator from installation B, ASCEND_HOME_PATH = A.
    # Descriptors made by A's libnnopbase.so must never reach B's operator.
    control.use(monkeypatch, double, "full")
    path = str(double.root / "full2" / "libopapi_math.so")
    with pytest.raises(handlers.CannLoadError) as info:
        _load_in_subprocess(monkeypatch, JAX_AMP_SCALE_CANN_OPAPI=path)
    msg = str(info.value)
    assert "mixed CANN installation" in msg
    assert str(double.root / "full2" / "libnnopbase.so") in msg
    assert f"{double.home('full')}/lib64/libnnopbase.so" in msg


_MAPS = """
import json
from jax_amp_scale.mechanisms import handlers
handlers.load_cann()
maps = open("/proc/self/maps").read()
print(json.dumps(sorted({l.split()[-1] for l in maps.splitlines() if "libnnopbase" in l})))
"""


@pytest.mark.slow
@pytest.mark.trimmed
def test_one_copy_of_libnnopbase_is_mapped(double, monkeypatch):
    control.use(monkeypatch, double, "full")
    out = subprocess.run([sys.executable, "-c", _MAPS], capture_output=True, text=True, check=True)
    (only,) = json.loads(out.stdout.strip().splitlines()[-1])
    assert only == str(double.root / "full" / "libnnopbase.so")


@pytest.mark.slow
@pytest.mark.trimmed
def test_fused_pass_missing_is_reported_not_fatal(double, monkeypatch):
    control.use(monkeypatch, double, "no_nn")
    got = _load_in_subprocess(monkeypatch)
    assert got["opapi"].endswith("libopapi_math.so") and got["opapi_nn"] == ""
    assert "aclnnForeachNonFiniteCheckAndUnscale not found" in got["fused_pass_error"]


@pytest.mark.slow
@pytest.mark.trimmed
def test_override_without_the_symbols_names_them(double, monkeypatch):
    control.use(monkeypatch, double, "full")
    path = str(double.root / "no_op" / "libopapi_math.so")
    with pytest.raises(handlers.CannLoadError) as info:
        _load_in_subprocess(monkeypatch, JAX_AMP_SCALE_CANN_OPAPI=path)
    msg = str(info.value)
    assert path in msg and "JAX_AMP_SCALE_CANN_OPAPI is set" in msg
    assert "lacks symbol(s) aclnnAmpUpdateScaleGetWorkspaceSize, aclnnAmpUpdateScale" in msg


@pytest.mark.slow
@pytest.mark.trimmed
def test_absent_libraries_list_every_path_searched(double, monkeypatch):
    control.use(monkeypatch, double, "missing")
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", "/nonexistent/toolkit")
    home = double.home("missing")
    with pytest.raises(handlers.CannLoadError) as info:
        _load_in_subprocess(monkeypatch)
    msg = str(info.value)
    for path in (
        f"{home}/lib64/libopapi_math.so",
        "/nonexistent/toolkit/lib64/libopapi_math.so",
        "\n  libopapi_math.so:",  # the loader's own search path
        f"{home}/lib64/libopapi.so",
        "/nonexistent/toolkit/lib64/libopapi.so",
        "\n  libopapi.so:",
    ):
        assert path in msg
    assert msg.index("libopapi_math.so") < msg.index("lib64/libopapi.so")
    assert "ASCEND_HOME_PATH" in msg and "JAX_AMP_SCALE_CANN_OPAPI" in msg
    # The jitted call fails with the same explanation, not a crash.  (In this
    # process no math library is loaded under the "missing" home unless an
    # earlier test loaded one: the override makes the search fail for sure.)
    monkeypatch.setenv("JAX_AMP_SCALE_CANN_OPAPI", f"{home}/lib64/libopapi_math.so")
    ascend_harness.testing().forget_cann()
    with pytest.raises(Exception, match="cannot load CANN"):
        _run_once()


def test_nothing_set_and_nothing_installed(monkeypatch):
    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "JAX_AMP_SCALE_CANN_OPAPI"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(handlers.CannLoadError, match="aclnnAmpUpdateScale not found; searched:"):
        _load_in_subprocess(monkeypatch)


def test_import_needs_no_cann():
    # The package and the Ascend module import without CANN; only a call loads it.
    import jax_amp_scale._native_ascend as mod

    # The versioned targets, and nothing else (tests/mechanisms/handlers/test_native_modules.py).
    assert set(mod.registrations()) == {
        mod.UPDATE_SCALE_TARGET,
        mod.UNSCALE_AND_CHECK_TARGET,
        mod.FLOAT_STATUS_CLEAR_TARGET,
        mod.FLOAT_STATUS_READ_TARGET,
    }


def test_test_only_code_is_not_in_the_package():
    # The CPU test binding and the loader/workspace controls are built into
    # the test extension (tests/native), never into the installed module.
    import jax_amp_scale._native_ascend as mod

    public = {n for n in dir(mod) if not n.startswith("_")}
    assert public == {
        "UPDATE_SCALE_TARGET",
        "UNSCALE_AND_CHECK_TARGET",
        "FLOAT_STATUS_CLEAR_TARGET",
        "FLOAT_STATUS_READ_TARGET",
        "load_cann",
        "registrations",
    }
    assert importlib.util.find_spec("jax_amp_scale._ascend_testing") is None
    assert ascend_harness.testing().TEST_TARGET not in mod.registrations()
