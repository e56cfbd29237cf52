"""Every published figure, from the results files that the measuring scripts wrote.

    python tools/figures.py record demo      # runs the demo; writes results/demo.json
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
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from statistics import median
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


@cache
def figures() -> Figs:
    """Every named figure: the benchmark's, and each other results file's own (``NAME.KEY``)."""
    f = bench_figures(load(BENCH)["runs"])
    for name, p in entries().items():
        if not name.startswith("bench:"):
            f[f"source.{name}"] = fd.provenance_line(name, p, f"results/{name}.json")
            f |= {f"{name}.{k}": text for k, text in result(name)["figures"].items()}
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


TEMPLATES = BLOCK.finditer((ROOT / "tools" / "figures_blocks.md").read_text())
BLOCKS: dict[str, Callable[[Figs], str]] = {m[2]: _template(m[3]) for m in TEMPLATES} | {
    "bench-sources": lambda f: "".join(
        f"- {w}: {f[f'source.bench.{w}']}\n" for w in load(BENCH)["runs"]
    ),
}


def render(text: str) -> str:
    """`text` with every figures block regenerated."""

    def one(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in BLOCKS and "\n" not in figures().get(name, ""):
            raise KeyError(f"no figures block named {name!r} (one of {sorted(BLOCKS)})")
        text = BLOCKS[name](figures()) if name in BLOCKS else figures()[name]
        return m.group(1) + text + m.group(4)

    return BLOCK.sub(one, text)


# Each picture and the results file it is drawn from, by the command that wrote that file.
PICTURES = {
    ROOT / "bench" / "results-summary.png": "bench",
    ROOT / "docs/_static/demo.png": "demo",
    ROOT / "docs/_static/transformer_lm.png": "transformer_lm",
    ROOT / "docs/_static/amax_scaler.png": "amax_study",
}


def stale_pictures() -> list[Path]:
    """The pictures not drawn from their results file as it is now (by the digest they record)."""
    return [p for p, name in PICTURES.items() if fd.drawn_from(p) != fd.drawn_mark(name)]


# name -> the command that measures it ({json}: where it writes its figures; {tmp}: a scratch folder)
RECORDERS = {
    "readme_commands": "tools/time_readme_commands.py --json {json}",
    "transformer_lm_torch": "examples/transformer_lm_torch.py --json {json}",
    "demo": "-m jax_amp_scale.demo --quiet --out {tmp}/demo.png --json {json}",
    "transformer_lm": "examples/transformer_lm.py --check --out-dir {tmp} --json {json}",
    "overflow_first": "examples/overflow_first.py --cost-reps 100 --check --out {json}",
    "transformer_lm_mean": "examples/transformer_lm.py --global-batch-tokens 2048 "
    "--modes float32,float16 --out-dir {tmp} --json {json}",
    "amax_search": "-m tests._amax_search --json {json}",
    "amax_study": "examples/amax_scaler_study.py --steps 150 --seeds 0,1,2 "
    "--kinds amax,dynamic,float32 --stress init2^24-mean,accum8-mean,spike-mean,high-lr-mean "
    "--stress-seeds 0,1,2 --stress-kinds amax,dynamic,float32 "
    "--out-dir {tmp} --plot {tmp}/amax_study.png --json {json}",
}


def record(name: str) -> None:
    args = RECORDERS[name].split()
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
        name = PICTURES[pic]
        how = "bench/run_all.py --render" if name == "bench" else f"tools/figures.py record {name}"
        failed.append(f"{pic.relative_to(ROOT)}: stale (python {how})")
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
