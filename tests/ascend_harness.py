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
convention, the SoC's operators and the overflow flag, every CANN call)
against the double; `saturate` plays a saturation-mode backward.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any
from unittest import mock

import jax
import jax.numpy as jnp

from jax_amp_scale.mechanisms import cann_device, handlers
from jax_amp_scale.operators.unscale_and_check import cann_fused_pass, reference_pass
from jax_amp_scale.operators.update_scale import (
    call_native,
    found_to_bool,
    refuse_infinite_growth,
)

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
        for name in (mod.TEST_TARGET, mod.UNSCALE_TEST_TARGET, mod.SATURATE_TEST_TARGET):
            jax.ffi.register_ffi_target(name, capsules[name], platform="cpu")
        _registered = True
    return str(mod.TEST_TARGET)


def _register_flag_bindings() -> dict[str, str]:
    """The float status test bindings, registered as the flag's handlers for
    "cpu" under their own names (which the dispatch reads from TARGETS)."""
    mod = testing()
    capsules = mod.registrations()
    names = {
        handlers.FLOAT_STATUS_CLEAR: str(mod.CLEAR_TEST_TARGET),
        handlers.FLOAT_STATUS_READ: str(mod.READ_TEST_TARGET),
    }
    handlers.platforms(handlers.UPDATE_SCALE)  # the modules' own names first
    with mock.patch.dict(handlers.TARGETS, names):
        for op, name in names.items():
            handlers.register_capsule(op, "cpu", capsules[name])
    return names


def saturate(tree: Any) -> Any:
    """What a saturation-mode NPU makes of a float16 backward, under jit too:
    each float16 inf becomes +-65504 and each NaN 0, and if there was any,
    the device's float status register is set (in the CANN double).  Other
    dtypes pass unchanged."""
    register_test_binding()
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    call = jax.ffi.ffi_call(
        str(testing().SATURATE_TEST_TARGET),
        [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves],
        input_output_aliases={k: k for k in range(len(leaves))},
        has_side_effect=True,
    )
    return jax.tree_util.tree_unflatten(treedef, call(*leaves))


def forget_device() -> None:
    """The next dispatch asks CANN for the device again (after `control.use`)."""
    testing().forget_cann()
    cann_device.forget()


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
def dispatch_tables(
    *,
    auto_native: dict[str, frozenset[str]] | None = None,
    cann_platforms: frozenset[str] | None = None,
    targets: dict[str, str] | None = None,
) -> Iterator[None]:
    """Within it, the dispatch reads these tables: `handlers.AUTO_NATIVE`
    (operator -> platforms where ``"auto"`` prefers the native handler;
    replaced whole when given), `handlers.CANN_PLATFORMS` and
    `handlers.TARGETS` (operator -> FFI target name; the given ones replace
    the modules' own).

    Decisions are taken when a function is traced, and `jax.jit` caches
    traces without knowing the tables, so JAX's caches are cleared on entry
    and on exit: functions traced inside keep that path.
    """
    with contextlib.ExitStack() as stack:
        if auto_native is not None:
            stack.enter_context(
                mock.patch.dict(handlers.AUTO_NATIVE, dict(auto_native), clear=True)
            )
        if cann_platforms is not None:
            stack.enter_context(
                mock.patch.object(handlers, "CANN_PLATFORMS", frozenset(cann_platforms))
            )
        if targets is not None:
            handlers.platforms(handlers.UPDATE_SCALE)  # load the modules' own names first
            stack.enter_context(mock.patch.dict(handlers.TARGETS, targets))
        jax.clear_caches()
        stack.callback(jax.clear_caches)
        yield


@contextlib.contextmanager
def ascend_on_cpu() -> Iterator[None]:
    """Within it, CPU plays Ascend: the package's own dispatch, run whole.

    ``update_scale(..., backend="auto")``, ``unscale_and_check`` and
    ``loss_scaled`` then take exactly the path they take on an Ascend
    platform: the dispatch tables (`dispatch_tables`) name "cpu" a CANN
    platform (the rule choice: a torch state with factors that are not
    powers of two plans the reference; the guard after aclnnAmpUpdateScale;
    the fused pass's CANN calling convention), prefer the native handlers
    there, and call the test bindings of ``ffi/ascend.cc`` (CANN loaded by
    the production loader: point it at the CANN test double first,
    ``control.use``).  With several devices the fused pass runs per local
    shard, as on a mesh of NPUs.  Functions traced inside keep that path;
    trace afresh after leaving.
    """
    register_test_binding()
    mod = testing()
    flags = _register_flag_bindings()
    sys.modules["_ascend_testing"] = mod
    with (
        mock.patch.object(cann_device, "ASCEND_MODULE", "_ascend_testing"),
        dispatch_tables(
            auto_native={op: frozenset({"cpu"}) for op in handlers.OPERATORS},
            cann_platforms=frozenset({"cpu"}),
            targets={
                handlers.UPDATE_SCALE: str(mod.TEST_TARGET),
                handlers.UNSCALE_AND_CHECK: str(mod.UNSCALE_TEST_TARGET),
                **flags,
            },
        ),
    ):
        cann_device.forget()
        try:
            yield
        finally:
            cann_device.forget()
