"""Workload 6: our bits against torch's kernels, on the device JAX runs on.

update_scale against torch._amp_update_scale_, unscale_and_check against
torch._amp_foreach_non_finite_check_and_unscale_; every difference not a
flushed subnormal or a NaN payload is unexplained and listed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import _harness
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from tabulate import tabulate

import jax_amp_scale as jas

INT32_MAX = 2**31 - 1
FIXED_FACTORS = [(2.0, 0.5, 2000), (2.0, 0.5, 1), (1.1, 0.3, 2), (3.0, 0.9, 3)]
FIXED_FACTORS += [(1.0001, 0.1, INT32_MAX), (65536.0, 0.5**20, 2)]
POW2_SCALES = [2.0**k for k in (0, 1, 15, 24, 64, 100, 125, 126, 127)]
OTHER_SCALES = [3 * 2.0**125, 1.7 * 2.0**127, 1.1 * 2.0**126, 1e38, 3.4e38, 12345.678, 0.375]
GRAD_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
EXPLAINED = ("flushed result", "flushed operand", "NaN payload")


@dataclass
class Tally:
    """Differences of one (check, dtype, backend): counts per class, a few examples."""

    compared: int = 0
    classes: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def add(self, kind: str, count: int, examples: Sequence[str] = ()) -> None:
        if count:
            self.classes[kind] = self.classes.get(kind, 0) + count
            if kind not in EXPLAINED:
                self.examples += list(examples)[: max(0, 5 - len(self.examples))]

    @property
    def unexplained(self) -> int:
        return sum(n for k, n in self.classes.items() if k not in EXPLAINED)


def bits(x: np.ndarray) -> np.ndarray:
    return x.view({4: np.uint32, 2: np.uint16}[x.dtype.itemsize])


def random_states(rng: np.random.Generator, n: int, gi: int):
    scales = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scales[:8] = [65536.0, 1e-45, 3.4e38, np.inf, 0.0, 1.0, -2.0, np.nan]
    trackers = rng.choice([gi - 1, 0, max(gi - 2, 0), INT32_MAX, -5], n).astype(np.int32)
    found = rng.choice(np.array([0.0, 1.0, np.nan], np.float32), n)
    return scales, trackers, found


def torch_update(device, scales, trackers, found, gf, bf, gi):
    """torch._amp_update_scale_ on each state (in place on one-element views)."""
    import torch

    s = torch.from_numpy(scales.copy()).to(device)
    t = torch.from_numpy(trackers.copy()).to(device)
    f = torch.from_numpy(found.copy()).to(device)
    for i in range(len(scales)):
        torch._amp_update_scale_(s[i : i + 1], t[i : i + 1], f[i : i + 1], gf, bf, gi)
    return s.cpu().numpy(), t.cpu().numpy()


@functools.cache
def ours_update(backend: str, gf: float, bf: float, gi: int):
    kw = {"growth_factor": gf, "backoff_factor": bf, "growth_interval": gi, "backend": backend}
    return jax.jit(jax.vmap(lambda s, t, f: jas.amp_update_scale(s, t, f, **kw)))


def classify_update(tally: Tally, scales, got, want, factors) -> None:
    (gs, gt), (ws, wt) = got, want
    tally.compared += len(scales)
    nan_g, nan_w = np.isnan(gs), np.isnan(ws)
    tally.add("NaN where torch is not (or back)", int(np.sum(nan_g != nan_w)))
    differ = ~nan_g & ~nan_w & (bits(gs) != bits(ws))
    sub_in = np.abs(scales) < 2.0**-126
    tally.add("flushed operand", int(np.sum(differ & sub_in & (gs == 0))))
    other = differ & ~(sub_in & (gs == 0))
    seen = [
        f"{factors}: scale {scales[i]!r} -> ours {gs[i]!r}, torch {ws[i]!r}"
        for i in np.nonzero(other)[0][:5]
    ]
    tally.add("scale bits", int(np.sum(other)), seen)
    wrong = gt != wt
    seen = [f"{factors}: ours {gt[wrong][:3]}, torch {wt[wrong][:3]}"]
    tally.add("tracker", int(np.sum(wrong)), seen)


def update_scale_check(device, n: int, n_random: int, seed: int = 0) -> dict[str, Tally]:
    rng = np.random.default_rng(seed)
    factors = list(FIXED_FACTORS)
    for _ in range(n_random):
        gi = int(rng.choice([1, 2, 3, 2000]))
        factors.append((float(rng.uniform(1.0, 1e3)), float(rng.uniform(1e-3, 1.0)), gi))
    backends = ("auto", *jas.available_backends())
    tallies = {b: Tally() for b in backends}
    for gf, bf, gi in factors:
        scales, trackers, found = random_states(rng, n, gi)
        want = torch_update(device, scales, trackers, found, gf, bf, gi)
        for b in backends:
            got = tuple(map(np.asarray, ours_update(b, gf, bf, gi)(scales, trackers, found)))
            classify_update(tallies[b], scales, got, want, (gf, bf, gi))
    return tallies


def gradients(dtype, n_float32: int, seed: int = 24) -> np.ndarray:
    """float32: random bit patterns plus specials; 16-bit: every bit pattern."""
    if dtype != np.float32:
        return np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dtype)
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2**32, n_float32, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x[:8] = [0.5 * 2.0**127, 3.0e38, -np.inf, np.nan, 1e-45, -1e-40, 2.0**-126, 1.0]
    return x


def torch_unscale(device, grads: np.ndarray, scale: float) -> tuple[np.ndarray, bool]:
    """GradScaler.unscale_'s op, with GradScaler's inverse scale."""
    import torch

    if grads.dtype == ml_dtypes.bfloat16:
        t = torch.from_numpy(bits(grads).copy()).view(torch.bfloat16).to(device)
    else:
        t = torch.from_numpy(grads.copy()).to(device)
    inv = torch.tensor([scale], dtype=torch.float32).double().reciprocal().float().to(device)
    found = torch.zeros(1, device=device)
    torch._amp_foreach_non_finite_check_and_unscale_([t], found, inv)
    if grads.dtype == ml_dtypes.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16), bool(found.item())
    return t.cpu().numpy(), bool(found.item())


@functools.cache
def ours_unscale(backend: str):
    return jax.jit(lambda g, state: jas.unscale_and_check([g], state, backend=backend))


def classify_pass(tally: Tally, grads, scale, got, want) -> None:
    g, w = bits(got), bits(want)
    tally.compared += grads.size
    differ = g != w
    if not differ.any():
        return
    mag = np.uint32(0x7FFFFFFF) if g.dtype == np.uint32 else np.uint16(0x7FFF)
    g32, w32 = got.astype(np.float32), want.astype(np.float32)
    both_nan = np.isnan(g32) & np.isnan(w32)
    same_sign = (g ^ w) <= mag
    zero_g = (g & mag) == 0
    tiny_w = np.abs(w32.astype(np.float64)) <= 2.0**-126
    flushed = differ & ~both_nan & zero_g & same_sign & tiny_w
    with np.errstate(invalid="ignore"):  # NaN gradients compare false, as they should
        sub_in = (np.abs(grads.astype(np.float64)) < 2.0**-126) & (grads != 0)
    operand = differ & ~both_nan & ~flushed & sub_in & zero_g
    tally.add("NaN payload", int(np.sum(differ & both_nan)))
    tally.add("flushed result", int(np.sum(flushed)))
    tally.add("flushed operand", int(np.sum(operand)))
    other = differ & ~both_nan & ~flushed & ~operand
    seen = [
        f"scale {scale!r}: {grads.dtype} grad {grads[i]!r} -> "
        f"ours 0x{int(g[i]):x}, torch 0x{int(w[i]):x}"
        for i in np.nonzero(other)[0][:3]
    ]
    tally.add("other", int(np.sum(other)), seen)


def pass_check(device, n_float32: int, scales: list[float]) -> dict[tuple[str, str], Tally]:
    backends = ["auto", *jas.available_backends(op="unscale_and_check")]
    tallies: dict[tuple[str, str], Tally] = {}
    for dname, dtype in GRAD_DTYPES.items():
        grads = gradients(dtype, n_float32)
        for scale in scales:
            want, want_found = torch_unscale(device, grads, scale)
            state = jas.init_scale_state(scale)
            for b in backends:
                tally = tallies.setdefault((dname, b), Tally())
                (out,), found = ours_unscale(b)(jnp.asarray(grads), state)
                seen = [f"scale {scale!r}: ours {bool(found)}, torch {want_found}"]
                tally.add("found_inf", int(bool(found) != want_found), seen)
                classify_pass(tally, grads, scale, np.asarray(out), want)
    return tallies


def section(part: str, title: str, tallies: dict[str, Tally], first: str) -> dict:
    """One check for run_all: a table of its differences by class, the first
    unexplained examples, and how many are unexplained."""
    kinds = sorted({k for t in tallies.values() for k in t.classes})
    head = [first, "compared", "differ", "unexplained", *kinds]
    rows = [
        [name, *(f"{c:,}" for c in [t.compared, sum(t.classes.values()), t.unexplained])]
        + [f"{t.classes.get(k, 0):,}" for k in kinds]
        for name, t in tallies.items()
    ]
    align = ["left", *["right"] * (len(head) - 1)]
    table = tabulate(rows, head, "github", colalign=align, disable_numparse=True)
    lines = [f"#### {title}", "", table]
    if examples := [f"- {name}: {e}" for name, t in tallies.items() for e in t.examples]:
        lines += ["", "Unexplained, first examples:", "", *examples]
    total = sum(t.unexplained for t in tallies.values())
    md = "\n".join(lines) + "\n"
    return {"title": f"6. Bits against torch: {part}", "markdown": md, "unexplained": total}


def main(argv: list[str] | None = None) -> list[dict]:
    p = _harness.parser(__doc__.splitlines()[0], reps=1)
    p.add_argument("--states", type=int, default=4096, help="update_scale states per factor set")
    p.add_argument("--random-factors", type=int, default=10, help="random factor sets")
    p.add_argument("--grads", type=int, default=1 << 20, help="float32 gradient values")
    args = p.parse_args(argv)
    scales = POW2_SCALES + OTHER_SCALES
    if args.tiny:
        args.states, args.random_factors, args.grads = 64, 1, 4096
        scales = [2.0**15, 2.0**127, 1.7 * 2.0**127, 0.375]
    import torch

    if (device := _harness.torch_device()) is None:
        raise SystemExit(f"JAX runs on {jax.default_backend()}: torch has no device there")
    upd = update_scale_check(device, args.states, args.random_factors)
    grad = pass_check(device, args.grads, scales)
    where = f"JAX on {jax.default_backend()}, torch {torch.__version__} on {device}"
    sets = f"{len(FIXED_FACTORS) + args.random_factors} factor sets x {args.states} states"
    listed = f"{len(scales)} scales: {', '.join(f'{s:.4g}' for s in scales)}"
    upd_title = f"update_scale against torch._amp_update_scale_ ({where}; {sets})"
    op = "torch._amp_foreach_non_finite_check_and_unscale_"
    grad_title = f"unscale_and_check against {op} ({where}; {listed})"
    grad = {f"{d} [{b}]": t for (d, b), t in grad.items()}
    sections = [
        section("update_scale", upd_title, upd, "backend"),
        section("the gradient pass", grad_title, grad, "gradients [backend]"),
    ]
    for s in sections:
        print(s["markdown"])
    _harness.save(args, [], sections, show=True)
    return sections


if __name__ == "__main__":
    main()
