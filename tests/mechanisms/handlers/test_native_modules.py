"""Every native module follows one pattern: target names read from the module.

The FFI target names are defined once in C++ (ffi/targets.h) and exported by
each module as UPDATE_SCALE_TARGET and UNSCALE_AND_CHECK_TARGET (and, by the
CPU module alone, HOST_REPORT_TARGET; by the Ascend module alone, the float
status register's FLOAT_STATUS_CLEAR_TARGET and FLOAT_STATUS_READ_TARGET);
registrations() maps those names to capsules.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest

from jax_amp_scale.mechanisms import handlers

# The module attributes naming the targets each module hands out a capsule
# for: exactly those, under their versioned names (ffi/targets.h).
MODULES = {
    "_native_cpu": {
        "UPDATE_SCALE_TARGET",
        "UNSCALE_AND_CHECK_TARGET",
        "UNSCALE_CHECK_AMAX_TARGET",
        "HOST_REPORT_TARGET",
    },
    "_native_cuda": {"UPDATE_SCALE_TARGET"},
    "_native_ascend": {
        "UPDATE_SCALE_TARGET",
        "UNSCALE_AND_CHECK_TARGET",
        "FLOAT_STATUS_CLEAR_TARGET",
        "FLOAT_STATUS_READ_TARGET",
    },
    "_native_plugin": None,  # the PJRT registrar hands out no capsule
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_target_names_and_registrations(name):
    if importlib.util.find_spec(f"jax_amp_scale.{name}") is None:
        pytest.skip(f"{name} was not built here")
    mod = importlib.import_module(f"jax_amp_scale.{name}")
    # One spelling: the names the package registers are the modules' own.
    assert mod.UPDATE_SCALE_TARGET == handlers.target("update_scale") == "jas_update_scale_v2"
    assert handlers.target("unscale_and_check") == mod.UNSCALE_AND_CHECK_TARGET
    assert handlers.target("unscale_and_check") == "jas_unscale_and_check_v1"
    assert handlers.target("host_report") == "jas_host_report_v1"
    if MODULES[name] is None:
        assert not hasattr(mod, "registrations")
        return
    regs = mod.registrations()
    assert set(regs) == {getattr(mod, a) for a in MODULES[name]}
    assert all(type(c).__name__ == "PyCapsule" for c in regs.values())


def test_cpu_module_keeps_its_ffi_api_version():
    import jax_amp_scale._native_cpu as mod

    major, minor = mod.ffi_api_version()
    assert isinstance(major, int) and isinstance(minor, int)


@pytest.mark.slow
@pytest.mark.trimmed
def test_importing_the_package_loads_no_native_module():
    # handlers.py: "Importing this module does no work": the compiled
    # modules load, and register with XLA, at first use.
    code = (
        "import sys, jax_amp_scale, jax_amp_scale.optax, jax_amp_scale.export\n"
        "from jax_amp_scale.mechanisms import handlers\n"
        "print(sorted(m for m in sys.modules if m.startswith('jax_amp_scale._native')),"
        " sorted(handlers.registered_platforms('update_scale')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["[]", "[]"], out.stdout
