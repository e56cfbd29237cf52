"""The benchmark's figures, tables, targets and pictures, from results/bench.json."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from figures_data import (
    Fig,
    bench_runs,
    drawn_mark,
    entries,
    machine,
    median_text,
    provenance_line,  # fmt: skip
    ratio_text,
    seconds_text,
    status,
    verdict,
)
from figures_data import (
    md_table as _md,
)

Figs = dict[str, Fig]
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


def _table(workload: str, title_has: str) -> tuple[dict[str, Any], str, str]:
    """The table of `workload` whose title contains `title_has`, its source and its run."""
    for w, run in bench_runs().items():
        for t in run["tables"]:
            if t["workload"] == workload and title_has in t["title"]:
                return t, f"{SRC} ({w}: {t['title']})", w
    raise KeyError(f"{SRC} has no {workload!r} table titled *{title_has}*")


def _row(table: dict[str, Any], prefix: str) -> dict[str, Any]:
    for r in table["rows"]:
        if r["name"].startswith(prefix):
            return r
    raise KeyError(f"{table['title']!r} has no row {prefix!r}")


def _paired(table: dict[str, Any], row: str, base: str) -> list[float]:
    a, b = _row(table, row)["times"], _row(table, base)["times"]
    return [x / y for x, y in zip(a, b, strict=True)]


def _put(out: Figs, values: dict[str, float], name: str, ratios: list[float], src: str) -> None:
    out[name] = Fig(ratio_text(ratios), src)
    out[f"{name}.median"] = Fig(median_text(ratios), src)
    values[name] = statistics.median(ratios)


def _step(out: Figs, values: dict[str, float]) -> None:
    for short, dtype in DTYPES.items():
        t, src, _w = _table("1. Step overhead", f"{dtype} compute")
        out[f"step.{short}.plain_ms"] = Fig(f"{statistics.median(_row(t, 'plain')['times']) * 1e3:.0f} ms", src)  # fmt: skip
        out["step.reps"] = Fig(f"{t['reps']}", src)
        for key, prefix in STEP_ROWS.items():
            try:
                ratios = _paired(t, prefix, "plain")
            except KeyError:
                continue  # a candidate that run did not measure
            _put(out, values, f"step.{short}.{key}", ratios, src)
            out[f"step.{short}.{key}.verdict"] = Fig(verdict(ratios, "the plain step"), src)
        for key, row, base in (("amax_vs_auto", "amax", "auto"),
                               ("auto_vs_handwritten", "auto", "handwritten")):  # fmt: skip
            try:
                _put(out, values, f"step.{short}.{key}",
                     _paired(t, STEP_ROWS[row], STEP_ROWS[base]), src)  # fmt: skip
            except KeyError:
                continue
        peers = [values[f"step.{short}.{p}"] for p in PEERS if f"step.{short}.{p}" in values]
        out[f"step.{short}.peers.range"] = Fig(f"{min(peers):.2f}-{max(peers):.2f}x", src)
        values[f"step.{short}.peers.fastest"] = min(peers)


def _compile(out: Figs, values: dict[str, float]) -> None:
    meds = []
    for n in COMPILE_LEAVES:
        t, src, _ = _table("3. Compile time", f", {n} parameter leaves")
        out[f"compile.{n}.plain_s"] = Fig(seconds_text(statistics.median(_row(t, "plain")["times"])), src)  # fmt: skip
        out[f"compile.{n}.reps"] = Fig(f"{t['reps']}", src)
        for key, prefix in COMPILE_ROWS.items():
            try:
                ratios = _paired(t, prefix, "plain")
            except KeyError:
                out[f"compile.{n}.{key}"] = Fig("not run", src)
                continue
            out[f"compile.{n}.{key}"] = Fig(median_text(ratios), src)
            meds += [statistics.median(ratios)] if key == "auto" else []
    ran = {int(t["title"].split(", ")[1].split()[0]): [r["name"] for r in t["rows"]]
           for t in bench_runs()["compile"]["tables"] if t["workload"] == "3. Compile time"}  # fmt: skip
    every = [n for n, rows in ran.items() if STEP_ROWS["auto"] in rows]
    alone = [f"{n:,}" for n, rows in ran.items() if rows == ["plain"]]
    out["compile.leaves"] = Fig(f"{every[0]:,} to {every[-1]:,} parameter leaves"
                                + (f" ({', '.join(alone)}: the plain step alone)" if alone else ""),
                                f"{SRC} (compile)")  # fmt: skip
    out["compile.auto.range"] = Fig(f"{min(meds):.1f}-{max(meds):.1f}x", f"{SRC} (compile)")
    values["compile.auto.worst"] = max(meds)


def _pass(out: Figs, values: dict[str, float]) -> None:
    worst: dict[str, float] = {}
    skipped: set[str] = set()
    for short, dtype in DTYPES.items():
        for n in PASS_LEAVES:
            t, src, _ = _table("2. One pass over the gradients", f"MiB {dtype} over {n} leaves")
            out["pass.reps"] = Fig(f"{t['reps']}", src)
            for how in ("call", "inside"):
                for base in ("torch", "limit"):
                    name = f"pass.{how}.{base}"
                    try:
                        ratios = _paired(t, PASS_ROWS[how], PASS_ROWS[base])
                    except KeyError:  # not run (its budget): the target says so
                        out[f"{name}.{short}.{n}"] = Fig("not run", src)
                        skipped.add(f"{dtype} at {n:,} leaves")
                        continue
                    out[f"{name}.{short}.{n}"] = Fig(median_text(ratios), src)
                    worst[name] = max(worst.get(name, 0.0), statistics.median(ratios))
            ratios = _paired(t, PASS_ROWS["floor"], PASS_ROWS["torch"])
            out[f"pass.floor.torch.{short}.{n}"] = Fig(median_text(ratios), src)
    gap = f" ({', '.join(sorted(skipped))}: not run)" if skipped else ""
    for name, w in worst.items():
        values[f"{name}.worst"] = w
        out[f"{name}.worst"] = Fig(f"{w:.2f}x{gap}", f"{SRC} (unscale)")


def _operator(out: Figs) -> None:
    t, src, _ = _table("5. torch for scale", "float16 autocast")
    out["torch.gradscaler"] = Fig(ratio_text(_paired(t, "torch GradScaler step", "torch plain step")), src)  # fmt: skip
    t, src, _ = _table("4. The operator", "compile time")
    med = {p: statistics.median(_row(t, p)["times"]) for p in
           ("trivial", "update_scale(ffi)", "update_scale(reference), factors 2",
            "update_scale(reference), factors 1.1")}  # fmt: skip
    out["op.compile.ffi_s"] = Fig(seconds_text(med["update_scale(ffi)"]), src)
    out["op.compile.reference_s"] = Fig(seconds_text(med["update_scale(reference), factors 2"]), src)  # fmt: skip
    inexact = med["update_scale(reference), factors 1.1"]
    out["op.compile.inexact_s"] = Fig(seconds_text(inexact), src)
    for key, title in (("vmap", "vmap over 1024 states"), ("scan", "one state")):
        t, src, _ = _table("4. The operator", title)
        ratios = _paired(t, "ffi", "reference")
        out[f"op.{key}.ffi_verdict"] = Fig(verdict(ratios, "the reference"), src)
        for row in ("ffi", "reference"):
            us = statistics.median(_row(t, row)["times"]) * 1e6
            out[f"op.{key}.{row}_ns"] = Fig(f"{us * 1e3:.3g} ns", src)


def _multidevice(out: Figs) -> None:
    for layout in ("fsdp", "data_parallel"):
        t, src, _ = _table("7. Eight devices", f"{layout}: MLP")
        for key in ("native", "reference"):
            out[f"multi.{layout}.{key}"] = Fig(ratio_text(_paired(t, key, "plain")), src)


def figures(out: Figs) -> None:
    values: dict[str, float] = {}
    _step(out, values)
    _compile(out, values)
    _pass(out, values)
    _operator(out)
    if "multidevice" in bench_runs():
        _multidevice(out)
    for name, _what, figure, most in TARGETS:
        if figure in values:
            out[f"target.{name}"] = Fig(status(values[figure] <= most), SRC)
    for short in DTYPES:
        ok = values[f"step.{short}.auto"] <= values[f"step.{short}.peers.fastest"]
        out[f"target.peers.{short}"] = Fig(status(ok), f"{SRC} (step)")
    runs = entries()
    for w in bench_runs():
        out[f"source.bench.{w}"] = Fig(provenance_line(f"bench:{w}", runs[f"bench:{w}"], SRC), SRC)
        out[f"machine.bench.{w}"] = Fig(machine(runs[f"bench:{w}"]), SRC)


# ---- the blocks -----------------------------------------------------------------


def step_table(f: Figs) -> str:
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
    plain = f"plain step ({f['step.f16.plain_ms'].text}; {f['step.f32.plain_ms'].text})"
    rows = [[plain, "1", "1"]] + [
        [label, *(f.get(f"step.{s}.{key}", Fig("not run", "")).text for s in DTYPES)]
        for key, label in names.items()
    ]
    return _md(rows, ["candidate", "float16 compute", "float32 compute"], True) + _from(f, "step")


def compile_table(f: Figs) -> str:
    names = {"auto": "**`loss_scaled`, default**", "reference": "`loss_scaled`, reference",
             "flax": "flax `DynamicScale`", "optax": "optax `apply_if_finite`",
             "jmp": "jmp `DynamicLossScale`"}  # fmt: skip
    rows = [["plain step", *(f[f"compile.{n}.plain_s"].text for n in COMPILE_LEAVES)]]
    rows += [[label, *(f[f"compile.{n}.{k}"].text for n in COMPILE_LEAVES)] for k, label in names.items()]  # fmt: skip
    rows += [["compiles per cell", *(f[f"compile.{n}.reps"].text for n in COMPILE_LEAVES)]]
    head = ["parameter leaves", *(f"{n:,}" for n in COMPILE_LEAVES)]
    return _md(rows, head, True) + _from(f, "compile")


PASS_COLUMNS = {  # header -> (how, against)
    "/ torch, one call": ("call", "torch"),
    "/ torch, in a program": ("inside", "torch"),
    "/ limit, one call": ("call", "limit"),
    "/ limit, in a program": ("inside", "limit"),
}


def pass_table(f: Figs) -> str:
    rows = [[f"{dtype}, {n:,}", *(f[f"pass.{h}.{b}.{short}.{n}"].text for h, b in PASS_COLUMNS.values())]
            for short, dtype in DTYPES.items() for n in PASS_LEAVES]  # fmt: skip
    return _md(rows, ["dtype, leaves", *PASS_COLUMNS], True) + _from(f, "unscale")


def targets(f: Figs) -> str:
    rows = [[what, f[fig].text if fig in f else "-", f[f"target.{name}"].text]
            for name, what, fig, _ in TARGETS if f"target.{name}" in f]  # fmt: skip
    rows.append(["on a GPU", "never run", "not measured"])
    ran = "".join(f"- {f[f'source.bench.{w}'].text}\n" for w in ("step", "compile", "unscale"))
    return _md(rows, ["target", "the default path", "status"], True) + "\nFrom:\n\n" + ran


def _from(f: Figs, workload: str) -> str:
    return f"\nFrom {f[f'source.bench.{workload}'].text}.\n"


def readme_performance(f: Figs) -> str:
    t = {k: f[k].text for k in f}
    return (
        f"- On a {t['machine.bench.step']}, a `loss_scaled` training step costs {t['step.f16.auto']} "
        f"the plain step with float16 compute and {t['step.f32.auto']} with float32 compute "
        f"(target at most 1.0x: float16 **{t['target.step.f16']}**, float32 "
        f"**{t['target.step.f32']}**); the peers' steps cost {t['step.f16.peers.range']} "
        f"(float16) and {t['step.f32.peers.range']} (float32).\n"
        f"- On a {t['machine.bench.compile']}, compiling the step takes {t['compile.auto.range']} "
        f"the plain step's time (target at most 1.3x: **{t['target.compile']}**).\n"
        f"- On a {t['machine.bench.unscale']}, the fused gradient pass inside a compiled program: "
        f"at worst {t['pass.inside.torch.worst']} torch's fused op "
        f"(**{t['target.pass.inside.torch']}**) and {t['pass.inside.limit.worst']} the "
        f"memory-bandwidth limit's time (**{t['target.pass.inside.limit']}**).\n\n"
        + "".join(f"- {t[f'source.bench.{w}']}\n" for w in ("step", "compile", "unscale"))
    )


def bench_sources(f: Figs) -> str:
    return "".join(f"- {w}: {f[f'source.bench.{w}'].text}\n" for w in bench_runs())


BLOCKS: dict[str, Callable[[Figs], str]] = {
    "readme-performance": readme_performance,
    "bench-sources": bench_sources,
    "step-table": step_table,
    "compile-table": compile_table,
    "pass-table": pass_table,
    "targets": targets,
}


# ---- the pictures -----------------------------------------------------------------


def draw(f: Figs, path: Path) -> None:
    """Step ratios (the pages' paired medians) and compile times, from the same figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in STEP_ROWS if f"step.f16.{k}" in f or f"step.f32.{k}" in f]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8))
    for i, (short, dtype) in enumerate(DTYPES.items()):
        xs = [
            float(f.get(f"step.{short}.{k}.median", Fig("nan", "")).text.rstrip("x")) for k in keys
        ]
        ys = [j + (i - 0.5) * 0.4 for j in range(len(keys))]
        top.barh(ys, xs, height=0.4, label=f"{dtype} compute", color=f"C{i}")
        for x, y in zip(xs, ys, strict=True):
            top.text(x, y, f" {x:g}" if math.isfinite(x) else "", va="center", fontsize=6)
    top.set_yticks(range(len(keys)), [STEP_ROWS[k] for k in keys], fontsize=7)
    top.invert_yaxis()
    top.axvline(1.0, color="k", lw=0.8)
    top.set(xlabel="median paired ratio to the plain step", title=f"Step overhead ({f['machine.bench.step'].text})")  # fmt: skip
    top.legend(fontsize=7)
    t = {n: _table("3. Compile time", f", {n} parameter leaves")[0] for n in COMPILE_LEAVES}
    for name in ["plain", *COMPILE_ROWS.values()]:
        pts = [(n, statistics.median(r["times"])) for n in COMPILE_LEAVES for r in t[n]["rows"]
               if r["name"].startswith(name)]  # fmt: skip
        if pts:
            bottom.loglog(*zip(*pts, strict=True), marker="o", label=name)
    bottom.set(xlabel="parameter leaves", ylabel="trace + compile (s)",
               title=f"Compile time ({f['machine.bench.compile'].text})")  # fmt: skip
    bottom.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"drawn from": drawn_mark("bench")})
    plt.close(fig)
