"""Shared benchmark harness: interleaved repetitions, medians, ratios, reports.

Every workload script builds a dict of candidates (name -> zero-argument
callable that runs one unit of work and blocks until it is done) and hands it
to `measure`.  `measure` warms every candidate up, then runs repetitions in
which each candidate runs once, in an order rotated every repetition, so that
drift in a shared machine's load hits every candidate alike.  Ratios to the
baseline are the median of the per-repetition ratios (paired, same
repetition), which is more robust to drift than a ratio of medians.

Results are plain dicts (JSON-serialisable) so that `bench/run_all.py` can
collect them from every workload into one ``RESULTS.md`` and one plot.
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
    # extra per-row column: name -> (header, {row name: formatted value})
    columns: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Table:
        d = dict(d)
        d["rows"] = [Row(**r) for r in d["rows"]]
        return cls(**d)

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)


def measure(
    candidates: Mapping[str, Candidate],
    *,
    baseline: str | None,
    reps: int,
    warmup: int = 2,
    inner: int = 1,
) -> list[Row]:
    """Times `candidates` interleaved in this process.

    Args:
      candidates: name -> callable running one unit of work to completion
        (it must block, e.g. ``jax.block_until_ready``).
      baseline: name of the candidate ratios are taken to, or None.
      reps: repetitions; each runs every candidate once (``inner`` calls).
      warmup: untimed runs of each candidate first (compilation, caches).
      inner: calls per timed sample; the sample is their mean.

    Returns:
      One `Row` per candidate, in the order given, times in seconds.
    """
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
            fn = candidates[n]
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times[n].append((time.perf_counter() - t0) / inner)
    rows = []
    for n in names:
        ratios = None
        if baseline is not None:
            ratios = [a / b for a, b in zip(times[n], times[baseline], strict=True)]
        rows.append(Row(n, times[n], ratios))
    return rows


def paired_ratio(row: Row, base: Row) -> float:
    """The median of `row`'s time over `base`'s, paired per repetition (both
    ran in each repetition, so load drift cancels)."""
    return statistics.median(a / b for a, b in zip(row.times, base.times, strict=True))


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


def time_once(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------
# Machine and versions


def _version(mod: str) -> str:
    try:
        m = importlib.import_module(mod)
    except Exception:  # not installed, or broken: say so, do not fail
        return "not installed"
    return str(getattr(m, "__version__", "?"))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_info() -> dict[str, str]:
    """The machine and library versions, for the header of every report."""
    import jax

    try:
        devs = ", ".join(sorted({f"{d.platform}:{d.device_kind}" for d in jax.devices()}))
    except Exception as e:  # no backend: still report the rest
        devs = f"unavailable ({e})"
    info = {
        "date (UTC)": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "cpu": _cpu_model(),
        "cores (os.cpu_count)": str(os.cpu_count()),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "jax devices": devs,
        "jax_amp_scale commit": _git_commit(),
    }
    gpu = _nvidia_gpu()
    if gpu:
        info["gpu (nvidia-smi: name, driver, memory)"] = gpu
    for mod in ("jax", "jaxlib", "numpy", "optax", "jmp", "flax", "torch", "jax_amp_scale"):
        info[mod] = _version(mod)
    return info


def _nvidia_gpu() -> str:
    """The NVIDIA GPUs as nvidia-smi names them ("" without one)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return "; ".join(line.strip() for line in out.stdout.splitlines() if line.strip())


# --------------------------------------------------------------------------
# Reports


def fmt_time(seconds: float, unit: str) -> str:
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    v = seconds * scale
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def table_markdown(t: Table) -> str:
    """A markdown table: median, min, max, ratio to the baseline (min-max)."""
    extra_cols = list(t.columns)
    head = ["candidate", f"median ({t.unit})", f"min ({t.unit})", f"max ({t.unit})"]
    if t.baseline is not None:
        head += [f"ratio to {t.baseline}", "ratio min-max"]
    head += extra_cols
    lines = [
        f"#### {t.workload}: {t.title}",
        "",
        f"{t.reps} interleaved repetitions after {t.warmup} warm-up runs.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
    ]
    for r in t.rows:
        cells = [
            r.name + (f" ({r.note})" if r.note else ""),
            fmt_time(r.median, t.unit),
            fmt_time(min(r.times), t.unit),
            fmt_time(max(r.times), t.unit),
        ]
        if t.baseline is not None:
            if r.ratios:
                cells += [f"{r.ratio:.3f}", f"{min(r.ratios):.3f}-{max(r.ratios):.3f}"]
            else:
                cells += ["", ""]
        cells += [t.columns[c].get(r.name, "") for c in extra_cols]
        lines.append("| " + " | ".join(cells) + " |")
    if t.notes:
        lines.append("")
        lines += [f"- {n}" for n in t.notes]
    return "\n".join(lines) + "\n"


def machine_markdown(info: Mapping[str, str]) -> str:
    lines = ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in info.items()]
    return "\n".join(lines) + "\n"


def print_tables(tables: Sequence[Table]) -> None:
    for t in tables:
        print(table_markdown(t))


# --------------------------------------------------------------------------
# Command line shared by every workload script


def parser(description: str, *, reps: int, warmup: int = 2) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--tiny",
        action="store_true",
        help="tiny sizes and 1 repetition: checks that the workload runs (no timing value)",
    )
    p.add_argument("--reps", type=int, default=reps, help=f"repetitions (default {reps})")
    p.add_argument("--warmup", type=int, default=warmup, help=f"warm-up runs (default {warmup})")
    p.add_argument("--json", metavar="PATH", help="also write the tables to PATH as JSON")
    return p


def save(
    args: argparse.Namespace,
    tables: Sequence[Table],
    sections: Sequence[Mapping[str, Any]] = (),
) -> None:
    """Writes --json (if asked) with what is measured so far: a workload
    stopped at its time limit keeps the tables it finished (run_all.py)."""
    if not args.json:
        return
    with open(args.json + ".tmp", "w") as f:
        json.dump(
            {
                "argv": sys.argv,
                "machine": machine_info(),
                "tables": [t.to_json() for t in tables],
                "sections": list(sections),
            },
            f,
            indent=1,
        )
    os.replace(args.json + ".tmp", args.json)


def finish(
    args: argparse.Namespace,
    tables: Sequence[Table],
    sections: Sequence[Mapping[str, Any]] = (),
) -> None:
    """Prints the machine header and `tables`, and writes --json if asked.

    `sections` are results that are not timings (each a dict with "title"
    and "markdown"), carried to RESULTS.md as they are."""
    print(machine_markdown(machine_info()))
    print_tables(tables)
    save(args, tables, sections)
