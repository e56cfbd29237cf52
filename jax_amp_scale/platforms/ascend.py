"""Ascend glue: load CANN early, hand out the handler, and the CPU test binding.

The Ascend handler (``ffi/ascend.cc``) calls ``aclnnAmpUpdateScale`` through
CANN libraries it loads at run time; nothing from CANN is needed to build or
import this package.  `load_cann` loads them now and raises `CannLoadError`
listing every path tried when one is missing.

The test binding (`update_scale_test_binding`) runs the same validation and
the same dispatch code as the device handler, under ``jax.jit`` on CPU, with
a null stream: pointed at the CANN test double (``tests/cann_double``) it
proves the dispatch without an NPU.  It is not meant for training.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import jax

from jax_amp_scale.platforms import registry

TEST_TARGET = "jas_update_scale_ascend_test"


class CannLoadError(RuntimeError):
    """A CANN library or symbol the Ascend handler needs was not found."""


def native() -> ModuleType:
    """The `_native_ascend` extension module (always built; needs no CANN)."""
    return importlib.import_module("jax_amp_scale._native_ascend")


def load_cann() -> dict[str, str]:
    """Loads CANN now; returns the paths used, keyed opapi/nnopbase/ascendcl.

    Raises:
      CannLoadError: a library or symbol is missing; the message lists every
        path tried (``$JAX_AMP_SCALE_CANN_OPAPI``, then ``libopapi_math.so``
        and ``libopapi.so`` under ``$ASCEND_HOME_PATH/lib64``,
        ``$ASCEND_TOOLKIT_HOME/lib64`` and the loader path; likewise
        ``libnnopbase.so`` and ``libascendcl.so``).
    """
    try:
        return dict(native().load_cann())
    except RuntimeError as e:
        raise CannLoadError(str(e)) from None


def handler_capsule() -> Any:
    """The production XLA FFI handler (binds ``PlatformStream<aclrtStream>``)."""
    mod = native()
    return mod.registrations()[registry.module_targets(mod)[registry.UPDATE_SCALE]]


_test_registered = False


def register_test_binding() -> None:
    """Registers the CPU test binding under `TEST_TARGET` (idempotent)."""
    global _test_registered
    if not _test_registered:
        capsule = native().test_registrations()[TEST_TARGET]
        jax.ffi.register_ffi_target(TEST_TARGET, capsule, platform="cpu")
        _test_registered = True


def update_scale_test_binding(
    current_scale: jax.Array,
    growth_tracker: jax.Array,
    found_inf: Any,
    *,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> tuple[jax.Array, jax.Array]:
    """`amp_update_scale` through the Ascend dispatch on CPU (tests only).

    Same arguments, validation and found_inf conversion as
    `jax_amp_scale.amp_update_scale`; lowers to the test binding, which calls
    ``aclnnAmpUpdateScale`` of whatever CANN `load_cann` finds with a null
    stream, so the buffers are host memory: only the CANN test double can
    serve it.
    """
    from jax_amp_scale.lowering.update_scale import call_native
    from jax_amp_scale.state import validation
    from jax_amp_scale.state.scale_state import check_factor, check_growth_interval

    register_test_binding()
    gf = check_factor(growth_factor, "growth_factor")
    bf = check_factor(backoff_factor, "backoff_factor")
    gi = check_growth_interval(growth_interval)
    scale = validation.check_scale(current_scale, "current_scale")
    tracker = validation.check_tracker(growth_tracker, tuple(scale.shape), "growth_tracker")
    found = validation.found_to_bool(found_inf, tuple(scale.shape))
    return call_native(
        TEST_TARGET, scale, tracker, found, growth_factor=gf, backoff_factor=bf, growth_interval=gi
    )
