"""Every published figure, from the results files that the measuring scripts wrote.

    python tools/figures.py record demo      # runs RECORDERS["demo"]; writes results/demo.json
    python tools/figures.py write            # regenerates every figures block
    python tools/figures.py check            # exit 1 when a block, picture or result is stale
    python tools/figures.py list             # every figure, by name

`figures()` names every figure: the benchmark's, computed here from results/bench.json, and
every other results file's own (its script renders them).  The docs cite one with the
``{fig}`` role (docs/_ext/figures_role.py); the pages hold blocks between
``<!-- figures: NAME -->`` and ``<!-- /figures -->``.  A figure missing from its file is a
KeyError: the docs build and tests/docs/test_figures.py fail.  A timing is the median of an
interleaved run's paired ratios, with its spread (half the interquartile range).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from statistics import median
from typing import Any

import figures_data as fd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _harness import Row, Table
from figures_data import BENCH, ROOT, entries, load, ratio_text, result, verdict
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
# The benchmark's tables by name: the workload's, then the groups of a pattern of the title
# ("step.float16", "pass.float32.100", "op.one_state"); a table none matches has no figures.
TABLES = {
    "1. Step overhead": ("step", r"(float16|float32) compute"),
    "2. One pass over the gradients": ("pass", r"(float16|float32) over (\d+) leaves"),
    "3. Compile time": ("compile", r", (\d+) parameter leaves"),
    "4. The operator": ("op", r"(vmap|one state|compile time)"),
    "5. torch for scale": ("torch", r"(autocast)"),
    "7. Eight devices": ("multi", r"^(\w+): MLP"),
}
# The rows by name: the first prefix of the row's name that matches, in this order.
ROWS = {
    "ours loss_scaled[auto]": "auto",
    "ours loss_scaled[reference]": "reference",
    "ours loss_scaled[ffi]": "ffi",
    "hand-written exact skip": "handwritten",
    "ours, no host reports": "no_reports",
    "ours amax_scaler": "amax",
    "jmp DynamicLossScale": "jmp",
    "flax DynamicScale": "flax",
    "optax apply_if_finite": "optax",
    "ours unscale_and_check[auto]": "call",
    "ours[auto] inside a program": "inside",
    "torch fused": "torch",
    "memory-bandwidth limit": "limit",
    "jit dispatch floor": "floor",
    "torch GradScaler step": "gradscaler",
    "update_scale(ffi)": "ffi",
    "update_scale(reference), factors 1.1": "inexact",
    "update_scale(reference), factors 2": "reference",
    "trivial jitted": "trivial",
    "plain copy": "copy",
    "plain": "plain",
    "torch plain": "plain",
    **{name: name for name in ("ffi", "reference", "native")},
}
# What a verdict compares to, by the baseline's name.
THAN = {
    "plain": "the plain step",
    "reference": "the reference",
    "copy": "a copy",
    "trivial": "a no-op",
}
# Each target (its row in the targets block): the figure it reads and the most that may be.
TARGETS = {
    "step.float16": ("step.float16.auto", 1.0),
    "step.float32": ("step.float32.auto", 1.0),
    "amax": ("step.float32.amax/auto", 1.01),
    "compile": ("compile.auto.worst", 1.3),
    **{f"pass.{k}": (f"pass.{k}.worst", 1.0) for k in ("inside/torch", "call/torch")},
    **{f"pass.{k}": (f"pass.{k}.worst", 1.1) for k in ("inside/limit", "call/limit")},
}


def _short(row: str) -> str | None:
    """The row's name in ROWS (None: it has no figures)."""
    return next((short for prefix, short in ROWS.items() if row.startswith(prefix)), None)


def _named(runs: dict[str, Any]) -> dict[str, tuple[Table, dict[str, Row]]]:
    """Each named table, with its rows by name."""
    out = {}
    for t in (Table.from_json(t) for run in runs.values() for t in run["tables"]):
        if t.workload in TABLES and (m := re.search(TABLES[t.workload][1], t.title)):
            name = ".".join([TABLES[t.workload][0], *m.groups()]).replace(" ", "_")
            out[name] = t, {short: r for r in t.rows if (short := _short(r.name))}
    return out


