"""The results files (results/), their provenance and whether they are current; numbers as text.

Each run records its commit, a dirty flag, the command, the machine and the source paths
it measures; `stale` says from git whether any of those paths changed since.  A stale run
is shown only when `STALE` lists it with a reason (its pages then say **stale**).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
BENCH = RESULTS / "bench.json"  # bench/run_all.py: one run per workload

# What each recorded result measures: its script and what that runs.
PACKAGE = ["jax_amp_scale/operators", "jax_amp_scale/mechanisms", "jax_amp_scale/training", "ffi"]
LM = ["examples/transformer_lm.py", *PACKAGE]
SOURCES = {
    f"bench:{w}": ["bench/_harness.py", "bench/_steps.py", *PACKAGE]
    for w in ("step", "unscale", "compile", "update_scale", "multidevice")
}
SOURCES |= {
    "bench:torch": ["bench/_harness.py", "bench/_steps.py"],
    "bench:exact": PACKAGE,
    "demo": ["jax_amp_scale/demo.py", "jax_amp_scale/policy.py", *PACKAGE],
    "transformer_lm": LM,
    "transformer_lm_mean": LM,
    "transformer_lm_torch": ["examples/transformer_lm_torch.py", *LM],
    # Not README.md, which shows this result (writing its block would make it stale); the
    # commands are checked against the recorded ones (tests/tools/test_time_readme_commands.py).
    "readme_commands": [
        "tools/time_readme_commands.py",
        "pyproject.toml",
        "tests",
        "jax_amp_scale",
        "ffi",
    ],
    "overflow_first": ["examples/overflow_first.py", *LM],
    "amax_search": ["tests/_amax_search.py", *PACKAGE],
    "amax_study": ["examples/amax_scaler_study.py", *LM],
}

# Results shown although they are not current, each with the reason.  The currency test
# fails on a stale result not listed here and on a listed one that is current again.
STALE: dict[str, str] = {}


@cache
def load(path: Path) -> Any:
    return json.loads(path.read_text())


def result(name: str) -> Any:
    """The data of results/NAME.json (``{"provenance": {...}, "data": {...}}``)."""
    return load(RESULTS / f"{name}.json")["data"]


def entries() -> dict[str, dict[str, Any]]:
    """Every recorded run by name (``bench:WORKLOAD`` or the file's stem): its provenance."""
    out = {
        f"bench:{w}": {
            **r["machine"],
            "command": r["command"],
            "sources": r.get("sources"),
            "commit": r["machine"].get("jax_amp_scale commit"),
        }
        for w, r in load(BENCH)["runs"].items()
    }
    return out | {
        p.stem: load(p)["provenance"] for p in sorted(RESULTS.glob("*.json")) if p != BENCH
    }


def drawn_mark(name: str) -> str:
    """``NAME DIGEST``: what a picture drawn from results/NAME.json records."""
    return f"{name} {hashlib.sha256((RESULTS / f'{name}.json').read_bytes()).hexdigest()[:16]}"


def drawn_from(path: Path) -> str | None:
    from PIL import Image

    return Image.open(path).info.get("drawn from") if path.exists() else None


def stamp(path: Path, name: str) -> None:
    """Marks the picture at `path` as drawn from results/NAME.json as it is now."""
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("drawn from", drawn_mark(name))
    Image.open(path).save(path, pnginfo=info)


def _git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)


def stale(p: dict[str, Any], repo: Path = ROOT) -> str | None:
    """None when the run is provably current: recorded clean at a commit of this
    history, and none of its source paths changed since; else why not."""
    commit, dirty = p.get("commit"), p.get("dirty")
    if not commit:
        return "no commit recorded"
    if dirty is None or dirty or not p.get("sources"):
        why = "no dirty flag" if dirty is None else "no source paths" if not dirty else ""
        return f"{commit}: " + (f"{why} recorded" if why else "measured with uncommitted changes")
    if _git("merge-base", "--is-ancestor", commit, "HEAD", cwd=repo).returncode:
        return f"{commit}: not a commit of this history"
    # Committed changes: a stale figure cannot land, and an edit in progress fails nothing yet.
    changed = _git(
        "diff", "--name-only", commit, "HEAD", "--", *p["sources"], cwd=repo
    ).stdout.split()
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return f"{commit}: changed since: {', '.join(changed[:3])}{more}" if changed else None


def provenance(command: str, name: str) -> dict[str, Any]:
    """What a recorder takes at the start: the machine and versions (as the benchmark
    records them), the command, the commit, and whether a source has uncommitted changes."""
    sys.path.insert(0, str(ROOT / "bench"))
    import _harness

    sources = SOURCES[name]
    dirty = bool(_git("status", "--porcelain", "--", *sources).stdout.strip())
    commit = _git("rev-parse", "--short", "HEAD").stdout.strip()
    run = {"command": command, "commit": commit, "dirty": dirty, "sources": sources}
    return {**_harness.machine_info(), **run}


def machine(p: dict[str, Any]) -> str:
    """``2-core AMD EPYC``: the machine a run names."""
    return f"{p.get('cores (os.cpu_count)', '?')}-core {str(p.get('cpu', '?')).strip()}"


def provenance_line(name: str, p: dict[str, Any], where: str) -> str:
    commit, dirty = p.get("commit"), p.get("dirty")
    # The reason, not git's list of changed files: the text stays fixed between commits.
    note = f"; **stale**: {STALE[name]}" if name in STALE and stale(p) else ""
    return (
        f"`{where}`: {machine(p)}, commit {commit or '?'}{'+dirty' if dirty else ''}, "
        f"jax {p.get('jax', '?')}, load average at the start "
        f"{str(p.get('load average at start', '?')).split()[0]}, "
        f"{p.get('date (UTC)', '?')} UTC, `{p.get('command', '?')}`{note}"
    )


def spread_of(values: list[float]) -> float:
    """Half the interquartile range (0 for fewer than 2 values)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / 2


def ratio_text(values: list[float], spread: bool = True) -> str:
    """``0.78x (±0.03)``: the median (and the spread) at the digits the spread supports
    (its first significant one), and at most three significant ones."""
    med, sp = statistics.median(values), spread_of(values)
    dec = max(0, min(3, -math.floor(math.log10(sp)))) if sp > 0 else 3
    d = max(0, min(dec, 2 - (math.floor(math.log10(abs(med))) if med else 0)))
    return f"{med:.{d}f}x" + (f" (±{sp:.{dec}f})" if spread and sp > 0 else "")


def verdict(values: list[float], than: str) -> str:
    """``faster than X``, ``slower than X`` or ``within its spread of X``."""
    med, sp = statistics.median(values), spread_of(values)
    if med + sp < 1:
        return f"faster than {than}"
    return f"slower than {than}" if med - sp > 1 else f"within its spread of {than}"


def seconds_text(s: float) -> str:
    """``12 s``, ``0.35 s``, ``4.27 ms``, ``155 ns``: two or three significant digits."""
    if s >= 0.1:
        return f"{s:.0f} s" if s >= 10 else f"{s:.2g} s"
    k, unit = next(((k, u) for k, u in ((1e-3, "ms"), (1e-6, "µs")) if s >= k), (1e-9, "ns"))
    return f"{s / k:.3g} {unit}"
