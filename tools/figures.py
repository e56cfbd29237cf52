"""Every published figure, from the results files that the measuring scripts wrote.

    python tools/figures.py record demo      # runs the demo; writes results/demo.json
    python tools/figures.py start amax_study "python examples/amax_scaler_study.py ..." > START.json
    python tools/figures.py adopt amax_study PATH --started START.json  # a long run's result
    python tools/figures.py write            # regenerates every figures block and picture
    python tools/figures.py check            # exit 1 when a block or picture is stale
    python tools/figures.py list             # every figure, by name

`figures()` names every figure, from results/ (figures_data.py); the docs cite one
with the ``{fig}`` role (docs/_ext/figures_role.py), and the pages hold the `BLOCKS`
between ``<!-- figures: NAME -->`` and ``<!-- /figures -->``.  A figure missing from its
file is a KeyError: the docs build and tests/docs/test_figures.py fail.  A timing is the
median of an interleaved run's paired ratios, with its spread (half the interquartile
range); a target's status is computed here, once, from the default path's figure.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from statistics import mean, median
from typing import Any

import figures_data as fd
from figures_data import BENCH, ROOT, entries, load, median_text, ratio_text, result, verdict
from tabulate import tabulate

Figs = dict[str, str]
PAGES = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "bench" / "RESULTS.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    ROOT / "examples/README.md",
]
BLOCK = re.compile(r"(<!-- figures: ([\w.-]+) -->\n)(.*?)(<!-- /figures -->)", re.S)
SRC = "results/bench.json"
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
DTYPES = {"f16": "float16", "f32": "float32"}
COMPILE = ((10, 100, 1000), ("auto", "reference", "jmp", "flax", "optax"))  # leaves, candidates
PASS_LEAVES = (1, 100, 10000)
PASS_ROWS = {
    "call": "ours unscale_and_check[auto]",
    "inside": "ours[auto] inside a program",
    "torch": "torch fused",
    "limit": "memory-bandwidth limit",
    "floor": "jit dispatch floor",
}
PASS_COLUMNS = [("call", "torch"), ("inside", "torch"), ("call", "limit"), ("inside", "limit")]
# Each target (its row in the targets block): the figure it reads and the most that may be.
TARGETS = {
    "step.f16": ("step.f16.auto", 1.0),
    "step.f32": ("step.f32.auto", 1.0),
    "amax": ("step.f32.amax_vs_auto", 1.01),
    "compile": ("compile.auto.worst", 1.3),
    **{
        f"pass.{k}": (f"pass.{k}.worst", 1.0 if k.endswith("torch") else 1.1)
        for k in ("inside.torch", "inside.limit", "call.torch", "call.limit")
    },
}


def _table(runs: dict[str, Any], workload: str, title_has: str) -> dict[str, Any]:
    for t in (t for run in runs.values() for t in run["tables"]):
        if t["workload"] == workload and title_has in t["title"]:
            return t
    raise KeyError(f"{SRC} has no {workload!r} table titled *{title_has}*")


def _times(t: dict[str, Any], prefix: str) -> list[float]:
    """The times of `t`'s row named `prefix...` ([] when that run did not measure it)."""
    return next((r["times"] for r in t["rows"] if r["name"].startswith(prefix)), [])


def _paired(t: dict[str, Any], row: str, base: str) -> list[float]:
    """The paired ratios of two rows ([] when either is missing)."""
    a, b = _times(t, row), _times(t, base)
    return [x / y for x, y in zip(a, b, strict=True)] if a and b else []


def _step_figures(runs: dict[str, Any], f: Figs, v: dict[str, float]) -> None:
    """The step overhead against the plain step, per compute dtype."""
    for short, dtype in DTYPES.items():
        t = _table(runs, "1. Step overhead", f"{dtype} compute")
        f[f"step.{short}.plain_ms"] = f"{median(_times(t, 'plain')) * 1e3:.0f} ms"
        f["step.reps"] = str(t["reps"])
        pairs = [("amax_vs_auto", "amax", "auto"), ("auto_vs_handwritten", "auto", "handwritten")]
        for key, row, base in [*((k, k, "plain") for k in STEP_ROWS), *pairs]:
            if r := _paired(t, STEP_ROWS[row], STEP_ROWS.get(base, base)):
                name = f"step.{short}.{key}"
                f[name], f[f"{name}.median"], v[name] = ratio_text(r), median_text(r), median(r)
                if base == "plain":
                    f[f"{name}.verdict"] = verdict(r, "the plain step")
        peers = [v[n] for p in ("jmp", "flax", "optax") if (n := f"step.{short}.{p}") in v]
        f[f"step.{short}.peers.range"] = f"{min(peers):.2f}-{max(peers):.2f}x"
        f[f"target.peers.{short}"] = "met" if v[f"step.{short}.auto"] <= min(peers) else "not met"


