"""jax_amp_scale.plugin: registering handlers on PJRT plugin platforms.

Against a fake PJRT plugin (tests/pjrt_double/fake_pjrt.c) for every branch
of the registrar, and against the real jax CUDA PJRT plugin binary
(``jax-cuda12-pjrt``, a test extra), which loads without a GPU.  Registration
is process-global and cannot be undone, so each scenario runs in a fresh
interpreter.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._budget import tiered

HERE = Path(__file__).resolve().parents[1]  # tests/


def _run(script: str, **env: str) -> dict:
    full_env = {**os.environ, **env}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=str(HERE.parent),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fake_plugin(tmp_path_factory) -> Path:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake PJRT plugin")
    out = tmp_path_factory.mktemp("pjrt") / "fake_pjrt.so"
    subprocess.run(
        [
            cc,
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            str(HERE / "pjrt_double" / "fake_pjrt.c"),
            "-o",
            str(out),
        ],
        check=True,
    )
    return out


_FAKE = """
import ctypes, json, os
from jax_amp_scale import plugin, _native_plugin
from jax_amp_scale.mechanisms import handlers
path = os.environ["FAKE_PJRT"]
out = {}
try:
    # A fake plugin JAX did not load: registered in its API table directly.
    api = _native_plugin.api_from_library(path)
    out["route"] = plugin.register_in_api(api, "ascend")
    out["again"] = plugin.register_in_api(api, "ascend")
    out["platforms"] = sorted(handlers.platforms('update_scale'))
    import jax_amp_scale as jas
    out["available"] = jas.available_backends("ascend")
    out["auto"] = jas.auto_backend("ascend")
except RuntimeError as e:  # PluginRegistrationError, or api_from_library's error
    out["error"] = str(e)
lib = ctypes.CDLL(path)
lib.fake_pjrt_log.restype = ctypes.c_char_p
out["log"] = lib.fake_pjrt_log().decode().splitlines()
print(json.dumps(out))
"""


def test_newer_layout_registers_once_and_marks_the_platform(fake_plugin):
    out = _run(_FAKE, FAKE_PJRT=str(fake_plugin), FAKE_PJRT_MODE="typed")
    assert out["route"] == "pjrt" and out["again"] == "pjrt"
    assert "ascend" in out["platforms"]
    # Once registered, "auto" prefers the native operator on Ascend.
    assert out["available"] == ["reference", "ffi"] and out["auto"] == "ffi"
    # Idempotent: the plugin was called once per handler (Ascend registers
    # the fused gradient pass and the float status register too).
    got = sorted(tuple(line.split()[:4]) for line in out["log"])
    assert got == [
        ("typed", "jas_float_status_clear_v1", "ascend", "-1"),
        ("typed", "jas_float_status_read_v1", "ascend", "-1"),
        ("typed", "jas_unscale_and_check_v1", "ascend", "-1"),
        ("typed", "jas_update_scale_v2", "ascend", "-1"),
    ]


@pytest.mark.slow
@pytest.mark.trimmed
def test_older_layout_with_api_version_is_detected(fake_plugin):
    out = _run(_FAKE, FAKE_PJRT=str(fake_plugin), FAKE_PJRT_MODE="versioned")
    assert out["route"] == "pjrt-versioned"
    got = sorted(tuple(line.split()[:4]) for line in out["log"])
    assert got == [
        ("versioned", "jas_float_status_clear_v1", "ascend", "1"),
        ("versioned", "jas_float_status_read_v1", "ascend", "1"),
        ("versioned", "jas_unscale_and_check_v1", "ascend", "1"),
        ("versioned", "jas_update_scale_v2", "ascend", "1"),
    ]


@pytest.mark.parametrize(
    ("mode", "message"),
    tiered(
        [
            ("no_ffi", "has no FFI extension"),
            ("ffi_v1", "unknown PJRT FFI extension version: struct_size 40"),
            ("error", r"register_handler failed .*error code 6.*already registered"),
            ("major1", "unknown PJRT C API major version 1"),
        ],
        keep=[("ffi_v1", "unknown PJRT FFI extension version: struct_size 40")],
    ),
)
def test_clear_failures(fake_plugin, mode, message):
    out = _run(_FAKE, FAKE_PJRT=str(fake_plugin), FAKE_PJRT_MODE=mode)
    assert re.search(message, out["error"]), out["error"]
    assert out["log"] == []


def test_a_library_that_is_not_a_pjrt_plugin(tmp_path):
    import jax_amp_scale._native_plugin as native

    from jax_amp_scale import plugin

    lib = Path(native.__file__)  # a shared library without GetPjrtApi
    with pytest.raises(plugin.PluginRegistrationError, match=r"is not a PJRT plugin.*GetPjrtApi"):
        plugin.register(platform="ascend", library_path=lib)
    with pytest.raises(plugin.PluginRegistrationError, match="cannot open PJRT plugin library"):
        plugin.register(platform="ascend", library_path=tmp_path / "absent.so")


_CHECKED = """
import ctypes, json, os
from jax_amp_scale import plugin
from jax_amp_scale.mechanisms import handlers
path = os.environ["FAKE_PJRT"]
out = {}
for platform in ("ascend", "cpu", "no_such_platform"):
    try:
        plugin.register(platform=platform, library_path=path)
        out[platform] = "registered"
    except plugin.PluginRegistrationError as e:
        out[platform] = str(e)
