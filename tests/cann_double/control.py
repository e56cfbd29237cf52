"""Python side of the CANN test double: build it, point the loader at it, read it."""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build as _build

STATS = (
    "live_tensors",
    "created",
    "destroyed",
    "live_execs",
    "gws_calls",
    "run_calls",
    "live_allocs",
    "total_allocs",
    "total_frees",
    "bad_calls",
    "live_lists",
    "lists_created",
    "lists_destroyed",
    "flag_clears",
    "flag_reads",
)


class CannDouble:
    """The built double (all variants) and its control functions."""

    def __init__(self, root: Path) -> None:
        self.root = _build.build(root)
        # The one core library: every variant's libraries link this file.
        self.core = ctypes.CDLL(str(self.root / "core" / "libcann_double.so"))
        self.core.cd_set_workspace_size.argtypes = [ctypes.c_uint64]
        self.core.cd_set_failure.argtypes = [ctypes.c_char_p, ctypes.c_int32, ctypes.c_char_p]
        self.core.cd_log.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self.core.cd_log.restype = ctypes.c_size_t
        self.core.cd_set_logging.argtypes = [ctypes.c_int]
        self.core.cd_raise_float_status.argtypes = [ctypes.c_int32]
        self.core.cd_float_status.argtypes = [ctypes.c_int32]
        self.core.cd_float_status.restype = ctypes.c_uint32

    def home(self, variant: str) -> Path:
        """A directory D with D/lib64 = the variant's libraries (an ASCEND_HOME_PATH)."""
        home = self.root / f"home_{variant}"
        home.mkdir(exist_ok=True)
        link = home / "lib64"
        if not link.exists():
            link.symlink_to(self.root / variant)
        return home

    def reset(self) -> None:
        self.core.cd_reset()

    def set_workspace_size(self, n: int) -> None:
        self.core.cd_set_workspace_size(n)

    def fail(self, api: str, status: int, message: str) -> None:
        self.core.cd_set_failure(api.encode(), status, message.encode())

    def logging(self, on: bool) -> None:
        self.core.cd_set_logging(1 if on else 0)

    def log(self) -> list[dict[str, Any]]:
        n = self.core.cd_log(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self.core.cd_log(buf, n + 1)
        return [json.loads(line) for line in buf.value.decode().splitlines()]

    def raise_float_status(self, device: int = 0) -> None:
        """Sets `device`'s float status register, as an overflowing kernel
        in saturation mode does."""
        self.core.cd_raise_float_status(device)

    def float_status(self, device: int = 0) -> int:
        return int(self.core.cd_float_status(device))

    def stats(self) -> dict[str, int]:
        out = (ctypes.c_int64 * len(STATS))()
        self.core.cd_stats(out)
        return dict(zip(STATS, out, strict=True))


_SHARED: CannDouble | None = None


def shared(tmp_path_factory: Any) -> CannDouble:
    """One build of the double per test session."""
    global _SHARED
    if _SHARED is None:
        _SHARED = CannDouble(tmp_path_factory.mktemp("cann_double"))
    return _SHARED


SOC_ENV = "JAS_CANN_DOUBLE_SOC"
MODE_ENV = "JAS_CANN_DOUBLE_OVERFLOW_MODE"


def use(
    monkeypatch: Any,
    double: CannDouble,
    variant: str = "full",
    *,
    soc: str | None = None,
    mode: str | None = None,
) -> None:
    """Points the Ascend loader at `variant` of the double, fresh state;
    `soc` and `mode` (``"saturation"`` or ``"inf_nan"``) set the device the
    double plays (default: an Ascend910B2 in INF_NAN mode)."""
    from tests import ascend_harness

    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "JAX_AMP_SCALE_CANN_OPAPI"):
        monkeypatch.delenv(var, raising=False)
    for var, value in ((SOC_ENV, soc), (MODE_ENV, mode)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    monkeypatch.setenv("ASCEND_HOME_PATH", str(double.home(variant)))
    ascend_harness.forget_device()
    ascend_harness.testing().release_workspaces()
    double.reset()