def bench_figures(runs: dict[str, Any]) -> Figs:
    """Each row's time, its paired ratio to the baseline (``T.A``, with its verdict) and to
    each other row of its table (``T.A/B``); the ranges, the worst cases and the targets."""
    f: Figs = {}
    v: dict[str, float] = {}  # the medians that the ranges, worst cases and targets read
    tables = _named(runs)
    for name, (t, rows) in tables.items():
        f[f"{name}.reps"], base = str(t.reps), _short(t.baseline or "")
        for a, row in rows.items():
            f[f"{name}.{a}.time"] = fd.seconds_text(row.median)
            for b, other in rows.items():
                if b == a:
                    continue
                r = [x / y for x, y in zip(row.times, other.times, strict=True)]
                key = f"{name}.{a}" if b == base else f"{name}.{a}/{b}"
                f[key], f[f"{key}.median"] = ratio_text(r), ratio_text(r, spread=False)
                v[key] = median(r)
                if b == base:
                    f[f"{key}.verdict"] = verdict(r, THAN[base])
    for dt in ("float16", "float32"):
        peers = [v[f"step.{dt}.{p}"] for p in ("jmp", "flax", "optax")]
        f[f"step.{dt}.peers.range"] = f"{min(peers):.2f}-{max(peers):.2f}x"
        f[f"target.peers.{dt}"] = "met" if v[f"step.{dt}.auto"] <= min(peers) else "not met"
    leaves = sorted(int(n.split(".")[1]) for n in tables if f"{n}.auto" in v and "compile." in n)
    meds = [v[f"compile.{n}.auto"] for n in leaves]
    f["compile.auto.range"] = f"{min(meds):.1f}-{max(meds):.1f}x"
    f["compile.leaves"] = f"{leaves[0]:,} to {leaves[-1]:,} parameter leaves"
    v["compile.auto.worst"] = max(meds)
    passes = [n for n in tables if n.startswith("pass.")]
    for k in ("inside/torch", "call/torch", "inside/limit", "call/limit"):
        missing = ", ".join(n for n in passes if f"{n}.{k}" not in v)
        v[f"pass.{k}.worst"] = worst = max(v[f"{n}.{k}"] for n in passes if f"{n}.{k}" in v)
        f[f"pass.{k}.worst"] = f"{worst:.2f}x" + (f" ({missing}: not run)" if missing else "")
    for name, (figure, most) in TARGETS.items():
        f[f"target.{name}"] = "met" if v[figure] <= most else "not met"
    p = entries()
    for w in runs:
        f[f"source.bench.{w}"] = fd.provenance_line(
            f"bench:{w}", p[f"bench:{w}"], "results/bench.json"
        )
        f[f"machine.bench.{w}"] = fd.machine(p[f"bench:{w}"])
    f["bench.sources"] = "".join(f"- {w}: {f[f'source.bench.{w}']}\n" for w in runs)
    return f


@cache
def figures() -> Figs:
    """Every named figure: the benchmark's, and each other results file's own (``NAME.KEY``)."""
    f = bench_figures(load(BENCH)["runs"])
    for name, p in entries().items():
        if not name.startswith("bench:"):
            f[f"source.{name}"] = fd.provenance_line(name, p, f"results/{name}.json")
            f |= {f"{name}.{k}": text for k, text in result(name).get("figures", {}).items()}
    return f


def fig(name: str) -> str:
    try:
        return figures()[name]
    except KeyError:
        raise KeyError(f"no figure named {name!r} (python tools/figures.py list)") from None


# ---- the blocks: from their templates (tools/figures_blocks.md), or a results file's own ----
BLOCKS = {m[2]: m[3] for m in BLOCK.finditer((ROOT / "tools/figures_blocks.md").read_text())}