def _compile_figures(runs: dict[str, Any], f: Figs, v: dict[str, float]) -> None:
    """Trace + compile time against the plain step, per number of leaves."""
    meds = []
    for n in COMPILE[0]:
        t = _table(runs, "3. Compile time", f", {n} parameter leaves")
        f[f"compile.{n}.plain_s"] = fd.seconds_text(median(_times(t, "plain")))
        f[f"compile.{n}.reps"] = str(t["reps"])
        for key in COMPILE[1]:
            r = _paired(t, STEP_ROWS[key], "plain")
            f[f"compile.{n}.{key}"] = median_text(r) if r else "not run"
            meds += [median(r)] if r and key == "auto" else []
    f["compile.auto.range"] = f"{min(meds):.1f}-{max(meds):.1f}x"
    v["compile.auto.worst"] = max(meds)
    ran = {
        int(t["title"].split(", ")[1].split()[0]): [r["name"] for r in t["rows"]]
        for t in runs["compile"]["tables"]
        if t["workload"] == "3. Compile time"
    }
    every = [n for n, rows in ran.items() if STEP_ROWS["auto"] in rows]
    alone = ", ".join(f"{n:,}" for n, rows in ran.items() if rows == ["plain"])
    f["compile.leaves"] = f"{every[0]:,} to {every[-1]:,} parameter leaves" + (
        f" ({alone}: the plain step alone)" if alone else ""
    )


def _pass_figures(runs: dict[str, Any], f: Figs, v: dict[str, float]) -> None:
    """One pass over the gradients against torch and the bandwidth limit."""
    worst: dict[str, float] = {}
    skipped = set()
    for short, dtype in DTYPES.items():
        for n in PASS_LEAVES:
            t = _table(runs, "2. One pass over the gradients", f"MiB {dtype} over {n} leaves")
            f["pass.reps"] = str(t["reps"])
            for how, base in [*PASS_COLUMNS, ("floor", "torch")]:
                r, name = _paired(t, PASS_ROWS[how], PASS_ROWS[base]), f"pass.{how}.{base}"
                f[f"{name}.{short}.{n}"] = median_text(r) if r else "not run"
                if not r:  # not run (its budget): the target says so
                    skipped.add(f"{dtype} at {n:,} leaves")
                elif how != "floor":
                    worst[name] = max(worst.get(name, 0.0), median(r))
    gap = f" ({', '.join(sorted(skipped))}: not run)" if skipped else ""
    for name, w in worst.items():
        v[f"{name}.worst"], f[f"{name}.worst"] = w, f"{w:.2f}x{gap}"


def _operator_figures(runs: dict[str, Any], f: Figs) -> None:
    """torch's own GradScaler, the operator alone, and eight devices."""
    t = _table(runs, "5. torch for scale", "float16 autocast")
    f["torch.gradscaler"] = ratio_text(_paired(t, "torch GradScaler step", "torch plain step"))
    t = _table(runs, "4. The operator", "compile time")
    for key, row in (
        ("ffi_s", "update_scale(ffi)"),
        ("inexact_s", "update_scale(reference), factors 1.1"),
        ("reference_s", "update_scale(reference), factors 2"),
    ):
        f[f"op.compile.{key}"] = fd.seconds_text(median(_times(t, row)))
    for key, title in (("vmap", "vmap over 1024 states"), ("scan", "one state")):
        t = _table(runs, "4. The operator", title)
        f[f"op.{key}.ffi_verdict"] = verdict(_paired(t, "ffi", "reference"), "the reference")
        for row in ("ffi", "reference"):
            f[f"op.{key}.{row}_ns"] = f"{median(_times(t, row)) * 1e9:.3g} ns"
    for layout in ("fsdp", "data_parallel") if "multidevice" in runs else ():
        t = _table(runs, "7. Eight devices", f"{layout}: MLP")
        for key in ("native", "reference"):
            f[f"multi.{layout}.{key}"] = ratio_text(_paired(t, key, "plain"))