out["platforms"] = sorted(handlers.platforms("update_scale"))
lib = ctypes.CDLL(path)
lib.fake_pjrt_log.restype = ctypes.c_char_p
out["log"] = lib.fake_pjrt_log().decode().splitlines()
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.trimmed
def test_a_library_jax_did_not_load_for_the_platform_is_refused(fake_plugin):
    # The issue: any PJRT library was accepted for any platform (then
    # handlers.platforms() listed it).  Without the escape hatch a library must
    # be the plugin JAX loaded for that platform; JAX runs no 'ascend' plugin
    # here, and 'cpu' is not a PJRT plugin at all.
    out = _run(_CHECKED, FAKE_PJRT=str(fake_plugin), FAKE_PJRT_MODE="typed", JAX_PLATFORMS="cpu")
    for platform in ("ascend", "cpu", "no_such_platform"):
        msg = out[platform]
        assert f"JAX has not loaded a PJRT plugin for {platform!r}" in msg, msg
        assert "register_in_api" in msg and str(fake_plugin) in msg
    assert out["log"] == []  # the plugin was never asked
    assert not {"ascend", "no_such_platform"} & set(out["platforms"])


def test_unknown_platform_without_a_library_path():
    out = _run(
        """
        import json
        from jax_amp_scale import plugin
        try:
            plugin.register(platform="no_such_platform")
        except plugin.PluginRegistrationError as e:
            print(json.dumps({"error": str(e)}))
        """,
        JAX_PLATFORMS="cpu",
    )
    assert "has not loaded a PJRT plugin named 'no_such_platform'" in out["error"]
    assert "library_path=" in out["error"]


# --- the real jax CUDA PJRT plugin -------------------------------------------


def _cuda_plugin_path() -> Path | None:
    try:
        spec = importlib.util.find_spec("jax_plugins.xla_cuda12")
    except ModuleNotFoundError:  # no jax_plugins package at all
        return None
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "xla_cuda_plugin.so"
    return path if path.exists() else None


CUDA_PLUGIN = _cuda_plugin_path()
needs_cuda_wheel = pytest.mark.skipif(
    CUDA_PLUGIN is None,
    reason="jax-cuda12-pjrt (the test-plugin extra) is not installed: no real PJRT plugin binary",
)

