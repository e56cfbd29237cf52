"""Every published figure, from the results files that the measuring scripts wrote.

    python tools/figures.py record demo        # runs the demo; writes results/demo.json
    python tools/figures.py adopt amax_study PATH --started START.json
                                               # a finished study's amax_study.json
    python tools/figures.py write              # regenerates every figures block
    python tools/figures.py check              # exit 1 when a block is stale
    python tools/figures.py list               # every figure: name, text, source

The results files: ``bench/results.json`` (``bench/run_all.py``) and
``results/*.json`` (``record`` and ``adopt``), each with the jax and jaxlib
versions, the machine (cores, load average at the start), the command and
the date.  `figures()` derives every named figure from them; the docs cite
one by name with the ``{fig}`` role (docs/_ext/figures_role.py), and README
and the pages hold generated blocks between ``<!-- figures: NAME -->`` and
``<!-- /figures -->``, which ``write`` regenerates.  A figure that is missing
from its file is a KeyError: the docs build and tests/docs/test_figures.py fail.

A timing is the median of an interleaved run's paired ratios with its spread
(half the interquartile range), written with no more digits than the spread
supports.  A target's status is computed here, once, from the default path's
figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
BENCH = ROOT / "bench" / "results.json"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "examples/README.md"]
BLOCK = re.compile(r"(<!-- figures: ([\w.-]+) -->\n)(.*?)(<!-- /figures -->)", re.S)


class Fig(NamedTuple):
    text: str  # as a page shows it
    source: str  # the results file (and part) it comes from


# ---- numbers as text ---------------------------------------------------------


def spread_of(values: list[float]) -> float:
    """Half the interquartile range (0 for fewer than 2 values)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / 2


def _decimals(spread: float, most: int = 3) -> int:
    """Digits after the point that `spread` supports: its first significant one."""
    if spread <= 0:
        return most
    return max(0, min(most, -math.floor(math.log10(spread))))


def _digits(median: float, spread: float) -> int:
    """The spread's digits, and at most three significant ones."""
    lead = math.floor(math.log10(abs(median))) if median else 0
    return max(0, min(_decimals(spread), 2 - lead))


def ratio_text(values: list[float], unit: str = "x") -> str:
    """``0.78x (±0.03)``: the median and the spread, at the spread's digits."""
    med, sp = statistics.median(values), spread_of(values)
    d = _digits(med, sp)
    return f"{med:.{d}f}{unit} (±{sp:.{_decimals(sp)}f})" if sp > 0 else f"{med:.{d}f}{unit}"


def median_text(values: list[float], unit: str = "x") -> str:
    """The median alone at the spread's digits (for ranges and table cells)."""
    med = statistics.median(values)
    return f"{med:.{_digits(med, spread_of(values))}f}{unit}"


def seconds_text(s: float) -> str:
    if s >= 10:
        return f"{s:.0f} s"
    return f"{s:.2g} s" if s >= 0.1 else f"{s * 1e3:.2g} ms"


def status(ok: bool) -> str:
    return "met" if ok else "not met"


# ---- the results files ---------------------------------------------------------


@cache
def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def bench_runs() -> dict[str, Any]:
    return _json(BENCH)["runs"]


def result(name: str) -> dict[str, Any]:
    """results/NAME.json: ``{"provenance": {...}, "data": {...}}``."""
    return _json(RESULTS / f"{name}.json")


def _table(workload: str, title_has: str) -> tuple[dict[str, Any], str]:
    """The bench table of `workload` whose title contains `title_has`, and its source."""
    for w, run in bench_runs().items():
        for t in run["tables"]:
            if t["workload"] == workload and title_has in t["title"]:
                return t, f"bench/results.json ({w}: {t['title']})"
    raise KeyError(f"bench/results.json has no {workload!r} table titled *{title_has}*")


def _row(table: dict[str, Any], prefix: str) -> dict[str, Any]:
    for r in table["rows"]:
        if r["name"].startswith(prefix):
            return r
    raise KeyError(f"{table['title']!r} has no row {prefix!r}")


def _paired(row: dict[str, Any], base: dict[str, Any]) -> list[float]:
    return [a / b for a, b in zip(row["times"], base["times"], strict=True)]


# ---- the figures -------------------------------------------------------------