def bench_figures(runs: dict[str, Any]) -> Figs:
    f: Figs = {}
    v: dict[str, float] = {}  # the medians that the targets read
    _step_figures(runs, f, v)
    _compile_figures(runs, f, v)
    _pass_figures(runs, f, v)
    _operator_figures(runs, f)
    for name, (figure, most) in TARGETS.items():
        if figure in v:
            f[f"target.{name}"] = "met" if v[figure] <= most else "not met"
    p = entries()
    for w in runs:
        f[f"source.bench.{w}"] = fd.provenance_line(f"bench:{w}", p[f"bench:{w}"], SRC)
        f[f"machine.bench.{w}"] = fd.machine(p[f"bench:{w}"])
    return f


def _runs(d: dict[str, Any], variant: str, kind: str) -> list[dict[str, Any]]:
    """The study's runs of `variant` and `kind`, by seed."""
    return sorted(
        (r for r in d["runs"] if (r["variant"], r["kind"]) == (variant, kind)),
        key=lambda r: r["seed"],
    )


def _skips(d: dict[str, Any], variant: str, kind: str) -> str:
    return ", ".join(str(r["skipped"]) for r in _runs(d, variant, kind))


def _gap(d: dict[str, Any], variant: str, kind: str) -> float:
    ref = {r["seed"]: r["eval_loss"] for r in _runs(d, variant, "float32")}
    gaps = [r["eval_loss"] - ref[r["seed"]] for r in _runs(d, variant, kind) if r["seed"] in ref]
    return mean(gaps) if gaps else math.nan


def _power(x: float) -> str:
    return f"`2**{math.log2(x):.0f}`" if math.log2(x) == round(math.log2(x)) else f"{x:g}"


def _example_figures(f: Figs) -> None:
    """The demo's, the examples' and README's commands' figures, from results/NAME.json."""
    d = result("demo")
    f["demo.eval_loss"] = f"{d['eval_loss']:.4f}"
    f["demo.baseline_eval_loss"] = f"{d['baseline_eval_loss']:.4f}"
    f["demo.gap"] = f"{100 * (d['eval_loss'] / d['baseline_eval_loss'] - 1):+.1f}%"
    f["demo.final_scale"] = f"{d['final_scale']:g}"
    f["demo.last_batch_loss"] = f"{d['last_batch_loss']:.4f}"
    modes = result("transformer_lm")["modes"]
    for mode, m in modes.items():
        f[f"lm.{mode}.eval_loss"] = f"{m['eval_loss']:.4f}"
        f[f"lm.{mode}.zeros"] = f"{100 * m['grad_zeros_at_init']:.1f}%"
        f[f"lm.{mode}.gap"] = f"{m['eval_loss'] - modes['float32']['eval_loss']:+.4f}"
    for mode, m in result("transformer_lm_mean")["modes"].items():
        f[f"lm_mean.{mode}.eval_loss"] = f"{m['eval_loss']:.4f}"
    d = result("transformer_lm_torch")  # the JAX example against its torch twin
    f["twin.steps"], f["twin.torch"] = str(d["steps"]), d["torch"].split("+")[0]
    for mode, short in (("float32", "f32"), ("float16+scaling", "f16")):
        f[f"twin.{short}.max_diff"] = f"{d['modes'][mode]['max_diff']:.1e}"
        f[f"twin.{short}.tolerance"] = f"{d['modes'][mode]['tolerance']:g}"
    m = d["modes"]["float16+scaling"]
    changes = ", ".join(f"to {_power(v)} at step {s}" for s, v in m["scale_changes"])
    same = "the same at every step" if m["scales_equal"] else "different"
    changing = f", changing {changes})" if changes else ", never changing)"
    f["twin.scales"] = f"{same} ({_power(m['first_scale'])}{changing}"
    c = result("overflow_first")["excess_precision_check"]
    f["overflow.excess.compared"] = str(c["values_compared"])
    f["overflow.excess.changed"] = str(len(c["changed"]))
    d = result("readme_commands")["commands"]
    for name, r in d.items():
        f[f"readme.{name}.install"] = fd.minutes_text(r["install_seconds"])
        f[f"readme.{name}.run"] = fd.minutes_text(r["run_seconds"])
        f[f"readme.{name}.jax"] = r["jax"]
    f |= {f"readme.tests.{k}": f"{n:,}" for k, n in d["tests"]["counts"].items()}