_REAL = """
import json, os
import jax
from jax_amp_scale import plugin, _native_cpu, _native_plugin
from jax_amp_scale.mechanisms import handlers
path = os.environ["CUDA_PLUGIN"]
out = {}
api = _native_plugin.api_from_library(path)
out["extensions"] = _native_plugin.extensions(api)
try:  # the CUDA plugin's library for "ascend": refused
    plugin.register(platform="ascend", library_path=path)
except plugin.PluginRegistrationError as e:
    out["refused"] = str(e)
# A real plugin binary used as a double on a platform JAX does not run.
out["route"] = plugin.register_in_api(api, "ascend")
out["again"] = plugin.register_in_api(api, "ascend")
out["platforms"] = sorted(handlers.platforms('update_scale'))
try:
    plugin.register_in_api(api, "ascend",
                         handler=_native_cpu.registrations()["jas_update_scale_v2"])
except plugin.PluginRegistrationError as e:
    out["conflict"] = str(e)
# The plugin JAX itself loaded (JAX_PLATFORMS=cpu keeps it from initialising
# CUDA): found without a path, and it is the same PJRT_Api.
from jax._src import xla_bridge as xb
xb._discover_and_register_pjrt_plugins()
out["jax_loaded_same_api"] = (
    handlers.loaded_plugin_api("cuda") == api
)
out["loaded_route"] = plugin.register(
    platform="cuda", registry_platform="ascend_via_cuda_test",
    handler=_native_cpu.registrations()["jas_update_scale_v2"])
# The same library by path, for the platform JAX loaded it for: accepted
# (its GetPjrtApi() is the API JAX holds).
out["by_path_route"] = plugin.register(
    platform="cuda", library_path=path, registry_platform="cuda_by_path_test",
    handler=_native_cpu.registrations()["jas_update_scale_v2"])
out["routes"] = plugin.registrations()
print(json.dumps(out))
"""


@needs_cuda_wheel
def test_real_cuda_pjrt_plugin_registration():
    out = _run(_REAL, CUDA_PLUGIN=str(CUDA_PLUGIN), JAX_PLATFORMS="cpu")
    assert [5, 48] in out["extensions"]  # the FFI extension, with register_handler
    assert "JAX has not loaded a PJRT plugin for 'ascend'" in out["refused"]
    assert out["route"] == "pjrt" and out["again"] == "pjrt"
    assert "ascend" in out["platforms"]
    assert "conflicting registration" in out["conflict"]
    assert "'jas_update_scale_v2'" in out["conflict"] and "'ascend'" in out["conflict"]
    assert out["jax_loaded_same_api"] is True
    assert out["loaded_route"] == "pjrt" and out["by_path_route"] == "pjrt"
    assert out["routes"] == {"ascend": "pjrt", "cuda": "pjrt"}


@needs_cuda_wheel
def test_automatic_registration_at_the_first_trace_on_a_running_plugin():
    if importlib.util.find_spec("jax_amp_scale._native_cuda") is None:
        pytest.skip("the CUDA handler was not built here (no CUDA compiler)")
    out = _run(
        """
        import json
        import jax
        import jax_amp_scale as jas
        from jax_amp_scale import plugin
        from jax_amp_scale.mechanisms import handlers
        before = plugin.registrations()  # importing registers nothing
        # JAX_PLATFORMS=cpu keeps JAX from running CUDA on this GPU-less
        # machine; report the discovered plugin as running so that the first
        # trace registers it, as it would on a GPU machine.
        devices = jax.devices
        jax.devices = lambda backend=None: ["gpu0"] if backend == "cuda" else devices(backend)
        jax.jit(lambda s: jas.update_scale(s, False))(jas.init_scale_state())
        print(json.dumps({"before": before, "routes": plugin.registrations(),
                          "platforms": sorted(handlers.platforms("update_scale")),
                          "errors": dict(handlers.LOAD_ERRORS)}))
        """,
        JAX_PLATFORMS="cpu",
        JAX_AMP_SCALE_PLUGIN_PLATFORMS="cuda",
    )
    assert out["before"] == {}
    assert out["routes"] == {"cuda": "pjrt"}, out["errors"]
    assert "cuda" in out["platforms"]


