"""The Ascend device as CANN reports it: its SoC, its overflow mode, and
which of CANN's operators it has.

The native module learns both at load (``aclrtGetSocName``,
``aclrtGetDeviceSatMode``: ffi/ascend_loader.cc); the dispatch reads them
here at trace time (docs/ascend.md).

SoC names are matched exactly, never by prefix: ``"Ascend910B"`` (no digit)
is a first-generation 910 (Atlas training series), while ``"Ascend910B1"``
to ``"Ascend910B4-1"`` are Atlas A2 (torch_npu csrc/core/npu/
NpuVariables.cpp; MindSpore mindspore-ai/mindspore/plugin/ascend/ascend_device_context.cc).
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from typing import NamedTuple

# The module whose CANN loader the handlers use; the tests point it at their
# own build (tests/ascend_harness.py).
ASCEND_MODULE = "jax_amp_scale._native_ascend"

# Product lines by exact SoC name (torch_npu NpuVariables.cpp, MindSpore's map).
PRODUCT_LINES: dict[str, frozenset[str]] = {
    "Atlas training series (910)": frozenset(
        {"Ascend910A", "Ascend910B", "Ascend910ProA", "Ascend910ProB", "Ascend910PremiumA"}
    ),
    "Atlas A2": frozenset("Ascend910B" + n for n in ("1", "2", "2C", "3", "4", "4-1")),
    "Atlas A3": frozenset(
        "Ascend910_" + n for n in ("9391", "9392", "9381", "9382", "9372", "9362", "9361", "9363")
    ),
    "Atlas inference series (310P)": frozenset(
        {"Ascend310P1", "Ascend310P2", "Ascend310P3", "Ascend310P4", "Ascend310P5", "Ascend310P7"}
    ),
}
TRAINING_SERIES = "Atlas training series (910)"
INFERENCE_SERIES = "Atlas inference series (310P)"
ASCEND_950 = "Ascend 950"

# The operators' product lists, as CANN's pages give them:
# aclnnAmpUpdateScale (hicann/ops-math math/amp_update_scale/docs/
# aclnnAmpUpdateScale.md): 950, A3, A2; not the 910, 310P, 200I/500 A2.
# aclnnForeachNonFiniteCheckAndUnscale (hicann/ops-nn foreach/
# foreach_non_finite_check_and_unscale/docs/...md): 950, A3, A2, the Atlas
# inference series; not the 910 nor the 200I/500 A2.
UPDATE_SCALE_OP = "aclnnAmpUpdateScale"
FUSED_PASS_OP = "aclnnForeachNonFiniteCheckAndUnscale"
SUPPORTED: dict[str, tuple[str, ...]] = {
    UPDATE_SCALE_OP: (ASCEND_950, "Atlas A3", "Atlas A2"),
    FUSED_PASS_OP: (ASCEND_950, "Atlas A3", "Atlas A2", INFERENCE_SERIES),
}
# Products that have only the saturation mode (hicann/runtime 25-02: the 910,
# 310P and 200I/500 A2 "only support setting saturation mode").
SATURATION_ONLY = (TRAINING_SERIES, INFERENCE_SERIES)

SATURATION = "saturation"
INF_NAN = "inf_nan"


def product_line(soc: str) -> str | None:
    """The product line of SoC name `soc` (exact match), or None when unknown."""
    if soc.startswith("Ascend950"):  # the 950's names share this prefix (NpuVariables.cpp)
        return ASCEND_950
    for line, names in PRODUCT_LINES.items():
        if soc in names:
            return line
    return None


def lacks(operator: str, soc: str) -> bool:
    """Whether CANN lists `operator` as unsupported on `soc`.  An unknown SoC
    is not assumed to lack it: CANN's own status then says."""
    line = product_line(soc)
    return line is not None and line not in SUPPORTED[operator]


class Device(NamedTuple):
    soc: str
    overflow_mode: str  # "saturation", "inf_nan", "undef" or "unknown", as loaded

    @property
    def saturation(self) -> bool:
        """Whether overflow saturates: the mode reported; where CANN could not
        report it (no aclrtGetDeviceSatMode, or no current device on the
        loading thread), the product's only mode, else the variable torch_npu
        reads: ``INF_NAN_MODE_ENABLE=0`` (default 1), which an A2/A3 honours
        only with ``INF_NAN_MODE_FORCE_DISABLE=1`` (torch_npu
        csrc/core/npu/NpuVariables.cpp, register/OptionsManager.cpp)."""
        if self.overflow_mode in (SATURATION, INF_NAN):
            return self.overflow_mode == SATURATION
        line = product_line(self.soc)
        if line in SATURATION_ONLY:
            return True
        if line == ASCEND_950:
            return False
        if os.environ.get("INF_NAN_MODE_ENABLE", "1").strip() != "0":
            return False
        forced = os.environ.get("INF_NAN_MODE_FORCE_DISABLE", "").strip() == "1"
        return forced or line not in ("Atlas A2", "Atlas A3")


_lock = threading.Lock()
_device: list[Device | None] = []  # empty: not asked yet; [None]: CANN did not load
_warned: set[str] = set()


def load_cann() -> dict[str, str]:
    """The loaded CANN's libraries, SoC and overflow mode (RuntimeError when
    it cannot be loaded)."""
    return dict(importlib.import_module(ASCEND_MODULE).load_cann())


def device() -> Device | None:
    """The device CANN reports (asked once per process), or None where CANN
    cannot be loaded (the native calls then fail with the loader's error)."""
    with _lock:
        if not _device:
            try:
                info = load_cann()
            except (RuntimeError, ImportError):
                _device.append(None)
            else:
                _device.append(Device(info.get("soc", ""), info.get("overflow_mode", "unknown")))
        return _device[0]


def forget() -> None:
    """Ask CANN again on next use (tests that change the device)."""
    with _lock:
        _device.clear()
        _warned.clear()


def warn_once(soc: str) -> None:
    """The one warning that "auto" runs the reference, for every operator
    `soc` lacks."""
    with _lock:
        if soc in _warned:
            return
        _warned.add(soc)
    names = " and ".join(op for op in SUPPORTED if lacks(op, soc))
    warnings.warn(
        f"jax_amp_scale: the Ascend SoC {soc} ({product_line(soc)}) lacks {names} "
        f"(CANN lists {UPDATE_SCALE_OP} for {', '.join(SUPPORTED[UPDATE_SCALE_OP])}; "
        f"{FUSED_PASS_OP} for {', '.join(SUPPORTED[FUSED_PASS_OP])}); "
        'backend="auto" runs the pure-JAX reference for them on this device',
        RuntimeWarning,
        stacklevel=2,
    )


def refusal(operator: str, soc: str) -> str:
    """The error of backend="ffi" for `operator` on a SoC that lacks it."""
    return (
        f"backend='ffi': {operator} is not supported on the Ascend SoC {soc} "
        f"({product_line(soc)}); CANN supports it on: {', '.join(SUPPORTED[operator])}. "
        "Use backend='auto' (the pure-JAX reference there) or 'reference'"
    )