STEP_ROWS = {
    "auto": "ours loss_scaled[auto]",
    "reference": "ours loss_scaled[reference]",
    "ffi": "ours loss_scaled[ffi]",
    "handwritten": "hand-written exact skip",
    "no_reports": "ours, no host reports",
    "amax": "ours amax_scaler",
    "jmp": "jmp DynamicLossScale",
    "flax": "flax DynamicScale",
    "optax": "optax apply_if_finite",
}
PEERS = ("jmp", "flax", "optax")
DTYPES = {"f16": "float16", "f32": "float32"}
COMPILE_LEAVES = (10, 100, 1000)
COMPILE_ROWS = {k: STEP_ROWS[k] for k in ("auto", "reference", "jmp", "flax", "optax")}
PASS_LEAVES = (1, 100, 10000)
PASS_ROWS = {
    "call": "ours unscale_and_check[auto]",
    "inside": "ours[auto] inside a program",
    "torch": "torch fused",
    "limit": "memory-bandwidth limit",
    "floor": "jit dispatch floor",
}
# (name, what, the figure it reads, the most it may be)
TARGETS = [
    ("step.f16", "a float16-compute step, at most 1.0x the plain step", "step.f16.auto", 1.0),
    ("step.f32", "a float32-compute step, at most 1.0x the plain step", "step.f32.auto", 1.0),
    ("amax", "`amax_scaler`'s step, at most 1.01x `dynamic_scaler`'s", "step.f32.amax_vs_auto", 1.01),
    ("compile", "compile time, at most 1.3x the plain step's", "compile.auto.worst", 1.3),
    ("pass.inside.torch", "the gradient pass in a program, at most 1.0x torch's op",
     "pass.inside.torch.worst", 1.0),
    ("pass.inside.limit", "the gradient pass in a program, at most 1.1x the bandwidth limit",
     "pass.inside.limit.worst", 1.1),
    ("pass.call.torch", "the gradient pass as one call, at most 1.0x torch's op",
     "pass.call.torch.worst", 1.0),
    ("pass.call.limit", "the gradient pass as one call, at most 1.1x the bandwidth limit",
     "pass.call.limit.worst", 1.1),
]  # fmt: skip


def _step_figures(out: dict[str, Fig], values: dict[str, float]) -> None:
    for short, dtype in DTYPES.items():
        t, src = _table("1. Step overhead", f"{dtype} compute")
        plain = _row(t, "plain")
        out[f"step.{short}.plain_ms"] = Fig(
            f"{statistics.median(plain['times']) * 1e3:.0f} ms", src
        )
        for key, prefix in STEP_ROWS.items():
            try:
                ratios = _paired(_row(t, prefix), plain)
            except KeyError:
                continue  # a candidate that run did not measure
            out[f"step.{short}.{key}"] = Fig(ratio_text(ratios), src)
            out[f"step.{short}.{key}.median"] = Fig(median_text(ratios), src)
            values[f"step.{short}.{key}"] = statistics.median(ratios)
        for key in ("amax", "handwritten"):
            try:
                ratios = _paired(_row(t, STEP_ROWS[key]), _row(t, STEP_ROWS["auto"]))
            except KeyError:
                continue
            if key == "handwritten":  # the default step against the exact skip
                ratios = [1 / r for r in ratios]
                key = "auto_vs_handwritten"
            else:
                key = "amax_vs_auto"
            out[f"step.{short}.{key}"] = Fig(ratio_text(ratios), src)
            values[f"step.{short}.{key}"] = statistics.median(ratios)
        peers = [values[f"step.{short}.{p}"] for p in PEERS if f"step.{short}.{p}" in values]
        out[f"step.{short}.peers.range"] = Fig(f"{min(peers):.2f}-{max(peers):.2f}x", src)
        values[f"step.{short}.peers.fastest"] = min(peers)


def _compile_figures(out: dict[str, Fig], values: dict[str, float]) -> None:
    worst, lo = 0.0, math.inf
    for n in COMPILE_LEAVES:
        t, src = _table("3. Compile time", f", {n} parameter leaves")
        plain = _row(t, "plain")
        out[f"compile.{n}.plain_s"] = Fig(seconds_text(statistics.median(plain["times"])), src)
        for key, prefix in COMPILE_ROWS.items():
            try:
                ratios = _paired(_row(t, prefix), plain)
            except KeyError:
                out[f"compile.{n}.{key}"] = Fig("not run", src)
                continue
            out[f"compile.{n}.{key}"] = Fig(median_text(ratios), src)
            if key == "auto":
                worst = max(worst, statistics.median(ratios))
                lo = min(lo, statistics.median(ratios))
    out["compile.auto.range"] = Fig(f"{lo:.1f}-{worst:.1f}x", "bench/results.json (compile)")
    values["compile.auto.worst"] = worst


def _pass_figures(out: dict[str, Fig], values: dict[str, float]) -> None:
    worst: dict[str, float] = {}
    for short, dtype in DTYPES.items():
        for n in PASS_LEAVES:
            t, src = _table("2. One pass over the gradients", f"MiB {dtype} over {n} leaves")
            rows = {k: _row(t, p) for k, p in PASS_ROWS.items()}
            for how in ("call", "inside"):
                for base in ("torch", "limit"):
                    ratios = _paired(rows[how], rows[base])
                    name = f"pass.{how}.{base}"
                    out[f"{name}.{short}.{n}"] = Fig(median_text(ratios), src)
                    worst[name] = max(worst.get(name, 0.0), statistics.median(ratios))
            out[f"pass.floor.torch.{short}.{n}"] = Fig(
                median_text(_paired(rows["floor"], rows["torch"])), src
            )
    for name, w in worst.items():
        values[f"{name}.worst"] = w
        out[f"{name}.worst"] = Fig(f"{w:.2f}x", "bench/results.json (unscale)")


