"""The benchmark harness: interleaved repetitions, paired ratios, reports.

Candidates are name -> zero-argument callables that block until done.  After
warm-up, each repetition runs every candidate once, the order rotated, and a
ratio is the median of per-repetition ratios to the baseline (paired), so
load drift cancels.  bench/ imports only the package's public API.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tabulate import tabulate

Candidate = Callable[[], Any]


@dataclasses.dataclass
class Row:
    """One candidate's timings, seconds per unit of work."""

    name: str
    times: list[float]
    ratios: list[float] | None = None  # paired, to the table's baseline
    note: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None


@dataclasses.dataclass
class Table:
    """One measurement: candidates side by side against one baseline."""

    workload: str  # e.g. "1. Step overhead"
    title: str  # e.g. "MLP 4.2M params, batch 256"
    baseline: str | None
    rows: list[Row]
    unit: str = "ms"
    reps: int = 0
    warmup: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)
    # extra columns: header -> {row name: formatted value}
    columns: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Table:
        return cls(**{**d, "rows": [Row(**r) for r in d["rows"]]})

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)


def measure(
    candidates: Mapping[str, Candidate], *, baseline: str | None, reps: int, warmup: int = 2
) -> list[Row]:
    """One `Row` per candidate, in the order given, times in seconds; ratios
    to `baseline` (a candidate's name, or None), paired per repetition."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    names = list(candidates)
    if baseline is not None and baseline not in candidates:
        raise ValueError(f"baseline {baseline!r} is not a candidate ({names})")
    for _ in range(warmup):
        for n in names:
            candidates[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        k = rep % len(names)
        for n in names[k:] + names[:k]:  # rotate the order every repetition
            t0 = time.perf_counter()
            candidates[n]()
            times[n].append(time.perf_counter() - t0)
    return [
        Row(n, times[n], None if baseline is None else _ratios(times[n], times[baseline]))
        for n in names
    ]


def _ratios(times: list[float], base: list[float]) -> list[float]:
    return [a / b for a, b in zip(times, base, strict=True)]


def paired_ratio(row: Row, base: Row) -> float:
    """The median of `row`'s time over `base`'s, paired per repetition."""
    return statistics.median(_ratios(row.times, base.times))


def timed_table(
    workload: str,
    title: str,
    candidates: Mapping[str, Candidate],
    *,
    baseline: str | None,
    reps: int,
    warmup: int,
    unit: str = "ms",
    notes: Sequence[str] = (),
) -> Table:
    """`measure` the candidates into a `Table`."""
    rows = measure(candidates, baseline=baseline, reps=reps, warmup=warmup)
    return Table(workload, title, baseline, rows, unit, reps, warmup, list(notes))


def overhead_ms(rows: Sequence[Row]) -> dict[str, dict[str, str]]:
    """The "overhead (ms)" column: each row's median minus the first row's."""
    return {"overhead (ms)": {r.name: f"{(r.median - rows[0].median) * 1e3:+.2f}" for r in rows}}


def torch_device() -> Any:
    """torch's device where JAX runs: the CPU, or the GPU of JAX's GPU
    backend; None without torch or without torch on that GPU."""
    try:
        import torch
    except ImportError:
        return None
    import jax

    if jax.default_backend() == "cpu":
        return torch.device("cpu")
    return torch.device("cuda") if torch.cuda.is_available() else None


def _output(*cmd: str) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.strip()


def machine_info() -> dict[str, str]:
    """The machine and library versions, for the header of every report."""
    import jax

    try:
        devs = ", ".join(sorted({f"{d.platform}:{d.device_kind}" for d in jax.devices()}))
    except Exception as e:  # no backend: still report the rest
        devs = f"unavailable ({e})"
    git = ["git", "-C", os.path.dirname(os.path.abspath(__file__))]
    commit = _output(*git, "rev-parse", "--short", "HEAD") or "unknown"
    # run_all.py narrows the flag to the files each workload measures.
    dirty = bool(_output(*git, "status", "--porcelain", "--untracked-files=no"))
    info = {
        "date (UTC)": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "cpu": _output("sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2")
        or platform.machine(),
        "cores (os.cpu_count)": str(os.cpu_count()),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "jax devices": devs,
        "jax_amp_scale commit": commit,
        "dirty": dirty,
    }
    query = ("--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
    if gpu := _output("nvidia-smi", *query):
        info["gpu (nvidia-smi: name, driver, memory)"] = "; ".join(gpu.splitlines())
    for mod in ("jax", "jaxlib", "numpy", "optax", "jmp", "flax", "torch", "jax_amp_scale"):
        try:
            info[mod] = str(getattr(importlib.import_module(mod), "__version__", "?"))
        except Exception:  # not installed, or broken: say so, do not fail
            info[mod] = "not installed"
    return info


def fmt_time(seconds: float, unit: str) -> str:
    v = seconds * {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def _shared(words: list[list[str]]) -> int:
    """How many leading words all of `words` share."""
    diff = (i for i, w in enumerate(zip(*words, strict=False)) if len(set(w)) > 1)
    return next(diff, min(map(len, words)))


def _cell(r: Row | None, unit: str) -> str:
    """The median and (the paired ratio); empty where the table has no such row."""
    if r is None:
        return ""
    return fmt_time(r.median, unit) + ("" if r.ratio is None else f" ({r.ratio:.3f})")


def tables_markdown(tables: Sequence[Table]) -> str:
    """Markdown, one table per workload, unit and baseline: a row per candidate, a column per
    table (what its title does not share), each cell the median and (the paired ratio)."""
    groups: dict[tuple, list[Table]] = {}
    for t in tables:
        groups.setdefault((t.workload, t.unit, t.baseline), []).append(t)
    out = []
    for (workload, unit, baseline), g in groups.items():
        words = [t.title.split() for t in g]
        pre = _shared(words)
        suf = min(_shared([w[::-1] for w in words]), min(map(len, words)) - pre)
        heads = [" ".join(w[pre : len(w) - suf]) for w in words]
        shared = " ".join(
            words[0][:pre] + (["…"] if len(g) > 1 else []) + words[0][len(words[0]) - suf :]
        )
        ratio = f" (ratio to {baseline})" if baseline is not None else ""
        reps = "/".join(dict.fromkeys(f"{t.reps} ({t.warmup})" for t in g))
        key = lambda r: r.name + (f" ({r.note})" if r.note else "")  # noqa: E731
        rows = []
        for n in dict.fromkeys(key(r) for t in g for r in t.rows):
            found = [next((r for r in t.rows if key(r) == n), None) for t in g]
            rows.append([n, *(_cell(r, t.unit) for r, t in zip(found, g, strict=True))])
        head = ["candidate", *(heads if len(g) > 1 else ["median"])]
        out += [
            f"#### {workload}: {shared}",
            f"Median {unit}{ratio}; interleaved repetitions (warm-up runs): {reps}.",
            "",
            tabulate(
                rows, head, "github", colalign=["left", *["right"] * len(g)], disable_numparse=True
            ),
        ]
        notes = list(dict.fromkeys(n for t in g for n in t.notes))
        out += ["", *(f"- {n}" for n in notes), *([""] if notes else [])]
    return "\n".join(out)


def machine_markdown(info: Mapping[str, str]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in info.items()) + ".\n"


def parser(description: str, *, reps: int, warmup: int = 2) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--tiny", action="store_true", help="tiny sizes: runs, times nothing")
    p.add_argument("--reps", type=int, default=reps, help=f"repetitions (default {reps})")
    p.add_argument("--warmup", type=int, default=warmup, help=f"warm-up runs (default {warmup})")
    p.add_argument("--json", metavar="PATH", help="also write the tables to PATH as JSON")
    return p


def save(args, tables: Sequence[Table], sections: Sequence[Mapping] = (), show=False) -> None:
    """Writes --json (if asked) with the tables so far, which a workload stopped at its limit
    keeps, and `sections`, results not timings (dicts of "title", "markdown", "unexplained");
    `show`: prints the machine and `tables` first."""
    machine = machine_info()
    if show:
        print(machine_markdown(machine) + "\n" + tables_markdown(tables))
    if args.json:
        out = {
            "argv": sys.argv,
            "machine": machine,
            "tables": [dataclasses.asdict(t) for t in tables],
        }
        with open(args.json + ".tmp", "w") as f:
            json.dump(out | {"sections": list(sections)}, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
