"""torch_npu's GradScaler in saturation mode, emulated in NumPy: the oracle
of tests/public/test_ascend_saturation.py.

Written from torch_npu's logic as /work/shared/spec/ascend-saturation.md
section 4 describes it (Ascend/pytorch torch_npu/npu/amp/grad_scaler.py,
op-plugin AmpForeachNonFiniteCheckAndUnscaleKernelNpu*.cpp), not from this
library:

- ``scale(loss)``: in saturation mode the float status is cleared once per
  iteration, before the backward; the loss is multiplied by the scale;
- ``unscale_(grads)``: the gradient values are ignored; the flag is read; if
  set, ``found_inf = 1``, the flag is cleared and the gradients stay scaled;
  else they are multiplied by ``inv_scale`` (float32 ``1 / scale``);
- with several replicas the overflow count is all-reduced (sum) and the step
  is skipped when it is nonzero;
- ``step``: skipped when ``found_inf``;
- ``update`` (``_npu_update_scale``): on an overflow ``scale *= backoff`` and
  the tracker resets; else the tracker counts up and at ``growth_interval``
  ``scale *= growth`` and the tracker resets.

The device is `Npu`: one float status register per replica, set by a
backward that saturated (float16 inf becomes +-65504, NaN becomes 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

F16_MAX = 65504.0


@dataclass
class Npu:
    """The devices of one step: a float status register per replica."""

    replicas: int = 1
    flags: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.flags = [False] * self.replicas

    def clear(self, replica: int) -> None:
        self.flags[replica] = False

    def saturate(self, replica: int, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """What a saturation-mode backward stores, and the register it sets."""
        out = {}
        for name, g in grads.items():
            g = np.array(g, copy=True)
            if g.dtype == np.float16:
                bad = ~np.isfinite(g)
                if bad.any():
                    self.flags[replica] = True
                g[np.isnan(g)] = 0
                g[np.isposinf(g)] = F16_MAX
                g[np.isneginf(g)] = -F16_MAX
            out[name] = g
        return out


@dataclass
class GradScaler:
    """The saturation-mode GradScaler's decisions, step by step."""

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    scale: np.float32 = field(init=False)
    tracker: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.scale = np.float32(self.init_scale)

    def scale_loss(self, npu: Npu, replica: int) -> np.float32:
        npu.clear(replica)  # before the backward, once per iteration
        return self.scale

    def unscale(self, npu: Npu, replica: int, grads: dict[str, np.ndarray]) -> tuple[int, dict]:
        """(overflow count of this replica, the gradients unscaled or left scaled)."""
        if npu.flags[replica]:  # the values are not looked at
            npu.clear(replica)
            return 1, grads
        inv = np.float32(1.0) / self.scale
        return 0, {k: (g.astype(np.float32) * inv).astype(g.dtype) for k, g in grads.items()}

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale = np.float32(self.scale * np.float32(self.backoff_factor))
            self.tracker = 0
            return
        self.tracker += 1
        if self.tracker == self.growth_interval:
            self.scale = np.float32(self.scale * np.float32(self.growth_factor))
            self.tracker = 0


def run(
    scaler: GradScaler,
    steps: int,
    backward: Callable[[int, int, np.float32], dict[str, np.ndarray]],
    replicas: int = 1,
) -> list[dict[str, float | bool]]:
    """Each step's decision: ``{"skipped", "scale"}`` (the scale the step
    used).  `backward(step, replica, scale)` returns that replica's float16
    gradients of the scaled loss before saturation."""
    npu = Npu(replicas)
    out = []
    for step in range(steps):
        count = 0
        used = scaler.scale
        for r in range(replicas):
            s = scaler.scale_loss(npu, r)
            grads = npu.saturate(r, backward(step, r, s))
            n, _ = scaler.unscale(npu, r, grads)
            count += n
        found = count > 0  # all_reduce(sum) of the overflow count
        scaler.update(found)
        out.append({"skipped": found, "scale": float(used)})
    return out