def _bench_figures(out: dict[str, Fig]) -> dict[str, float]:
    values: dict[str, float] = {}
    _step_figures(out, values)
    _compile_figures(out, values)
    _pass_figures(out, values)
    t, src = _table("5. torch for scale", "float16 autocast")
    ratios = _paired(_row(t, "torch GradScaler step"), _row(t, "torch plain step"))
    out["torch.gradscaler"] = Fig(ratio_text(ratios), src)
    t, src = _table("4. The operator", "compile time")
    trivial = statistics.median(_row(t, "trivial")["times"])
    for key, prefix in (
        ("ffi", "update_scale(ffi)"),
        ("reference", "update_scale(reference), factors 2"),
    ):
        out[f"op.compile.{key}_s"] = Fig(
            seconds_text(statistics.median(_row(t, prefix)["times"])), src
        )
    inexact = statistics.median(_row(t, "update_scale(reference), factors 1.1")["times"])
    out["op.compile.inexact_s"] = Fig(seconds_text(inexact), src)
    out["op.compile.inexact_vs_trivial"] = Fig(f"{inexact / trivial:.0f}x", src)
    t, src = _table("4. The operator", "vmap over 1024 states")
    ratios = _paired(_row(t, "reference"), _row(t, "ffi"))
    out["op.vmap.ffi_speedup"] = Fig(median_text(ratios), src)
    return values


def _multidevice_figures(out: dict[str, Fig]) -> None:
    for layout in ("fsdp", "data_parallel"):
        t, src = _table("7. Eight devices", f"{layout}: MLP")
        plain = _row(t, "plain")
        for key in ("native", "reference"):
            out[f"multi.{layout}.{key}"] = Fig(ratio_text(_paired(_row(t, key), plain)), src)


def _target_figures(out: dict[str, Fig], values: dict[str, float]) -> None:
    for name, _what, figure, most in TARGETS:
        if figure in values:
            out[f"target.{name}"] = Fig(status(values[figure] <= most), out[figure].source
                                        if figure in out else "bench/results.json")  # fmt: skip
    if "step.f32.auto" in values:
        for short in DTYPES:
            ok = values[f"step.{short}.auto"] <= values[f"step.{short}.peers.fastest"]
            out[f"target.peers.{short}"] = Fig(status(ok), "bench/results.json (step)")


def _demo_figures(out: dict[str, Fig]) -> None:
    d, src = result("demo")["data"], "results/demo.json"
    out["demo.eval_loss"] = Fig(f"{d['eval_loss']:.4f}", src)
    out["demo.baseline_eval_loss"] = Fig(f"{d['baseline_eval_loss']:.4f}", src)
    gap = 100 * (d["eval_loss"] / d["baseline_eval_loss"] - 1)
    out["demo.gap"] = Fig(f"{gap:+.1f}%", src)
    out["demo.final_scale"] = Fig(f"{d['final_scale']:g}", src)
    out["demo.last_batch_loss"] = Fig(f"{d['last_batch_loss']:.4f}", src)
    out["demo.skipped_at"] = Fig(", ".join(map(str, d["skipped_at"])), src)


def _transformer_figures(out: dict[str, Fig]) -> None:
    src = "results/transformer_lm.json"
    modes = result("transformer_lm")["data"]["modes"]
    for mode, m in modes.items():
        out[f"lm.{mode}.eval_loss"] = Fig(f"{m['eval_loss']:.4f}", src)
        out[f"lm.{mode}.zeros"] = Fig(f"{100 * m['grad_zeros_at_init']:.1f}%", src)
    ref = modes["float32"]["eval_loss"]
    for mode in ("float16+scaling", "float16", "bfloat16"):
        out[f"lm.{mode}.gap"] = Fig(f"{modes[mode]['eval_loss'] - ref:+.4f}", src)
    src = "results/transformer_lm_mean.json"
    for mode, m in result("transformer_lm_mean")["data"]["modes"].items():
        out[f"lm_mean.{mode}.eval_loss"] = Fig(f"{m['eval_loss']:.4f}", src)


def minutes_text(s: float) -> str:
    """``3 min 16 s`` (whole seconds: a fresh install varies by more)."""
    m, sec = divmod(round(s), 60)
    return f"{m} min {sec} s" if m else f"{sec} s"


def _readme_figures(out: dict[str, Fig]) -> None:
    """README's fresh-machine commands, timed by tools/time_readme_commands.py."""
    d, src = result("readme_commands")["data"]["commands"], "results/readme_commands.json"
    for name, r in d.items():
        out[f"readme.{name}.install"] = Fig(minutes_text(r["install_seconds"]), src)
        out[f"readme.{name}.run"] = Fig(minutes_text(r["run_seconds"]), src)
        out[f"readme.{name}.jax"] = Fig(r["jax"], src)
    for k, n in d["tests"]["counts"].items():
        out[f"readme.tests.{k}"] = Fig(f"{n:,}", src)


def _power_text(x: float) -> str:
    e = math.log2(x)
    return f"`2**{e:.0f}`" if e == round(e) else f"{x:g}"


