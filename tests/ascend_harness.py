"""The Ascend dispatch on CPU, for tests: the test extension and its binding.

``_ascend_testing`` (``tests/native/ascend_testing_module.cc``, built by
``tests/native/build.py``, never installed) binds the production checks and
dispatch of ``ffi/ascend.cc`` on CPU with a null stream.  Pointed at the CANN
test double (``tests/cann_double``) it proves the dispatch without an NPU.
The module has its own CANN loader state and workspace cache: `testing()`'s
``forget_cann``, ``workspaces``, ``retired_workspaces`` and
``release_workspaces`` act on the state its binding uses.

`ascend_on_cpu` runs the package's whole Ascend path on CPU (the public
functions, the dispatch decisions, the guard, the fused pass's calling
convention, every CANN call) against the double.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp

from jax_amp_scale.lowering.ffi_calls import (
    call_native,
    cann_fused_pass,
    refuse_infinite_growth,
)
from jax_amp_scale.ops.operators import found_to_bool
from jax_amp_scale.reference.gradient_pass import reference_pass

# A subprocess started by a test reuses the parent's build through this.
_PATH_VAR = "JAS_ASCEND_TESTING_MODULE"
_module: ModuleType | None = None
_registered = False


def testing() -> ModuleType:
    """The built ``_ascend_testing`` module (built on first use)."""
    global _module
    if _module is None:
        path = os.environ.get(_PATH_VAR)
        if not path:
            from tests.native import build

            path = str(build.build())
            os.environ[_PATH_VAR] = path
        spec = importlib.util.spec_from_file_location("_ascend_testing", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _module = module
    return _module


def register_test_binding() -> str:
    """Registers the CPU test bindings (idempotent); returns the update-scale one's name."""
    global _registered
    mod = testing()
    if not _registered:
        capsules = mod.registrations()
        for name in (mod.TEST_TARGET, mod.UNSCALE_TEST_TARGET):
            jax.ffi.register_ffi_target(name, capsules[name], platform="cpu")
        _registered = True
    return str(mod.TEST_TARGET)


def unscale_and_check(inv: jax.Array, leaves: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
    """The fused gradient pass through the Ascend dispatch on CPU
    (``aclnnForeachNonFiniteCheckAndUnscale`` of the double): the lowering's
    CANN calling convention, float64 and empty leaves through the reference."""
    register_test_binding()
    target = str(testing().UNSCALE_TEST_TARGET)
    return cann_fused_pass(target, reference_pass)(jnp.asarray(inv, jnp.float32), list(leaves))


def update_scale(
    current_scale: jax.Array,
    growth_tracker: jax.Array,
    found_inf: Any,
    *,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    rule: str = "cann",
    guard: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """`amp_update_scale` through the Ascend dispatch on CPU.

    The caller passes valid attributes and a state of shape (1,) or (); the
    native checks still reject anything else.  found_inf (nonzero or NaN
    means overflow) goes to the handler in the scale's dtype, as the operator
    wants it; the call is in place and vmaps as one call per batch (the
    package's own custom-call wrapper, pointed at the test target).

    `rule` is the state's rule attribute (the handler refuses ``"torch"``
    unless both factors are powers of two).  Without `guard` the result is
    the operator's own (CANN's kernel: a float16 32768 grown x2 is inf);
    with it, the library's guard runs after the call as on Ascend.
    """
    target = register_test_binding()
    scale = jnp.asarray(current_scale)
    found = found_to_bool(found_inf, tuple(scale.shape))
    new_scale, new_tracker = call_native(
        target,
        scale,
        jnp.asarray(growth_tracker),
        found,
        growth_factor=growth_factor,
        backoff_factor=backoff_factor,
        growth_interval=growth_interval,
        rule=rule,
    )
    if guard:
        new_scale = refuse_infinite_growth(scale, found, new_scale)
    return new_scale, new_tracker


@contextlib.contextmanager
def ascend_on_cpu() -> Iterator[None]:
    """Within it, CPU plays Ascend: the package's own dispatch, run whole.

    ``update_scale(..., backend="auto")``, ``unscale_and_check`` and
    ``loss_scaled`` then take exactly the path they take on an Ascend
    platform: the dispatch configuration (`jax_amp_scale.ops.dispatch.configured`,
    the one seam) names "cpu" a CANN platform (the rule choice: a torch state
    with factors that are not powers of two plans the reference; the guard
    after aclnnAmpUpdateScale; the fused pass's CANN calling convention),
    prefers the native handlers there, and calls the test bindings of
    ``ffi/ascend.cc`` (CANN loaded by the production loader: point it at the
    CANN test double first, ``control.use``).  With several devices the
    fused pass runs per local shard, as on a mesh of NPUs.  Functions traced
    inside keep that path; trace afresh after leaving.
    """
    from jax_amp_scale.ops import dispatch
    from jax_amp_scale.platforms import handlers

    register_test_binding()
    mod = testing()
    with dispatch.configured(
        auto_native={op: frozenset({"cpu"}) for op in handlers.OPERATORS},
        cann_platforms=frozenset({"cpu"}),
        targets={
            handlers.UPDATE_SCALE: str(mod.TEST_TARGET),
            handlers.UNSCALE_AND_CHECK: str(mod.UNSCALE_TEST_TARGET),
        },
    ):
        yield