@pytest.mark.slow
@pytest.mark.trimmed
def test_jax_ffi_route_when_the_plugin_python_side_forwards():
    # A plugin whose Python side installed a custom-call handler for its
    # platform (as jax_cuda12_plugin does for CUDA): register() hands the
    # capsule to jax.ffi.register_ffi_target, which reaches that handler.
    out = _run(
        """
        import json
        from jax._src.lib import xla_client
        seen = []
        xla_client.register_custom_call_handler(
            "FORWARDING_TEST", lambda name, fn, *rest, **kw: seen.append(name))
        from jax_amp_scale import plugin
        from jax_amp_scale.mechanisms import handlers
        route = plugin.register(platform="forwarding_test", registry_platform="FORWARDING_TEST")
        again = plugin.register(platform="forwarding_test", registry_platform="FORWARDING_TEST")
        print(json.dumps({"route": route, "again": again, "seen": seen,
                          "platforms": sorted(handlers.platforms("update_scale"))}))
        """,
        JAX_PLATFORMS="cpu",
    )
    assert out["route"] == "jax.ffi" and out["again"] == "jax.ffi"
    # once each (registration is idempotent): a plugin platform other than
    # CUDA gets the Ascend handlers, the overflow flag's two among them
    assert sorted(out["seen"]) == [
        "jas_float_status_clear_v1",
        "jas_float_status_read_v1",
        "jas_unscale_and_check_v1",
        "jas_update_scale_v2",
    ]
    assert "forwarding_test" in out["platforms"]


@pytest.mark.slow
@pytest.mark.trimmed
def test_failed_automatic_registration_is_kept_not_raised():
    out = _run(
        """
        import json, sys
        sys.modules["jax_amp_scale._native_cuda"] = None  # as where it was not built
        import jax, jax.numpy as jnp
        import jax_amp_scale as jas
        from jax_amp_scale.mechanisms import handlers
        devices = jax.devices
        jax.devices = lambda backend=None: ["gpu0"] if backend == "cuda" else devices(backend)
        state = jax.jit(lambda s: jas.update_scale(s, True))(jas.init_scale_state(8.0))
        print(json.dumps({"scale": float(state.scale), "errors": dict(handlers.LOAD_ERRORS)}))
        """,
        JAX_PLATFORMS="cpu",
        JAX_AMP_SCALE_PLUGIN_PLATFORMS="cuda",
    )
    assert out["scale"] == 4.0  # the trace went on
    assert out["errors"]["cuda"].startswith(
        "automatic plugin registration: the CUDA handler was not built"
    )


def _arg_words(fn) -> dict[str, str]:
    """`fn`'s docstring Args entries, each joined onto one line."""
    import inspect

    args = inspect.getdoc(fn).split("Args:\n", 1)[1].split("\n\n", 1)[0]
    out: dict[str, str] = {}
    for line in args.splitlines():
        m = re.match(r"  (\w+): (.*)", line)
        if m:
            name, out[m[1]] = m[1], m[2]
        else:
            out[name] += " " + line.strip()
    return out


def test_register_docstring_gives_the_defaults_the_code_uses():
    # register and register_in_api both take their defaults from
    # handlers.register_plugin; register's docstring used to say "CUDA for
    # cuda" only, leave gpu out of the handler, and say the gradient pass is
    # registered "on Ascend" where it is registered on any platform but cuda/gpu.
    from jax_amp_scale import plugin
    from jax_amp_scale.mechanisms import handlers

    reg, api = _arg_words(plugin.register), _arg_words(plugin.register_in_api)
    # register_in_api's entries either repeat register's or point to them.
    for arg in ("registry_platform", "handler", "target"):
        assert api[arg] in (reg[arg], "as in `register`."), arg
    for lowering, registry in handlers.REGISTRY_PLATFORM.items():
        if registry != lowering:
            assert re.search(
                rf'``"{registry}"`` for [\w ,]*\b{lowering}\b', reg["registry_platform"]
            )
    assert "on a platform other than cuda or gpu, the gradient pass" in reg["target"]
    assert "on Ascend" not in reg["target"]
