"""Every published figure, from the results files that the measuring scripts wrote.

    python tools/figures.py record demo        # runs the demo; writes results/demo.json
    python tools/figures.py start amax_study "python examples/amax_scaler_study.py ..." > START.json
    python tools/figures.py adopt amax_study PATH --started START.json
                                               # a long run: its provenance taken at its start
    python tools/figures.py write              # regenerates every figures block and picture
    python tools/figures.py check              # exit 1 when a block or picture is stale
    python tools/figures.py list               # every figure: name, text, source

Every results file is in ``results/`` (figures_data.py: the files, their
provenance and whether they are current).  `figures()` derives every named
figure from them (figures_bench.py: the benchmark; figures_runs.py: the
examples and studies); the docs cite one by name with the ``{fig}`` role
(docs/_ext/figures_role.py), and the pages hold generated blocks between
``<!-- figures: NAME -->`` and ``<!-- /figures -->``, which ``write``
regenerates.  A figure missing from its file is a KeyError: the docs build
and tests/docs/test_figures.py fail.

A timing is the median of an interleaved run's paired ratios with its spread
(half the interquartile range), written with no more digits than the spread
supports.  A target's status is computed here, once, from the default path's
figure.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import figures_bench
import figures_data
import figures_runs
from figures_data import RESULTS, ROOT, STALE, Fig, entries, provenance

PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "bench" / "RESULTS.md",
         *sorted((ROOT / "docs").rglob("*.md")), ROOT / "examples/README.md"]  # fmt: skip
BLOCK = re.compile(r"(<!-- figures: ([\w.-]+) -->\n)(.*?)(<!-- /figures -->)", re.S)
BLOCKS = {**figures_bench.BLOCKS, **figures_runs.BLOCKS}


@cache
def figures() -> dict[str, Fig]:
    """Every named figure."""
    out: dict[str, Fig] = {}
    figures_bench.figures(out)
    figures_runs.figures(out)
    return out


def fig(name: str) -> str:
    try:
        return figures()[name].text
    except KeyError:
        raise KeyError(f"no figure named {name!r} (python tools/figures.py list)") from None


def render(text: str) -> str:
    """`text` with every figures block regenerated."""

    def one(m: re.Match[str]) -> str:
        if m.group(2) not in BLOCKS:
            raise KeyError(f"no figures block named {m.group(2)!r} (one of {sorted(BLOCKS)})")
        return m.group(1) + BLOCKS[m.group(2)](figures()) + m.group(4)

    return BLOCK.sub(one, text)


# Each picture and the results file it is drawn from: the benchmark's by
# `write`, the others by the run that `record` makes (the same run as the data).
PICTURES = {
    ROOT / "bench" / "results-summary.png": "bench",
    ROOT / "docs" / "_static" / "demo.png": "demo",
    ROOT / "docs" / "_static" / "transformer_lm.png": "transformer_lm",
}
DRAWN_BY = {"demo": "demo.png", "transformer_lm": "transformer_lm.png"}  # in the run's {tmp}


def stale_pictures() -> list[Path]:
    """The pictures not drawn from their results file as it is now (by the digest they record)."""
    return [
        p
        for p, name in PICTURES.items()
        if figures_data.drawn_from(p) != figures_data.drawn_mark(name)
    ]


# ---- recording -----------------------------------------------------------------

# name -> the command that measures it ({json}: where it writes its figures;
# {tmp}: a scratch folder)
RECORDERS = {
    "readme_commands": ["tools/time_readme_commands.py", "--json", "{json}"],
    "transformer_lm_torch": ["examples/transformer_lm_torch.py", "--json", "{json}"],
    "demo": ["-m", "jax_amp_scale.demo", "--quiet", "--out", "{tmp}/demo.png", "--json", "{json}"],
    "transformer_lm": ["examples/transformer_lm.py", "--check", "--out-dir", "{tmp}",
                       "--json", "{json}"],
    "overflow_first": ["examples/overflow_first.py", "--cost-reps", "100", "--check",
                       "--out", "{json}"],
    "transformer_lm_mean": ["examples/transformer_lm.py", "--global-batch-tokens", "2048",
                            "--modes", "float32,float16", "--out-dir", "{tmp}", "--json", "{json}"],
    "amax_search": ["-m", "tests._amax_search", "--json", "{json}"],
}  # fmt: skip


def record(name: str) -> None:
    args = RECORDERS[name]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.json"
        # The command as shown: without the scratch paths and the flags that take them.
        shown = [a for a, b in zip(args, [*args[1:], ""], strict=True)
                 if "{" not in a and not (a.startswith("--") and "{" in b)]  # fmt: skip
        info = provenance(shlex.join(["python", *shown]), name)
        cmd = [sys.executable, *(a.format(json=path, tmp=tmp) for a in args)]
        subprocess.run(cmd, check=True, cwd=ROOT)
        write_result(name, info, json.loads(path.read_text()))
        if path.with_suffix(".md").exists():  # a report beside the figures (overflow_first)
            (RESULTS / f"{name}.md").write_text(path.with_suffix(".md").read_text())
        for picture, of in PICTURES.items():
            if of == name:
                shutil.copyfile(Path(tmp) / DRAWN_BY[name], picture)
                figures_data.stamp(picture, name)


def adopt(name: str, path: Path, started: Path) -> None:
    """A result a long run wrote: `started` is what ``start`` printed when it began
    (the commit and dirty flag then, not now)."""
    info = json.loads(started.read_text())
    if missing := {"commit", "dirty", "command", "sources"} - set(info):
        raise SystemExit(f"{started} lacks {sorted(missing)}: write it with `figures.py start`")
    write_result(name, info, json.loads(path.read_text()))


def write_result(name: str, info: dict[str, Any], data: Any) -> None:
    RESULTS.mkdir(exist_ok=True)
    target = RESULTS / f"{name}.json"
    target.write_text(json.dumps({"provenance": info, "data": data}, indent=1) + "\n")
    print(f"wrote {target.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    sub.add_parser("record").add_argument("name", choices=sorted(RECORDERS))
    s = sub.add_parser("start")
    s.add_argument("name")
    s.add_argument("command")
    a = sub.add_parser("adopt")
    a.add_argument("name")
    a.add_argument("path", type=Path)
    a.add_argument("--started", type=Path, required=True)
    for verb in ("write", "check", "list"):
        sub.add_parser(verb)
    args = ap.parse_args(argv)
    if args.verb == "record":
        record(args.name)
    elif args.verb == "start":
        print(json.dumps(provenance(args.command, args.name), indent=1))
    elif args.verb == "adopt":
        adopt(args.name, args.path, args.started)
    elif args.verb == "list":
        for k, v in sorted(figures().items()):
            print(f"{k:40} {v.text:30} {v.source}")
    else:
        stale, failed = [], []
        for page in PAGES:
            old = page.read_text()
            try:
                new = render(old)
            except (KeyError, FileNotFoundError) as e:
                failed.append(f"{page.relative_to(ROOT)}: {e}")
                continue
            if new != old:
                stale.append(str(page.relative_to(ROOT)))
                if args.verb == "write":
                    page.write_text(new)
        for pic in stale_pictures():
            stale.append(str(pic.relative_to(ROOT)))
            if args.verb == "write" and PICTURES[pic] == "bench":
                figures_bench.draw(figures(), pic)
            elif args.verb == "write":
                failed.append(
                    f"{pic.relative_to(ROOT)}: python tools/figures.py record {PICTURES[pic]}"
                )
        for name, p in entries().items():
            if (why := figures_data.stale(p)) and name not in STALE:
                failed.append(f"{name}: stale ({why}): measure it again or list it in STALE")
        for line in failed:
            print("cannot render", line, file=sys.stderr)
        if args.verb == "check" and stale:
            print("stale (python tools/figures.py write):", *stale, sep="\n  ")
        if failed or (args.verb == "check" and stale):
            return 1
        print(("rewrote: " + ", ".join(stale)) if stale else "every figures block is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