def _twin_figures(out: dict[str, Fig]) -> None:
    """examples/transformer_lm_torch.py: the JAX example against its torch twin."""
    d, src = result("transformer_lm_torch")["data"], "results/transformer_lm_torch.json"
    out["twin.steps"] = Fig(str(d["steps"]), src)
    out["twin.torch"] = Fig(d["torch"].split("+")[0], src)
    for mode, short in (("float32", "f32"), ("float16+scaling", "f16")):
        m = d["modes"][mode]
        out[f"twin.{short}.max_diff"] = Fig(f"{m['max_diff']:.1e}", src)
        out[f"twin.{short}.tolerance"] = Fig(f"{m['tolerance']:g}", src)
    m = d["modes"]["float16+scaling"]
    changes = ", ".join(f"to {_power_text(v)} at step {s}" for s, v in m["scale_changes"])
    out["twin.scales"] = Fig(
        ("the same at every step" if m["scales_equal"] else "different")
        + f" ({_power_text(m['first_scale'])}"
        + (f", changing {changes})" if changes else ", never changing)"),
        src,
    )


OVERFLOW_FIRST = ROOT / "examples" / "results" / "overflow_first.json"


def _overflow_figures(out: dict[str, Fig]) -> None:
    """examples/overflow_first.py's own results file (its machine, command and date inside)."""
    d, src = _json(OVERFLOW_FIRST), "examples/results/overflow_first.json"
    c = d["excess_precision_check"]
    out["overflow.excess.compared"] = Fig(str(c["values_compared"]), src)
    out["overflow.excess.changed"] = Fig(str(len(c["changed"])), src)
    m = d["machine"]
    load = m["load average at start"]
    out["source.overflow_first"] = Fig(
        f"`{src}`: jax {m['jax']}, jaxlib {m['jaxlib']}, {m['cores (os.cpu_count)']}-core "
        f"{m['cpu']}, load average at the start {load[0]:.2f}, {d['date']}, `{d['command']}`",
        src,
    )


def _provenance_figures(out: dict[str, Fig]) -> None:
    for name in sorted(p.stem for p in RESULTS.glob("*.json")):
        p = result(name)["provenance"]
        out[f"source.{name}"] = Fig(
            provenance_line(p, f"results/{name}.json"), f"results/{name}.json"
        )
    step = bench_runs()["step"]
    out["source.bench.step"] = Fig(
        provenance_line({**step["machine"], "command": step["command"]}, "bench/results.json"),
        "bench/results.json (step)",
    )


@cache
def figures() -> dict[str, Fig]:
    """Every named figure."""
    out: dict[str, Fig] = {}
    values = _bench_figures(out)
    _target_figures(out, values)
    if "multidevice" in bench_runs():
        _multidevice_figures(out)
    groups = (_demo_figures, _transformer_figures, _twin_figures, amax_figures,
              _overflow_figures, _readme_figures)  # fmt: skip
    for group in groups:
        try:
            group(out)
        except FileNotFoundError:
            continue  # not recorded yet: a block or role that needs it fails by name
    _provenance_figures(out)
    return out


def fig(name: str) -> str:
    try:
        return figures()[name].text
    except KeyError:
        raise KeyError(f"no figure named {name!r} (python tools/figures.py list)") from None


def provenance_line(p: dict[str, Any], where: str) -> str:
    cpu = p.get("cpu", "?").strip()
    return (
        f"`{where}`: jax {p.get('jax', '?')}, jaxlib {p.get('jaxlib', '?')}, "
        f"{p.get('cores (os.cpu_count)', '?')}-core {cpu}, load average at the start "
        f"{p.get('load average at start', '?').split()[0]}, {p.get('date (UTC)', '?')} UTC, "
        f"`{p.get('command', '?')}`"
    )


# ---- the amax study ------------------------------------------------------------


# figure prefix -> the study's results file: the transformer example (float32
# parameters, float16 matrix products), the all-float16 model (--grads
# float16) and the example at about 5x its parameters (--d-model 128
# --layers 3, default settings only), at learning rates 1e-3 and 2e-3.
STUDIES = {
    "amax": "amax_study",
    "all16": "amax_study_f16",
    "large": "amax_study_large",
    "large_lr2e3": "amax_study_large_lr2e-3",
}


def _study(prefix: str = "amax") -> tuple[dict[str, Any], str]:
    name = STUDIES[prefix]
    return result(name)["data"], f"results/{name}.json"


def _runs(d: dict[str, Any], variant: str, kind: str) -> list[dict[str, Any]]:
    return sorted(
        (r for r in d["runs"] if r["variant"] == variant and r["kind"] == kind),
        key=lambda r: r["seed"],
    )


def _gap(d: dict[str, Any], variant: str, kind: str) -> float:
    ref = {r["seed"]: r["eval_loss"] for r in _runs(d, variant, "float32")}
    gaps = [r["eval_loss"] - ref[r["seed"]] for r in _runs(d, variant, kind) if r["seed"] in ref]
    return statistics.mean(gaps) if gaps else math.nan


def amax_figures(out: dict[str, Fig]) -> None:
    for prefix in STUDIES:
        try:
            _study_figures(out, prefix)
        except FileNotFoundError:
            continue  # not recorded yet: a block or role that needs it fails by name