def _fill(f: Figs, template: str, missing: str | None = None) -> str:
    """`template` with each ``{NAME}`` the figure's text (`missing`, if given, where none is)."""
    return re.sub(
        r"\{([\w.+^/-]+)\}",
        lambda m: f[m[1]] if missing is None else f.get(m[1], missing),
        template,
    )


def block(name: str, f: Figs) -> str:
    """The block NAME: its template with the figures filled in, each table laid out by
    tabulate; or, where no template has that name, the figure NAME (a results file's table)."""
    if name not in BLOCKS:
        return fig(name)
    out, table = [], []
    for line in [*BLOCKS[name].splitlines(keepends=True), ""]:
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if table:
            head, sep, *rows = table
            align = ["right" if c.endswith(":") else "left" for c in sep]
            cells = [[_fill(f, c, "not run") for c in r] for r in rows]
            out.append(tabulate(cells, head, "github", colalign=align, disable_numparse=True))
            out.append("\n")
            table = []
        out.append(_fill(f, line))
    return "".join(out)


def render(text: str) -> str:
    """`text` with every figures block regenerated."""
    return BLOCK.sub(lambda m: m.group(1) + block(m.group(2), figures()) + m.group(4), text)


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


# name -> the command that measures it ({json}: where it writes its results; {tmp}: scratch)
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
    """Runs NAME's command (RECORDERS) and writes results/NAME.json and its pictures."""
    info = fd.provenance(f"python {RECORDERS[name]}", name)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.json"
        args = [a.format(json=path, tmp=tmp) for a in RECORDERS[name].split()]
        subprocess.run([sys.executable, *args], check=True, cwd=ROOT)
        data = {"provenance": info, "data": json.loads(path.read_text())}
        (fd.RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
        if path.with_suffix(".md").exists():  # a report beside the figures (overflow_first)
            (fd.RESULTS / f"{name}.md").write_text(path.with_suffix(".md").read_text())
        for picture in (p for p, of in PICTURES.items() if of == name):
            shutil.copyfile(Path(tmp) / f"{name}.png", picture)  # where its command draws it
            fd.stamp(picture, name)
    print(f"wrote results/{name}.json")


def write(check: bool) -> int:
    """Regenerates (`check`: finds) every stale block; 1 when one is stale under `check`,
    or when a block, a picture or a result cannot be made current here."""
    stale, failed = [], []
    for page in PAGES:
        try:
            if (new := render(old := page.read_text())) != old:
                stale.append(str(page.relative_to(ROOT)))
                if not check:
                    page.write_text(new)
        except (KeyError, FileNotFoundError) as e:
            failed.append(f"{page.relative_to(ROOT)}: {e}")
    for pic, name in ((p, PICTURES[p]) for p in stale_pictures()):
        how = "bench/run_all.py --render" if name == "bench" else f"tools/figures.py record {name}"
        failed.append(f"{pic.relative_to(ROOT)}: stale (python {how})")
    failed += [
        f"{name}: stale ({why}): measure it again or list it in STALE"
        for name, p in entries().items()
        if (why := fd.stale(p)) and name not in fd.STALE
    ]
    for line in failed:
        print(f"cannot render {line}", file=sys.stderr)
    if stale:
        print("stale (python tools/figures.py write): " if check else "rewrote: ", *stale)
    elif not failed:
        print("every figures block is current")
    return int(bool(failed or (check and stale)))


def main(argv: list[str] | None = None) -> int:
    verb, *args = (sys.argv[1:] if argv is None else argv) or ["help"]
    if verb == "record" and len(args) == 1 and args[0] in RECORDERS:
        record(args[0])
    elif verb == "list" and not args:
        print(*(f"{k:40} {v}" for k, v in sorted(figures().items())), sep="\n")
    elif verb in ("write", "check") and not args:
        return write(check=verb == "check")
    else:
        commands = __doc__.split("\n\n")[1]
        print(f"{commands}\nrecord NAME: one of {', '.join(RECORDERS)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
