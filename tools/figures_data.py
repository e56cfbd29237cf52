"""The results files, their provenance and whether they are still current; numbers as text.

Every results file lives in ``results/``: ``bench.json`` (``bench/run_all.py``,
one run per workload) and one file per recorded example or study.  Each run
records the commit, a dirty flag, the command, the machine and the source
paths it measures; `stale` says, from git, whether any of those paths changed
since the recorded commit.  A run that is not current must be listed in
`STALE` with the reason it is still shown, and its pages say so.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import subprocess
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
BENCH = RESULTS / "bench.json"

# What each recorded result measures, besides the script its command names.
PACKAGE = ["jax_amp_scale/operators", "jax_amp_scale/mechanisms", "jax_amp_scale/training", "ffi"]
HARNESS = ["bench/_harness.py", "bench/_steps.py"]
SOURCES = {
    "bench:step": HARNESS + PACKAGE,
    "bench:unscale": HARNESS + PACKAGE,
    "bench:compile": HARNESS + PACKAGE,
    "bench:update_scale": HARNESS + PACKAGE,
    "bench:torch": HARNESS,
    "bench:exact": PACKAGE,
    "bench:multidevice": HARNESS + PACKAGE,
    "demo": ["jax_amp_scale/demo.py", "jax_amp_scale/policy.py", *PACKAGE],
    "transformer_lm": ["examples/transformer_lm.py", *PACKAGE],
    "transformer_lm_mean": ["examples/transformer_lm.py", *PACKAGE],
    "transformer_lm_torch": ["examples/transformer_lm_torch.py", "examples/transformer_lm.py",
                             *PACKAGE],
    # README.md is not a source: its figures block shows this result, so writing
    # the block would make the result stale; the commands themselves are
    # checked against the recorded ones (tests/tools/test_time_readme_commands.py).
    "readme_commands": ["tools/time_readme_commands.py", "pyproject.toml", "tests",
                        "jax_amp_scale", "ffi"],
    "overflow_first": ["examples/overflow_first.py", "examples/transformer_lm.py", *PACKAGE],
    "amax_search": ["tests/_amax_search.py", *PACKAGE],
}  # fmt: skip
SOURCES["amax_study"] = ["examples/amax_scaler_study.py", "examples/transformer_lm.py", *PACKAGE]

# Results shown although they are not current, each with the reason.  The
# currency test fails on a stale result not listed here and on a listed one
# that is current again, so this list says exactly what is stale.
STALE = {
    "amax_study": "measured at d99b097 (hours of runs); the changes since to its sources are the "
    "Ascend saturation path (not traced off Ascend), the shared argument checks, docstrings "
    "and the study's removed amax1 kind, and a run of it again at this commit gave the same "
    "bits (tests/training/scalers/test_amax_study_current.py, slow)",
}

# Results whose recorded commit could not have run their command (the test
# lists them from git; each is in STALE).
FLAGS_LATER = []


class Fig(NamedTuple):
    text: str  # as a page shows it
    source: str  # the results file (and part) it comes from


# ---- the results files ---------------------------------------------------------


@cache
def load(path: Path) -> Any:
    return json.loads(path.read_text())


def result(name: str) -> dict[str, Any]:
    """results/NAME.json: ``{"provenance": {...}, "data": {...}}``."""
    return load(RESULTS / f"{name}.json")


def bench_runs() -> dict[str, Any]:
    return load(BENCH)["runs"]


def entries() -> dict[str, dict[str, Any]]:
    """Every recorded run by name (``bench:WORKLOAD`` or the file's stem): its provenance.

    A run recorded before runs named their sources is checked against `SOURCES`."""
    # bench/_harness.py marked a dirty tree with a "+dirty" suffix before it wrote a flag.
    out = {f"bench:{w}": {"dirty": False, **r["machine"], "command": r["command"],
                          "sources": r.get("sources")} for w, r in bench_runs().items()}  # fmt: skip
    for path in sorted(RESULTS.glob("*.json")):
        if path != BENCH:
            out[path.stem] = dict(result(path.stem)["provenance"])
    for name, p in out.items():
        if not p.get("sources"):
            p["sources"] = SOURCES[name] + [s for s in [script_of(p.get("command", ""))] if s]
    return out


# ---- pictures: each records the digest of the results file it was drawn from ----


def drawn_mark(name: str) -> str:
    """``NAME DIGEST``: what a picture drawn from results/NAME.json records."""
    text = (RESULTS / f"{name}.json").read_bytes()
    return f"{name} {hashlib.sha256(text).hexdigest()[:16]}"


def drawn_from(path: Path) -> str | None:
    from PIL import Image

    return Image.open(path).info.get("drawn from") if path.exists() else None


def stamp(path: Path, name: str) -> None:
    """Marks the picture at `path` as drawn from results/NAME.json as it is now."""
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("drawn from", drawn_mark(name))
    Image.open(path).save(path, pnginfo=info)


# ---- currency --------------------------------------------------------------------


def _git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)


def commit_and_dirty(p: dict[str, Any]) -> tuple[str, bool | None]:
    """The recorded commit and dirty flag (None: not recorded; a legacy ``+dirty`` suffix counts)."""
    commit = str(p.get("commit") or p.get("jax_amp_scale commit") or "")
    if commit.endswith("+dirty"):
        return commit.removesuffix("+dirty"), True
    return commit, p.get("dirty")


def stale(p: dict[str, Any], repo: Path = ROOT) -> str | None:
    """None when the run is provably current: recorded clean at a commit of this
    history, and none of its source paths changed since; else why not."""
    commit, dirty = commit_and_dirty(p)
    if not commit:
        return "no commit recorded"
    if dirty is None:
        return f"{commit}: no dirty flag recorded"
    if dirty:
        return f"{commit}: measured with uncommitted changes"
    if not p.get("sources"):
        return f"{commit}: no source paths recorded"
    if _git("merge-base", "--is-ancestor", commit, "HEAD", cwd=repo).returncode:
        return f"{commit}: not a commit of this history"
    # Committed changes: a stale figure cannot land, and an edit in progress fails nothing yet.
    diff = _git("diff", "--name-only", commit, "HEAD", "--", *p["sources"], cwd=repo)
    if changed := diff.stdout.split():
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return f"{commit}: changed since: {', '.join(changed[:3])}{more}"
    return None


def script_of(command: str) -> str | None:
    """The repository file a recorded command runs (``python X.py ...`` or ``-m pkg.mod``)."""
    words = command.split()
    if "-m" in words[:2]:
        return words[words.index("-m") + 1].replace(".", "/") + ".py"
    return next((w for w in words[1:2] if w.endswith(".py")), None)


def provenance(command: str, name: str) -> dict[str, Any]:
    """What a recorder takes at the start: commit, dirty flag, sources, machine, versions."""
    import importlib
    import os
    import platform
    import time

    sources = SOURCES[name] + [s for s in [script_of(command)] if s]
    head = _git("rev-parse", "--short", "HEAD").stdout.strip()
    dirty = bool(_git("status", "--porcelain", "--", *sources).stdout.strip())
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    info: dict[str, Any] = {
        "command": command,
        "date (UTC)": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "cpu": cpu or platform.machine(),
        "cores (os.cpu_count)": str(os.cpu_count()),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "commit": head,
        "dirty": dirty,
        "sources": sources,
    }
    for mod in ("jax", "jaxlib", "numpy", "optax", "torch", "flax"):
        try:
            info[mod] = str(importlib.import_module(mod).__version__)
        except ImportError:
            info[mod] = "not installed"
    return info


def machine(p: dict[str, Any]) -> str:
    """``2-core AMD EPYC``: the machine a run names."""
    return f"{p.get('cores (os.cpu_count)', '?')}-core {str(p.get('cpu', '?')).strip()}"


def provenance_line(name: str, p: dict[str, Any], where: str) -> str:
    load_avg = str(p.get("load average at start", "?")).split()[0]
    commit, dirty = commit_and_dirty(p)
    # The reason, not git's list of changed files: the text stays fixed between commits.
    note = f"; **stale**: {STALE[name]}" if name in STALE and stale(p) else ""
    return (
        f"`{where}`: {machine(p)}, commit {commit or '?'}{'+dirty' if dirty else ''}, "
        f"jax {p.get('jax', '?')}, load average at the start {load_avg}, "
        f"{p.get('date (UTC)', '?')} UTC, `{p.get('command', '?')}`{note}"
    )


def md_table(rows: list[list[str]], head: list[str], numbers_right: bool = False) -> str:
    """A markdown table; the cells as given (no number parsing)."""
    align = ["left"] + ["right" if numbers_right else "left"] * (len(head) - 1)
    return tabulate(rows, head, tablefmt="github", colalign=align, disable_numparse=True) + "\n"


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


def verdict(values: list[float], than: str) -> str:
    """``faster than X``, ``slower than X`` or ``no different from X`` (within the spread)."""
    med, sp = statistics.median(values), spread_of(values)
    if med + sp < 1:
        return f"faster than {than}"
    return f"slower than {than}" if med - sp > 1 else f"within its spread of {than}"


def seconds_text(s: float) -> str:
    if s >= 10:
        return f"{s:.0f} s"
    return f"{s:.2g} s" if s >= 0.1 else f"{s * 1e3:.2g} ms"


def minutes_text(s: float) -> str:
    """``3 min 16 s`` (whole seconds: a fresh install varies by more)."""
    m, sec = divmod(round(s), 60)
    return f"{m} min {sec} s" if m else f"{sec} s"


def status(ok: bool) -> str:
    return "met" if ok else "not met"