# The search's summary counts, by figure name.
SEARCH = {"models": "models", "structures": "structures", "kept": "kept",
          "diverged": "twin_diverged", "fewer": "amax_fewer", "equal": "equal",
          "skips.amax": "skips_amax", "skips.dynamic": "skips_dynamic",
          "diverged_more": "amax_more_where_twin_diverged"}  # fmt: skip


def _amax_figures(f: Figs) -> None:
    """The amax search's and the amax study's figures."""
    d = result("amax_search")["summary"]
    d = {**d, "kept": d["models"] - d["twin_diverged"]}
    f |= {f"search.{name}": f"{d[key]:,}" for name, key in SEARCH.items()}
    d = result("amax_study")
    ev32 = [r["eval_loss"] for r in _runs(d, "default", "float32")]
    f["amax.default.seeds"] = str(len(ev32))
    f["amax.default.spread"] = f"{max(ev32) - min(ev32):.4f}"
    for kind in d["settings"]["kinds"]:
        for var in {r["variant"] for r in d["runs"]}:
            if _runs(d, var, kind):
                f[f"amax.{var}.{kind}.skipped"] = _skips(d, var, kind)
        f[f"amax.default.{kind}.gap"] = f"{_gap(d, 'default', kind):+.4f}"
        first = [r["first_underflow"] for r in _runs(d, "default", kind)]
        if first := [x for x in first if not math.isnan(x)]:
            f[f"amax.default.{kind}.first_underflow"] = f"{max(first):.2%}"
    growth = [r["growth_log2"] for r in d["runs"] if not math.isnan(r["growth_log2"])]
    f["amax.growth.max"] = f"{max(growth):.2f}"
    runs = [r for r in d["runs"] if not math.isnan(r.get("float32_only_sets_amax", math.nan))]
    if runs:
        share = [r["float32_only_sets_amax"] for r in runs]
        f["amax.float32_only.share"] = f"{min(share):.0%}-{max(share):.0%}"
        f["amax.float32_only.gap"] = f"{max(r['float32_only_gap_log2'] for r in runs):.2f}"


@cache
def figures() -> Figs:
    """Every named figure."""
    f = bench_figures(load(BENCH)["runs"])
    for name, p in entries().items():
        if not name.startswith("bench:"):
            f[f"source.{name}"] = fd.provenance_line(name, p, f"results/{name}.json")
    _example_figures(f)
    _amax_figures(f)
    return f


def fig(name: str) -> str:
    try:
        return figures()[name]
    except KeyError:
        raise KeyError(f"no figure named {name!r} (python tools/figures.py list)") from None


# ---- the blocks: from their templates (tools/figures_blocks.md), or made in code ---------


def _md(rows: list[list[str]], head: list[str], align: list[str] | None = None) -> str:
    """A markdown table, the cells as given (no number parsing); left-aligned unless `align`."""
    align = align or ["left"] * len(head)
    return tabulate(rows, head, tablefmt="github", colalign=align, disable_numparse=True) + "\n"


def _fill(f: Figs, template: str, missing: str | None = None) -> str:
    """`template` with each ``{NAME}`` the figure's text (`missing`, if given, where none is)."""
    return re.sub(
        r"\{([\w.+^-]+)\}", lambda m: f[m[1]] if missing is None else f.get(m[1], missing), template
    )


def _template(text: str) -> Callable[[Figs], str]:
    """A block from its template: the figures filled in, each table laid out by tabulate."""

    def block(f: Figs) -> str:
        out, table = [], []
        for line in [*text.splitlines(keepends=True), ""]:
            if line.startswith("|"):
                table.append([c.strip() for c in line.strip().strip("|").split("|")])
                continue
            if table:
                head, sep, *rows = table
                align = ["right" if c.endswith(":") else "left" for c in sep]
                out.append(_md([[_fill(f, c, "not run") for c in r] for r in rows], head, align))
                table = []
            out.append(_fill(f, line))
        return "".join(out)

    return block


