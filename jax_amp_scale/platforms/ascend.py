"""Ascend glue: load CANN early and hand out the handler.

The Ascend handlers (``ffi/ascend.cc``) call ``aclnnAmpUpdateScale`` and
``aclnnForeachNonFiniteCheckAndUnscale`` through
CANN libraries it loads at run time; nothing from CANN is needed to build or
import this package.  `load_cann` loads them now and raises `CannLoadError`
listing every path tried when one is missing.

The dispatch is proven on CPU against a CANN test double by a test-only
extension that is not part of the package (``tests/ascend_harness.py``).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from jax_amp_scale.platforms import handlers


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


def handler_capsule(op: str = handlers.UPDATE_SCALE) -> Any:
    """The production XLA FFI handler of `op` (binds ``PlatformStream<aclrtStream>``):
    ``aclnnAmpUpdateScale`` for update-scale, ``aclnnForeachNonFiniteCheckAndUnscale``
    for the fused gradient pass."""
    mod = native()
    return mod.registrations()[handlers.module_targets(mod)[op]]