def _study_figures(out: dict[str, Fig], prefix: str) -> None:
    d, src = _study(prefix)
    ev32 = [r["eval_loss"] for r in _runs(d, "default", "float32")]
    out[f"{prefix}.default.seeds"] = Fig(str(len(ev32)), src)
    out[f"{prefix}.default.spread"] = Fig(f"{max(ev32) - min(ev32):.4f}", src)
    for kind in d["settings"]["kinds"]:
        runs = _runs(d, "default", kind)
        skipped = ", ".join(str(r["skipped"]) for r in runs)
        out[f"{prefix}.default.{kind}.skipped"] = Fig(skipped, src)
        out[f"{prefix}.default.{kind}.gap"] = Fig(f"{_gap(d, 'default', kind):+.4f}", src)
        first = [r["first_underflow"] for r in runs if not math.isnan(r["first_underflow"])]
        if first:
            out[f"{prefix}.default.{kind}.first_underflow"] = Fig(f"{max(first):.2%}", src)
    growth = max((r for r in d["runs"] if not math.isnan(r["growth_log2"])),
                 key=lambda r: r["growth_log2"])  # fmt: skip
    out[f"{prefix}.growth.max"] = Fig(f"{growth['growth_log2']:.2f}", src)
    out[f"{prefix}.growth.where"] = Fig(
        f"{growth['variant']}, seed {growth['seed']}, {growth['kind']}", src
    )
    shares = [r for r in d["runs"] if not math.isnan(r.get("float32_only_sets_amax", math.nan))]
    if shares:
        lo = min(r["float32_only_sets_amax"] for r in shares)
        hi = max(r["float32_only_sets_amax"] for r in shares)
        out[f"{prefix}.float32_only.share"] = Fig(f"{lo:.0%}-{hi:.0%}", src)
        gap = max(r["float32_only_gap_log2"] for r in shares)
        out[f"{prefix}.float32_only.gap"] = Fig(f"{gap:.2f}", src)
    for v in sorted({r["variant"] for r in d["runs"]} - {"default"}):
        for kind in d["settings"]["kinds"]:
            if runs := _runs(d, v, kind):
                skips = ", ".join(str(r["skipped"]) for r in runs)
                out[f"{prefix}.{v}.{kind}.skipped"] = Fig(skips, src)


def _cell(xs: Iterable[Any], f: Callable[[Any], str]) -> str:
    return ", ".join(f(x) for x in xs)