def _per_run(skip: tuple[str, ...], cell: Callable[[dict[str, Any]], str]) -> Callable[[Figs], str]:
    """A table of the study: a row per variant and seed, a column per scaler not in `skip`."""

    def block(f: Figs) -> str:
        d = result("amax_study")
        cols = [k for k in d["settings"]["kinds"] if k not in skip]
        keys = sorted(
            {(r["variant"], r["seed"]) for r in d["runs"]}, key=lambda vs: (vs[0] != "default", vs)
        )
        by = {(r["variant"], r["seed"], r["kind"]): r for r in d["runs"]}
        rows = [
            [f"{v}, seed {s}", *(cell(by[v, s, k]) if (v, s, k) in by else "" for k in cols)]
            for v, s in keys
        ]
        return _md(rows, ["run", *cols])

    return block


def _study(f: Figs, stress: bool) -> str:
    d = result("amax_study")
    if not stress:
        rows = [
            [
                k,
                _skips(d, "default", k),
                ", ".join(f"{r['eval_loss']:.4f}" for r in _runs(d, "default", k)),
                f"{_gap(d, 'default', k):+.4f}",
            ]
            for k in d["settings"]["kinds"]
        ]
        head = ["scaler", "skipped steps per seed", "eval loss per seed", "mean gap to float32"]
        return (
            _md(rows, head)
            + f"\nfloat32's own spread over the seeds: {f['amax.default.spread']}.\n"
        )
    kinds = [k for k in d["settings"]["kinds"] if k != "float32"]
    rows = [
        [
            v,
            str(_runs(d, v, kinds[0])[0]["steps"]),
            *(
                _skips(d, v, k) + (f" ({_gap(d, v, k):+.4f})" if _runs(d, v, k) else "")
                for k in kinds
            ),
        ]
        for v in sorted({r["variant"] for r in d["runs"]} - {"default"})
    ]
    seeds = ", ".join(map(str, d["settings"]["stress_seeds"]))
    return (
        _md(rows, ["variant", "steps", *kinds])
        + f"\nSkipped steps per seed ({seeds}), and the mean eval-loss gap to float32.\n"
    )


def transformer_table(f: Figs) -> str:
    modes = result("transformer_lm")["modes"]
    marks = list(next(iter(modes.values()))["smoothed_loss"])
    rows = [
        [
            mode,
            *(f"{m['smoothed_loss'][k]:.4f}" for k in marks),
            f[f"lm.{mode}.eval_loss"],
            f[f"lm.{mode}.zeros"],
        ]
        for mode, m in modes.items()
    ]
    head = ["mode", *(f"step {m}" for m in marks), "eval loss", "zeros at init"]
    return _md(rows, head) + f"\nFrom {f['source.transformer_lm']}.\n"


def demo_summary(f: Figs) -> str:
    """As the demo prints its summary's last rows."""
    rows = [
        ("final scale", f["demo.final_scale"]),
        ("last loss (batch)", f["demo.last_batch_loss"]),
        (
            "loss (all data)",
            f"{f['demo.eval_loss']} (float32: {f['demo.baseline_eval_loss']}, {f['demo.gap']})",
        ),
    ]
    body = "\n".join(f"| {k:<17} | {v:<40} |" for k, v in rows)
    return f"```text\n{body}\n```\n\nfrom {f['source.demo']}.\n"


