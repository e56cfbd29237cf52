"""The native handlers: loaded on first use, registered with XLA and with
PJRT plugins, and which backend runs an operator where (docs/backends.md).

The table (capsules under the target names of ffi/targets.h) is filled the
first time an operator asks which platforms have a handler, with the plugin
platforms of ``$JAX_AMP_SCALE_PLUGIN_PLATFORMS`` that JAX runs; importing
this module does no work.  A module or plugin that fails to load is kept in
`LOAD_ERRORS` (a missing ``_native_cpu`` is one `RuntimeWarning`):
``"auto"`` then runs the reference, ``"ffi"`` raises saying why.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
import threading
import warnings
from types import ModuleType
from typing import Any, Literal, NamedTuple

import jax

from jax_amp_scale.mechanisms import cann_device, jax_internals

# The operators that have native handlers, by their modules' names.
UPDATE_SCALE = "update_scale"
UNSCALE_AND_CHECK = "unscale_and_check"
# The gradient pass that also measures each leaf's amax: CPU only.
UNSCALE_CHECK_AMAX = "unscale_check_amax"
OPERATORS: tuple[str, ...] = (UPDATE_SCALE, UNSCALE_AND_CHECK, UNSCALE_CHECK_AMAX)
# The host report (operators/host_report.py): native on CPU, never exported.
HOST_REPORT = "host_report"
# The Ascend float status register (operators/float_status.py): clear and
# read, on CANN platforms in saturation mode only.
FLOAT_STATUS_CLEAR = "float_status_clear"
FLOAT_STATUS_READ = "float_status_read"
FLOAT_STATUS = (FLOAT_STATUS_CLEAR, FLOAT_STATUS_READ)
# The CANN operator behind each operator's Ascend handler.
CANN_OPERATOR = {
    UPDATE_SCALE: cann_device.UPDATE_SCALE_OP,
    UNSCALE_AND_CHECK: cann_device.FUSED_PASS_OP,
}

# Lowering platform name (as `lax.platform_dependent` and `jax.export` spell
# it; "gpu" is JAX's older name for cuda) -> the platform name XLA's and a
# plugin's FFI registries want.
REGISTRY_PLATFORM = {"cpu": "cpu", "cuda": "CUDA", "gpu": "CUDA", "rocm": "ROCM"}

Backend = Literal["auto", "reference", "ffi"]
BACKENDS: tuple[str, ...] = ("auto", "reference", "ffi")

# Ascend's lowering platforms: their handlers are CANN operators
# (aclnnAmpUpdateScale, aclnnForeachNonFiniteCheckAndUnscale), with the
# calling conventions operators/ adapts to.
CANN_PLATFORMS = frozenset({"ascend", "npu"})

# Where "auto" prefers the native handler (where one is registered): CPU,
# where it is faster (bench/), and Ascend, whose operators are CANN's own;
# not CUDA, whose handler has never run on a GPU.  docs/_facts.toml ([auto]).
AUTO_NATIVE = {
    UPDATE_SCALE: frozenset({"cpu"}) | CANN_PLATFORMS,
    UNSCALE_AND_CHECK: frozenset({"cpu"}) | CANN_PLATFORMS,
    UNSCALE_CHECK_AMAX: frozenset({"cpu"}),
}

# One lock for the table and the loading (which writes the table).
_lock = threading.RLock()
_handlers: dict[str, set[str]] = {op: set() for op in (*OPERATORS, HOST_REPORT, *FLOAT_STATUS)}
# Why an optional native module or a plugin registration did not load, by platform.
LOAD_ERRORS: dict[str, str] = {}
# {operator: FFI target name}, as the native modules define them.
TARGETS: dict[str, str] = {}


def module_targets(mod: Any) -> dict[str, str]:
    """``{operator: FFI target name}`` as native module `mod` defines them
    (the host report's included)."""
    # Each module names an operator's target in the attribute OPERATOR_TARGET.
    names = {op: f"{op.upper()}_TARGET" for op in _handlers}
    return {op: str(getattr(mod, a)) for op, a in names.items() if hasattr(mod, a)}


def register_capsule(op: str, platform: str, capsule: Any) -> None:
    """Registers `capsule` with XLA as `op`'s handler on `platform` (idempotent)."""
    platform = platform.lower()
    with _lock:
        if platform in _handlers[op]:
            return
        jax.ffi.register_ffi_target(
            TARGETS[op], capsule, platform=REGISTRY_PLATFORM.get(platform, platform)
        )
        _handlers[op].add(platform)


def registered_platforms(op: str) -> frozenset[str]:
    """Lowering platforms with a handler registered so far for `op` (no loading)."""
    with _lock:
        return frozenset(_handlers[op])


def record_load_error(platform: str, message: str) -> None:
    with _lock:
        LOAD_ERRORS[platform] = message


_DEFAULT_PLUGIN_PLATFORMS = ("ascend", "npu")
# User switch: never load the compiled modules (every operator runs the
# pure-JAX reference; the automatic plugin registration is skipped too).
DISABLE_ENV = "JAX_AMP_SCALE_DISABLE_NATIVE"

_builtins_loaded = False
_plugins_tried: set[str] = set()


def register_module(mod: ModuleType, platform: str) -> None:
    """Registers every handler `mod` hands out for `platform`, under the
    versioned target names the module defines (ffi/targets.h)."""
    names = module_targets(mod)
    with _lock:
        TARGETS.update(names)
    capsules = mod.registrations()
    for op, name in names.items():
        if name in capsules:
            register_capsule(op, platform, capsules[name])


def native_disabled() -> bool:
    """Whether ``$JAX_AMP_SCALE_DISABLE_NATIVE`` turns the compiled modules off."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


# Why the compiled modules are not in use (None while they are).
_unavailable: str | None = None
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _caller_stacklevel() -> int:
    """The `warnings.warn` stacklevel of the first frame outside this package and JAX."""
    inside = (_PACKAGE_DIR + os.sep, os.path.dirname(os.path.abspath(jax.__file__)) + os.sep)
    frame, level = sys._getframe(1), 1  # the caller of this function: where warn is called
    while frame.f_back is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def _load_builtins() -> None:
    global _builtins_loaded, _unavailable
    if _builtins_loaded:
        return
    _builtins_loaded = True  # one try (and at most one warning) per process
    if native_disabled():
        _unavailable = f"the native modules are turned off by {DISABLE_ENV}=1"
        record_load_error("cpu", _unavailable)
        return
    try:  # built with every install; missing only from a broken or foreign one
        cpu = importlib.import_module("jax_amp_scale._native_cpu")
    except ImportError as e:
        _unavailable = f"the compiled module jax_amp_scale._native_cpu could not be loaded ({e})"
        record_load_error("cpu", _unavailable)
        warnings.warn(
            f"jax_amp_scale: {_unavailable}. Every operator runs the pure-JAX reference "
            'backend (backend="auto" picks it; each operator gives the same bits, only the '
            "native speed-ups are lost, though a whole run may differ in its last digits "
            "since XLA fuses the program around the operators otherwise), and "
            'backend="ffi" raises. Install a wheel built '
            "for this platform, or build from source (a C++17 compiler and CMake); set "
            f"{DISABLE_ENV}=1 to use the reference without this warning.",
            RuntimeWarning,
            stacklevel=_caller_stacklevel(),
        )
        return
    register_module(cpu, "cpu")
    try:  # optional: built only where CMake found a working CUDA compiler
        register_module(importlib.import_module("jax_amp_scale._native_cuda"), "cuda")
    except ImportError as e:
        record_load_error("cuda", f"_native_cuda: {e}")


def plugin_platforms() -> tuple[str, ...]:
    """Plugin platforms registered automatically (``$JAX_AMP_SCALE_PLUGIN_PLATFORMS``)."""
    raw = os.environ.get("JAX_AMP_SCALE_PLUGIN_PLATFORMS")
    if raw is None:
        return _DEFAULT_PLUGIN_PLATFORMS
    return tuple(p.strip().lower() for p in raw.split(",") if p.strip())


def _register_plugins() -> None:
    if _unavailable is not None:
        return
    for platform in plugin_platforms():
        if platform in _plugins_tried:
            continue
        _plugins_tried.add(platform)  # JAX's backends do not change once running
        try:
            if not jax.devices(platform):
                continue
        except RuntimeError:  # JAX has no such backend in this process
            continue
        try:
            register_plugin(platform)
        except Exception as e:  # kept in LOAD_ERRORS; "auto" takes the reference
            record_load_error(platform, f"automatic plugin registration: {e}")


def platforms(op: str) -> frozenset[str]:
    """Lowering platforms with a native handler for `op`, loading them first."""
    with _lock:
        _load_builtins()
        _register_plugins()
    return registered_platforms(op)


def target(op: str) -> str:
    """`op`'s FFI target name; a RuntimeError without the native modules."""
    with _lock:
        _load_builtins()
    if _unavailable is not None:
        raise RuntimeError(
            f"jax_amp_scale: backend='ffi' needs the native handlers, but {_unavailable}; "
            "use backend='auto' or 'reference'"
        )
    with _lock:
        return TARGETS[op]


def served_targets() -> frozenset[str]:
    """Every FFI target name the native handlers serve (what a serialized
    program of this library may call)."""
    with _lock:
        _load_builtins()
        return frozenset(name for op, name in TARGETS.items() if op in OPERATORS)


# ---- which backend runs an operator ----------------------------------------


def check_backend(backend: Any) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return str(backend)


def platform_name(platform: str | None) -> str:
    """`platform` (default: JAX's default backend) as a lowering platform name."""
    platform = (platform or jax.default_backend()).lower()
    return "cuda" if platform == "gpu" else platform


def _check_op(op: Any) -> str:
    """`op` if it is one of the public `OPERATORS` (the host report is internal)."""
    if not isinstance(op, str) or op not in OPERATORS:
        raise ValueError(f"op must be one of {OPERATORS}, got {op!r}")
    return op


def available_backends(platform: str | None = None, op: str = UPDATE_SCALE) -> tuple[str, ...]:
    """Backends that run `op` on `platform`: ``("reference", "ffi")`` where a
    native handler for `op` is registered for `platform` in this process,
    else ``("reference",)``.

    Args:
      platform: a lowering platform name (``"cpu"``, ``"cuda"`` or its older
        name ``"gpu"``, ``"rocm"``, ``"ascend"``, ...; any case); None
        (default): JAX's default backend.
      op: the operator: ``"update_scale"`` (default), ``"unscale_and_check"``
        (the gradient pass) or ``"unscale_check_amax"`` (`amax_scaler`'s
        pass); anything else is a ValueError.
    """
    op = _check_op(op)
    if platform_name(platform) in platforms(op):
        return ("reference", "ffi")
    return ("reference",)


def auto_backend(platform: str | None = None, op: str = UPDATE_SCALE) -> str:
    """The backend ``"auto"`` picks for `op` on `platform` in this process:
    ``"ffi"`` or ``"reference"``.

    Args:
      platform: a lowering platform name, as for `available_backends`.
      op: the operator, as for `available_backends`.
    """
    op = _check_op(op)
    name = platform_name(platform)
    if name in AUTO_NATIVE.get(op, frozenset()) and name in platforms(op):
        return "ffi"
    return "reference"


# ---- registration on PJRT plugin platforms --------------------------------
#
# Through "jax.ffi" where the plugin's Python side forwards it to the plugin
# (jax_internals.python_side_forwards), else through the plugin library's
# PJRT C API FFI extension (plugin/pjrt_register.cc).


class PluginRegistrationError(RuntimeError):
    """The handler could not be registered on the plugin platform."""


class CannLoadError(RuntimeError):
    """A CANN library or symbol the Ascend handler needs was not found."""


# (PJRT_Api address, registry platform lowercased, target) -> handler address.
_plugin_done: dict[tuple[int, str, str], int] = {}
# platform -> the route its registration took.
ROUTES: dict[str, str] = {}


def capsule_pointer(capsule: Any, name: bytes | None = None) -> int:
    """The address a PyCapsule holds (under its own name when `name` is None)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    if name is None:
        name = get_name(capsule)
    return int(get(capsule, name))


def load_cann() -> dict[str, str]:
    """Loads CANN now; returns the paths used (keys ``opapi``, ``nnopbase``,
    ``ascendcl``, ``opapi_nn``, ``fused_pass_error``) and the device: ``soc``
    (``aclrtGetSocName()``, ``""`` where CANN lacks it) and
    ``overflow_mode`` (``aclrtGetDeviceSatMode()``: ``"saturation"``,
    ``"inf_nan"``, ``"undef"``, or ``"unknown"`` where CANN lacks it).

    The Ascend handlers (``ffi/ascend.cc``) load CANN's libraries at run
    time: nothing from CANN is needed to build or import this package.  The
    SoC and the mode are read once, at load, on the current device.

    Raises:
      CannLoadError: a library or symbol is missing; the message lists every
        path tried (``$JAX_AMP_SCALE_CANN_OPAPI``, then ``libopapi_math.so``
        and ``libopapi.so`` under ``$ASCEND_HOME_PATH/lib64``,
        ``$ASCEND_TOOLKIT_HOME/lib64`` and the loader path; likewise
        ``libnnopbase.so`` and ``libascendcl.so``).
    """
    try:
        return cann_device.load_cann()
    except RuntimeError as e:
        raise CannLoadError(str(e)) from None


def default_handler(platform: str, op: str = UPDATE_SCALE) -> Any:
    """The handler capsule of `op` for a plugin `platform`: the CUDA module's
    for cuda, else the Ascend module's (``aclnnAmpUpdateScale`` for
    update-scale, ``aclnnForeachNonFiniteCheckAndUnscale`` for the pass)."""
    if platform in ("cuda", "gpu"):
        try:
            mod = importlib.import_module("jax_amp_scale._native_cuda")
        except ImportError as e:
            raise PluginRegistrationError(
                "the CUDA handler was not built (jax_amp_scale._native_cuda is missing: "
                f"{e}); rebuild with a CUDA compiler on PATH"
            ) from None
        op = UPDATE_SCALE
    else:  # always built: it needs no CANN to build or load
        mod = importlib.import_module("jax_amp_scale._native_ascend")
    return mod.registrations()[module_targets(mod)[op]]


def loaded_plugin_api(platform: str) -> int:
    """The ``PJRT_Api*`` of the plugin JAX loaded for `platform`."""
    c_apis = jax_internals.loaded_plugin_c_apis()
    c_api = c_apis.get(platform)
    if c_api is None:
        raise PluginRegistrationError(
            f"JAX has not loaded a PJRT plugin named {platform!r} (PJRT plugins "
            f"loaded: {sorted(c_apis) or 'none'}); install the plugin, or pass "
            "library_path= to the plugin's .so"
        )
    return capsule_pointer(c_api, b"pjrt_c_api")


def register_plugin(
    platform: str,
    api: int | None = None,
    *,
    registry_platform: str | None = None,
    handler: Any = None,
    target: str | None = None,
) -> str:
    """Registers a handler on plugin `platform`: into the PJRT API table at
    `api`, or (None) through ``jax.ffi`` where the plugin's Python side
    forwards it, else into the plugin JAX loaded.  Defaults: the update-scale
    target with `default_handler` (on Ascend the gradient pass too).
    Returns the route: ``"jax.ffi"``, ``"pjrt"`` or ``"pjrt-versioned"``."""
    platform = str(platform).lower()
    reg_platform = registry_platform or REGISTRY_PLATFORM.get(platform, platform)
    if handler is None:
        default_handler(platform)  # a handler that was not built: say so first
    if api is None and not jax_internals.python_side_forwards(reg_platform):
        api = loaded_plugin_api(platform)
    with _lock:
        _load_builtins()
    targets = dict(TARGETS) or module_targets(importlib.import_module("jax_amp_scale._native_cpu"))
    if handler is None and target is None and platform not in ("cuda", "gpu"):
        ascend = importlib.import_module("jax_amp_scale._native_ascend")
        flag_targets = module_targets(ascend)
        with _lock:
            TARGETS.update({op: flag_targets[op] for op in FLOAT_STATUS})
        for each in (UNSCALE_AND_CHECK, *FLOAT_STATUS):
            name = targets.get(each) or flag_targets[each]
            _register_one(platform, api, reg_platform, default_handler(platform, each), name, each)
    target = targets[UPDATE_SCALE] if target is None else str(target)
    op = {v: k for k, v in targets.items()}.get(target)
    capsule = handler if handler is not None else default_handler(platform)
    return _register_one(platform, api, reg_platform, capsule, target, op)


def _register_one(
    platform: str, api: int | None, reg_platform: str, capsule: Any, target: str, op: str | None
) -> str:
    address = capsule_pointer(capsule)
    with _lock:
        key = (0 if api is None else api, reg_platform.lower(), target)
        previous = _plugin_done.get(key)
        if previous is not None and previous != address:
            raise PluginRegistrationError(
                f"conflicting registration: target {target!r} on platform "
                f"{reg_platform!r} already has another handler (0x{previous:x}) "
                f"in this plugin; not replacing it with 0x{address:x}"
            )
        if previous is None:
            if api is None:
                jax.ffi.register_ffi_target(target, capsule, platform=reg_platform)
                route = "jax.ffi"
            else:
                native = importlib.import_module("jax_amp_scale._native_plugin")
                try:
                    layout = native.register_handler(api, target, capsule, reg_platform)
                except RuntimeError as e:
                    raise PluginRegistrationError(str(e)) from None
                route = "pjrt" if layout == "typed" else "pjrt-versioned"
            _plugin_done[key] = address
            ROUTES[platform] = route
        if op is not None:
            _handlers[op].add(platform)
        return ROUTES[platform]


class Plan(NamedTuple):
    """How to run an operator: ``mode`` is ``"reference"``, ``"native"`` (the
    reference on platforms not in ``platforms``) or ``"strict"`` (an error
    there).  ``cann_platforms``: platforms where the native handler is a CANN
    operator (its calling convention, and for update-scale the guard)."""

    mode: str
    platforms: frozenset[str]
    target: str = ""  # the FFI target name, unless mode is "reference"
    cann_platforms: frozenset[str] = frozenset()


def plan(
    op: str, backend: str, *, partitions: bool, not_auto: frozenset[str] = frozenset()
) -> Plan:
    """The plan for `op` under a checked `backend`, at trace time.

    `partitions`: whether the native calls can partition these operands;
    `not_auto`: platforms ``"auto"`` must not run natively (a CANN operator
    that cannot give the state's bits).  On a CANN platform whose SoC lacks
    the operator, ``"ffi"`` raises (naming the SoC and the products CANN
    lists) and ``"auto"`` plans the reference there, with one warning.
    """
    if backend == "reference":
        return Plan("reference", frozenset())
    have = platforms(op)
    cann = have & CANN_PLATFORMS
    device = cann_device.device() if cann and op in CANN_OPERATOR else None
    soc = None  # the SoC's name when it lacks the operator
    if device is not None and cann_device.lacks(CANN_OPERATOR[op], device.soc):
        soc = device.soc
    if backend == "ffi":
        if soc is not None:
            raise ValueError(cann_device.refusal(CANN_OPERATOR[op], soc))
        return Plan("strict", have, target(op), cann)
    if soc is not None:
        cann_device.warn_once(soc)
        not_auto = not_auto | cann
        cann = frozenset()
    prefer = (have - not_auto) & AUTO_NATIVE.get(op, frozenset())
    if not prefer or not partitions:
        return Plan("reference", frozenset())
    # The target is looked up only for a native plan: without the compiled
    # modules "auto" plans the reference and must not need their names.
    return Plan("native", prefer, target(op), cann)