def block_amax_default(prefix: str = "amax") -> str:
    d, _ = _study(prefix)
    spread = fig(f"{prefix}.default.spread")
    lines = ["| scaler | skipped steps per seed | eval loss per seed | mean gap to float32 |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for kind in d["settings"]["kinds"]:
        runs = _runs(d, "default", kind)
        lines.append(
            f"| {kind} | {_cell(runs, lambda r: str(r['skipped']))} "
            f"| {_cell(runs, lambda r: format(r['eval_loss'], '.4f'))} "
            f"| {_gap(d, 'default', kind):+.4f} |"
        )
    return "\n".join(lines) + f"\n\nfloat32's own spread over the seeds: {spread}.\n"


def block_amax_source(prefix: str = "amax") -> str:
    return f"- {fig('source.' + STUDIES[prefix])}\n"


def block_amax_stress(prefix: str = "amax") -> str:
    d, _ = _study(prefix)
    kinds = [k for k in d["settings"]["kinds"] if k != "float32"]
    variants = sorted({r["variant"] for r in d["runs"]} - {"default"})
    lines = ["| variant | steps | " + " | ".join(kinds) + " |", "| --- " * (len(kinds) + 2) + "|"]
    for v in variants:
        cells = []
        for k in kinds:
            runs = _runs(d, v, k)
            gap = _gap(d, v, k)
            cells.append(
                _cell(runs, lambda r: str(r["skipped"])) + (f" ({gap:+.4f})" if runs else "")
            )
        steps = _runs(d, v, kinds[0])[0]["steps"]
        lines.append(f"| {v} | {steps} | " + " | ".join(cells) + " |")
    seeds = ", ".join(map(str, d["settings"]["stress_seeds"]))
    text = "\n".join(lines) + (
        f"\n\nSkipped steps per seed ({seeds}), and the mean eval-loss gap to float32.\n"
    )
    if "torch" in kinds and "dynamic" in kinds:
        same = [
            v for v in ["default", *variants] if _skips(d, v, "torch") == _skips(d, v, "dynamic")
        ]
        differ = [v for v in ["default", *variants] if v not in same]
        text += (
            f"\n`torch` skipped as many steps as `dynamic` in every seed of: "
            f"{', '.join(f'`{v}`' for v in same) or 'none'}; not in: "
            f"{', '.join(f'`{v}`' for v in differ) or 'none'}.\n"
        )
    return text


def _skips(d: dict[str, Any], variant: str, kind: str) -> list[int]:
    return [r["skipped"] for r in _runs(d, variant, kind)]


def _per_run_table(d: dict[str, Any], cols: list[str], cell: Callable[[dict], str]) -> str:
    keys = sorted({(r["variant"], r["seed"]) for r in d["runs"]},
                  key=lambda vs: (vs[0] != "default", vs))  # fmt: skip
    by = {(r["variant"], r["seed"], r["kind"]): r for r in d["runs"]}
    lines = ["| run | " + " | ".join(cols) + " |", "| --- " * (len(cols) + 1) + "|"]
    for v, s in keys:
        cells = [cell(by[(v, s, k)]) if (v, s, k) in by else "" for k in cols]
        lines.append(f"| {v}, seed {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def block_amax_underflow(prefix: str = "amax") -> str:
    d, _ = _study(prefix)
    kinds = [k for k in d["settings"]["kinds"] if k not in ("float32", "torch")]
    return _per_run_table(
        d, kinds, lambda r: f"{r['scale_underflow']:.0e} ({r['first_scale_underflow']:.0e})"
    )


def block_amax_first_step(prefix: str = "amax") -> str:
    d, _ = _study(prefix)
    kinds = [k for k in d["settings"]["kinds"] if k != "float32"]
    return _per_run_table(d, kinds, lambda r: f"{r['first_underflow']:.1e}")


def block_amax_past_line(prefix: str = "amax") -> str:
    d, _ = _study(prefix)
    kinds = [k for k in d["settings"]["kinds"] if k != "float32"]
    # The all-float16 model has no float32-only leaf: every leaf counts.
    which = "all_leaves" if d["settings"].get("grads") == "float16" else "float16_path"
    return _per_run_table(
        d, kinds, lambda r: f"{r['past_65504_' + which]} ({r['largest_' + which]:.2f})"
    )


def block_amax_scales(prefix: str = "amax") -> str:
    d, _ = _study(prefix)
    kinds = [k for k in d["settings"]["kinds"] if k != "float32"]
    return _per_run_table(d, kinds, lambda r: f"{r['mean_log2_scale']:.2f}")


def block_amax_leaf_groups(prefix: str = "amax") -> str:
    d, _ = _study(prefix)
    return _per_run_table(
        d,
        d["settings"]["kinds"],
        lambda r: f"{r['float32_only_sets_amax']:.0%} ({r['float32_only_gap_log2']:.2f})",
    )


def block_amax_growth(prefix: str = "amax") -> str:
    d, _ = _study(prefix)
    return _per_run_table(d, d["settings"]["kinds"], lambda r: f"{r['growth_log2']:.2f}")


# ---- the benchmark blocks -----------------------------------------------------


def block_step_table() -> str:
    names = {
        "auto": '**`loss_scaled`, default (`"auto"`)**',
        "reference": '`loss_scaled`, `backend="reference"`',
        "ffi": '`loss_scaled`, `backend="ffi"`',
        "amax": "`loss_scaled` with `amax_scaler()`",
        "handwritten": "hand-written exact skip (no library)",
        "optax": "optax `apply_if_finite` (static scale)",
        "flax": "flax `DynamicScale`",
        "jmp": "jmp `DynamicLossScale`",
    }
    f = figures()
    lines = [
        "| candidate | float16 compute | float32 compute |",
        "| --- | ---: | ---: |",
        f"| plain step ({fig('step.f16.plain_ms')}; {fig('step.f32.plain_ms')}) | 1 | 1 |",
    ]
    for key, label in names.items():
        cells = [f.get(f"step.{s}.{key}", Fig("not run", "")).text for s in DTYPES]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def block_compile_table() -> str:
    names = {"auto": "**`loss_scaled`, default**", "reference": "`loss_scaled`, reference",
             "flax": "flax `DynamicScale`", "optax": "optax `apply_if_finite`",
             "jmp": "jmp `DynamicLossScale`"}  # fmt: skip
    head = " | ".join(f"{n:,}" for n in COMPILE_LEAVES)
    lines = [f"| parameter leaves | {head} |", "| --- |" + " ---: |" * len(COMPILE_LEAVES)]
    lines.append(
        "| plain step | " + " | ".join(fig(f"compile.{n}.plain_s") for n in COMPILE_LEAVES) + " |"
    )
    for key, label in names.items():
        lines.append(
            f"| {label} | " + " | ".join(fig(f"compile.{n}.{key}") for n in COMPILE_LEAVES) + " |"
        )
    return "\n".join(lines) + "\n"


def block_pass_table() -> str:
    lines = ["| dtype, leaves | / torch, one call | / torch, in a program | / limit, one call "
             "| / limit, in a program |", "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for short, dtype in DTYPES.items():
        for n in PASS_LEAVES:
            cells = [
                fig(f"pass.{h}.{b}.{short}.{n}")
                for b in ("torch", "limit")
                for h in ("call", "inside")
            ]
            cells = [cells[0], cells[2], cells[1], cells[3]]
            lines.append(f"| {dtype}, {n:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def block_targets() -> str:
    lines = ["| target | the default path | status |", "| --- | ---: | --- |"]
    f = figures()
    for name, what, figure, _most in TARGETS:
        if f"target.{name}" in f:
            shown = f[figure].text if figure in f else "-"
            lines.append(f"| {what} | {shown} | {fig(f'target.{name}')} |")
    lines.append("| on a GPU | never run | not measured |")
    return "\n".join(lines) + "\n"


def block_readme_performance() -> str:
    return (
        f"- A `loss_scaled` training step costs {fig('step.f16.auto')} the plain step with "
        f"float16 compute and {fig('step.f32.auto')} with float32 compute (target at most "
        f"1.0x: float16 **{fig('target.step.f16')}**, float32 **{fig('target.step.f32')}**); "
        f"the peers' steps cost {fig('step.f16.peers.range')} (float16) and "
        f"{fig('step.f32.peers.range')} (float32).\n"
        f"- Compiling the step takes {fig('compile.auto.range')} the plain step's time "
        f"(target at most 1.3x: **{fig('target.compile')}**).\n"
        f"- The fused gradient pass inside a compiled program: at worst "
        f"{fig('pass.inside.torch.worst')} torch's fused op (**{fig('target.pass.inside.torch')}**) "
        f"and {fig('pass.inside.limit.worst')} the memory-bandwidth limit's time "
        f"(**{fig('target.pass.inside.limit')}**).\n\n"
        f"From {fig('source.bench.step')} and the other workloads of that file.\n"
    )


def block_bench_sources() -> str:
    lines = []
    for w, run in bench_runs().items():
        p = {**run["machine"], "command": run["command"]}
        lines.append(f"- {w}: " + provenance_line(p, "bench/results.json").split(": ", 1)[1])
    return "\n".join(lines) + "\n"


def block_demo_summary() -> str:
    rows = [
        ("final scale", fig("demo.final_scale")),
        ("last loss (batch)", fig("demo.last_batch_loss")),
        ("loss (all data)",
         f"{fig('demo.eval_loss')} (float32: {fig('demo.baseline_eval_loss')}, {fig('demo.gap')})"),
    ]  # fmt: skip
    body = "\n".join(f"| {k:<17} | {v:<40} |" for k, v in rows)
    return f"```text\n{body}\n```\n\nfrom {fig('source.demo')}.\n"


def block_transformer_table() -> str:
    modes = result("transformer_lm")["data"]["modes"]
    marks = list(next(iter(modes.values()))["smoothed_loss"])
    lines = ["| mode | " + " | ".join(f"step {m}" for m in marks) + " | eval loss | zeros at init |",
             "| --- " * (len(marks) + 3) + "|"]  # fmt: skip
    for mode, m in modes.items():
        cells = [f"{m['smoothed_loss'][k]:.4f}" for k in marks]
        cells += [fig(f"lm.{mode}.eval_loss"), fig(f"lm.{mode}.zeros")]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\nFrom {fig('source.transformer_lm')}.\n"


def block_transformer_summary() -> str:
    return (
        f"float16 with loss scaling tracks float32 (evaluation loss "
        f"{fig('lm.float16+scaling.gap')}); float16 without scaling falls behind "
        f"({fig('lm.float16.gap')}): at initialisation {fig('lm.float16.zeros')} of its "
        f"gradient entries are exactly zero against {fig('lm.float32.zeros')} in float32 "
        "(the embedding rows of bytes absent from the batch).  With the plain mean "
        "(`--global-batch-tokens 2048`, gradients 128 times larger) this small model does "
        f"not need scaling: evaluation loss float32 {fig('lm_mean.float32.eval_loss')}, "
        f"float16 without scaling {fig('lm_mean.float16.eval_loss')} "
        f"({fig('source.transformer_lm_mean')}).\n"
    )


def block_torch_twin() -> str:
    return (
        f'Against torch {fig("twin.torch")} (`GradScaler("cpu")`, '
        f'`autocast("cpu", float16)`), {fig("twin.steps")} steps: float32 losses agree '
        f"within {fig('twin.f32.max_diff')} at every step (tolerance "
        f"{fig('twin.f32.tolerance')}), float16 within {fig('twin.f16.max_diff')} (tolerance "
        f"{fig('twin.f16.tolerance')}), and the scale is {fig('twin.scales')}.  From "
        f"{fig('source.transformer_lm_torch')}.\n"
    )


def block_readme_commands() -> str:
    p = result("readme_commands")["provenance"]
    return (
        "Both commands, timed in a fresh clone and venv on a "
        f"{p['cores (os.cpu_count)']}-core {p['cpu'].strip()} ({p['date (UTC)'][:10]}, "
        f"load average {p['load average at start'].split()[0]} at the start, jax "
        f"{fig('readme.tests.jax')}): the demo's install {fig('readme.demo.install')} and the demo "
        f"{fig('readme.demo.run')}; the tests' install {fig('readme.tests.install')} and the "
        f"tests {fig('readme.tests.run')} ({fig('readme.tests.passed')} passed, "
        f"{fig('readme.tests.skipped')} skipped).  The install compiles the native handlers.  "
        "`python tools/figures.py record readme_commands` "
        "times them again.\n"
    )


BLOCKS: dict[str, Callable[[], str]] = {
    "readme-commands": block_readme_commands,
    "torch-twin": block_torch_twin,
    "transformer-table": block_transformer_table,
    "transformer-summary": block_transformer_summary,
    "demo-summary": block_demo_summary,
    "readme-performance": block_readme_performance,
    "bench-sources": block_bench_sources,
    "step-table": block_step_table,
    "compile-table": block_compile_table,
    "pass-table": block_pass_table,
    "targets": block_targets,
}
# Each study's tables: "amax-default" for the transformer, "all16-default" for
# the all-float16 model, ...: the parts each study's page shows.
_STUDY_BLOCKS = {
    "source": block_amax_source,
    "default": block_amax_default,
    "stress": block_amax_stress,
    "first-step": block_amax_first_step,
    "underflow": block_amax_underflow,
    "past-line": block_amax_past_line,
    "growth": block_amax_growth,
    "scales": block_amax_scales,
    "leaf-groups": block_amax_leaf_groups,
}
_SHOWN = {
    "amax": list(_STUDY_BLOCKS),
    "all16": [p for p in _STUDY_BLOCKS if p != "leaf-groups"],  # no float32-only leaf
    "large": ["source", "default", "stress", "first-step", "scales", "leaf-groups"],
    "large_lr2e3": ["source", "default"],
}
for _prefix, _parts in _SHOWN.items():
    for _part in _parts:
        BLOCKS[f"{_prefix}-{_part}"] = functools.partial(_STUDY_BLOCKS[_part], _prefix)


def render(text: str) -> str:
    """`text` with every figures block regenerated."""

    def one(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in BLOCKS:
            raise KeyError(f"no figures block named {name!r} (one of {sorted(BLOCKS)})")
        return m.group(1) + BLOCKS[name]() + m.group(4)

    return BLOCK.sub(one, text)


# ---- recording -----------------------------------------------------------------


def provenance(command: str) -> dict[str, str]:
    """The machine, the versions, the command and the date, taken at the start."""
    import importlib

    def out(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    info = {
        "command": command,
        "date (UTC)": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "cpu": out("sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
        or platform.machine(),
        "cores (os.cpu_count)": str(os.cpu_count()),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "jax_amp_scale commit": out("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"),
    }
    for mod in ("jax", "jaxlib", "numpy", "optax", "torch", "flax"):
        try:
            info[mod] = str(importlib.import_module(mod).__version__)
        except ImportError:
            info[mod] = "not installed"
    return info


# name -> the command that measures it ({json}: where it writes its figures;
# {tmp}: a scratch folder)
RECORDERS = {
    "readme_commands": ["tools/time_readme_commands.py", "--json", "{json}"],
    "transformer_lm_torch": ["examples/transformer_lm_torch.py", "--json", "{json}"],
    "demo": ["-m", "jax_amp_scale.demo", "--quiet", "--no-plot", "--json", "{json}"],
    "transformer_lm": ["examples/transformer_lm.py", "--check", "--out-dir", "{tmp}",
                       "--json", "{json}"],
    "transformer_lm_mean": ["examples/transformer_lm.py", "--global-batch-tokens", "2048",
                            "--modes", "float32,float16", "--out-dir", "{tmp}", "--json", "{json}"],
}  # fmt: skip


def record(name: str) -> None:
    args = RECORDERS[name]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.json"
        hidden = {"--json", "{json}", "--out-dir", "{tmp}"}
        info = provenance(shlex.join(["python", *(a for a in args if a not in hidden)]))
        cmd = [sys.executable, *(a.format(json=path, tmp=tmp) for a in args)]
        subprocess.run(cmd, check=True, cwd=ROOT)
        write_result(name, info, json.loads(path.read_text()))


def adopt(name: str, path: Path, started: Path) -> None:
    """A result a long run wrote: `started` holds what was taken at its start."""
    info = provenance("")
    info |= json.loads(started.read_text())
    write_result(name, info, json.loads(path.read_text()))


def write_result(name: str, info: dict[str, str], data: Any) -> None:
    RESULTS.mkdir(exist_ok=True)
    target = RESULTS / f"{name}.json"
    target.write_text(json.dumps({"provenance": info, "data": data}, indent=1) + "\n")
    print(f"wrote {target.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    sub.add_parser("record").add_argument("name", choices=sorted(RECORDERS))
    a = sub.add_parser("adopt")
    a.add_argument("name")
    a.add_argument("path", type=Path)
    a.add_argument("--started", type=Path, required=True)
    for verb in ("write", "check", "list"):
        sub.add_parser(verb)
    args = ap.parse_args(argv)
    if args.verb == "record":
        record(args.name)
    elif args.verb == "adopt":
        adopt(args.name, args.path, args.started)
    elif args.verb == "list":
        for k, v in sorted(figures().items()):
            print(f"{k:40} {v.text:30} {v.source}")
    else:
        stale, failed = [], []
        for page in PAGES:
            where = str(page.relative_to(ROOT))
            old = page.read_text()
            try:
                new = render(old)
            except (KeyError, FileNotFoundError) as e:
                failed.append(f"{where}: {e}")
                continue
            if new != old:
                stale.append(where)
                if args.verb == "write":
                    page.write_text(new)
        for line in failed:
            print("cannot render", line, file=sys.stderr)
        if args.verb == "check" and stale:
            print("stale figures blocks (python tools/figures.py write):", *stale, sep="\n  ")
        if failed or (args.verb == "check" and stale):
            return 1
        print(("rewrote: " + ", ".join(stale)) if stale else "every figures block is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