TEMPLATES = BLOCK.finditer((ROOT / "tools" / "figures_blocks.md").read_text())
BLOCKS: dict[str, Callable[[Figs], str]] = {m[2]: _template(m[3]) for m in TEMPLATES} | {
    "bench-sources": lambda f: "".join(
        f"- {w}: {f[f'source.bench.{w}']}\n" for w in load(BENCH)["runs"]
    ),
    "transformer-table": transformer_table,
    "demo-summary": demo_summary,
    "amax-default": lambda f: _study(f, stress=False),
    "amax-stress": lambda f: _study(f, stress=True),
    "amax-first-step": _per_run(("float32",), lambda r: f"{r['first_underflow']:.1e}"),
    "amax-underflow": _per_run(
        ("float32", "torch"),
        lambda r: f"{r['scale_underflow']:.0e} ({r['first_scale_underflow']:.0e})",
    ),
    "amax-past-line": _per_run(
        ("float32",), lambda r: f"{r['past_65504_float16_path']} ({r['largest_float16_path']:.2f})"
    ),
    "amax-growth": _per_run((), lambda r: f"{r['growth_log2']:.2f}"),
    "amax-scales": _per_run(("float32",), lambda r: f"{r['mean_log2_scale']:.2f}"),
    "amax-leaf-groups": _per_run(
        (), lambda r: f"{r['float32_only_sets_amax']:.0%} ({r['float32_only_gap_log2']:.2f})"
    ),
}


def render(text: str) -> str:
    """`text` with every figures block regenerated."""

    def one(m: re.Match[str]) -> str:
        if m.group(2) not in BLOCKS:
            raise KeyError(f"no figures block named {m.group(2)!r} (one of {sorted(BLOCKS)})")
        return m.group(1) + BLOCKS[m.group(2)](figures()) + m.group(4)

    return BLOCK.sub(one, text)


# Each picture and the results file it is drawn from: the benchmark's by `write`,
# the others by the run that `record` makes (the same run as the data).
PICTURES = {
    ROOT / "bench" / "results-summary.png": "bench",
    ROOT / "docs/_static/demo.png": "demo",
    ROOT / "docs/_static/transformer_lm.png": "transformer_lm",
}


def stale_pictures() -> list[Path]:
    """The pictures not drawn from their results file as it is now (by the digest they record)."""
    return [p for p, name in PICTURES.items() if fd.drawn_from(p) != fd.drawn_mark(name)]


def draw(f: Figs, path: Path) -> None:
    """Step ratios (the pages' paired medians) and compile times, from the same figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in STEP_ROWS if f"step.f16.{k}" in f or f"step.f32.{k}" in f]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8))
    for i, (short, dtype) in enumerate(DTYPES.items()):
        xs = [float(f.get(f"step.{short}.{k}.median", "nan").rstrip("x")) for k in keys]
        ys = [j + (i - 0.5) * 0.4 for j in range(len(keys))]
        top.barh(ys, xs, height=0.4, label=f"{dtype} compute", color=f"C{i}")
        for x, y in zip(xs, ys, strict=True):
            top.text(x, y, f" {x:g}" if math.isfinite(x) else "", va="center", fontsize=6)
    top.set_yticks(range(len(keys)), [STEP_ROWS[k] for k in keys], fontsize=7)
    top.invert_yaxis()
    top.axvline(1.0, color="k", lw=0.8)
    top.set(
        xlabel="median paired ratio to the plain step",
        title=f"Step overhead ({f['machine.bench.step']})",
    )
    t = {
        n: _table(load(BENCH)["runs"], "3. Compile time", f", {n} parameter leaves")
        for n in COMPILE[0]
    }
    for name in ["plain", *(STEP_ROWS[k] for k in COMPILE[1])]:
        if pts := [(n, median(_times(t[n], name))) for n in COMPILE[0] if _times(t[n], name)]:
            bottom.loglog(*zip(*pts, strict=True), marker="o", label=name)
    bottom.set(
        xlabel="parameter leaves",
        ylabel="trace + compile (s)",
        title=f"Compile time ({f['machine.bench.compile']})",
    )
    top.legend(fontsize=7)
    bottom.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"drawn from": fd.drawn_mark("bench")})
    plt.close(fig)


# name -> the command that measures it ({json}: where it writes its figures; {tmp}: a scratch folder)
RECORDERS = {
    "readme_commands": ["tools/time_readme_commands.py", "--json", "{json}"],
    "transformer_lm_torch": ["examples/transformer_lm_torch.py", "--json", "{json}"],
    "demo": ["-m", "jax_amp_scale.demo", "--quiet", "--out", "{tmp}/demo.png", "--json", "{json}"],
    "transformer_lm": [
        "examples/transformer_lm.py",
        "--check",
        "--out-dir",
        "{tmp}",
        "--json",
        "{json}",
    ],
    "overflow_first": [
        "examples/overflow_first.py",
        "--cost-reps",
        "100",
        "--check",
        "--out",
        "{json}",
    ],
    "transformer_lm_mean": [
        "examples/transformer_lm.py",
        "--global-batch-tokens",
        "2048",
        "--modes",
        "float32,float16",
        "--out-dir",
        "{tmp}",
        "--json",
        "{json}",
    ],
    "amax_search": ["-m", "tests._amax_search", "--json", "{json}"],
}


def record(name: str) -> None:
    args = RECORDERS[name]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.json"
        # The command as shown: without the scratch paths and the flags that take them.
        shown = [
            a
            for a, b in zip(args, [*args[1:], ""], strict=True)
            if "{" not in a and not (a.startswith("--") and "{" in b)
        ]
        info = fd.provenance(shlex.join(["python", *shown]), name)
        subprocess.run(
            [sys.executable, *(a.format(json=path, tmp=tmp) for a in args)], check=True, cwd=ROOT
        )
        write_result(name, info, json.loads(path.read_text()))
        if path.with_suffix(".md").exists():  # a report beside the figures (overflow_first)
            (fd.RESULTS / f"{name}.md").write_text(path.with_suffix(".md").read_text())
        for picture in (p for p, of in PICTURES.items() if of == name):
            shutil.copyfile(Path(tmp) / f"{name}.png", picture)  # where its command draws it
            fd.stamp(picture, name)


def adopt(name: str, path: Path, started: Path) -> None:
    """A result a long run wrote: `started` is what ``start`` printed when it began."""
    info = json.loads(started.read_text())
    if missing := {"commit", "dirty", "command", "sources"} - set(info):
        raise SystemExit(f"{started} lacks {sorted(missing)}: write it with `figures.py start`")
    write_result(name, info, json.loads(path.read_text()))


def write_result(name: str, info: dict[str, Any], data: Any) -> None:
    (target := fd.RESULTS / f"{name}.json").write_text(
        json.dumps({"provenance": info, "data": data}, indent=1) + "\n"
    )
    print(f"wrote {target.relative_to(ROOT)}")


def write(check: bool) -> int:
    """Regenerates (`check`: finds) every stale block and picture; 1 when one fails."""
    stale, failed = [], []
    for page in PAGES:
        try:
            if (new := render(old := page.read_text())) != old:
                stale.append(str(page.relative_to(ROOT)))
                if not check:
                    page.write_text(new)
        except (KeyError, FileNotFoundError) as e:
            failed.append(f"{page.relative_to(ROOT)}: {e}")
    for pic in stale_pictures():
        stale.append(str(pic.relative_to(ROOT)))
        if not check and PICTURES[pic] == "bench":
            draw(figures(), pic)
        elif not check:
            failed.append(
                f"{pic.relative_to(ROOT)}: python tools/figures.py record {PICTURES[pic]}"
            )
    for name, p in entries().items():
        if (why := fd.stale(p)) and name not in fd.STALE:
            failed.append(f"{name}: stale ({why}): measure it again or list it in STALE")
    for line in failed:
        print("cannot render", line, file=sys.stderr)
    if check and stale:
        print("stale (python tools/figures.py write):", *stale, sep="\n  ")
    if failed or (check and stale):
        return 1
    print(("rewrote: " + ", ".join(stale)) if stale else "every figures block is current")
    return 0


def main(argv: list[str] | None = None) -> int:
    verb, *args = (sys.argv[1:] if argv is None else argv) or ["help"]
    if verb == "record" and len(args) == 1 and args[0] in RECORDERS:
        record(args[0])
    elif verb == "start" and len(args) == 2:
        print(json.dumps(fd.provenance(args[1], args[0]), indent=1))
    elif verb == "adopt" and len(args) == 4 and args[2] == "--started":
        adopt(args[0], Path(args[1]), Path(args[3]))
    elif verb == "list" and not args:
        print(*(f"{k:40} {v}" for k, v in sorted(figures().items())), sep="\n")
    elif verb in ("write", "check") and not args:
        return write(check=verb == "check")
    else:
        print(
            __doc__.split("\n\n")[1],
            f"\nrecord NAME: one of {', '.join(RECORDERS)}",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
