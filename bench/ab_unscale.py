"""A/B of workload 2 (one pass over the gradients): two builds, interleaved.

Each side is a Python whose jax_amp_scale is one build (say a venv per git
worktree).  Both run this tree's bench/bench_unscale.py (the same harness)
on float32 gradients without the peers; the sides alternate run by run and
the order flips every round (A B, B A, ...), so a shared machine's load
drift falls on both.  Per run, paired per repetition inside it: ours over
torch's fused op, and ours less the jit dispatch floor over torch.

    python bench/ab_unscale.py OLD/bin/python NEW/bin/python --labels 64e494a HEAD \\
        --leaves 1 100 --rounds 8 2 --out bench/ab_one_leaf.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _harness
import bench_unscale as bu

HERE = Path(__file__).resolve().parent
# What each side's Python reports of itself: its package's folder and commit.
PROBE = """
import json, os, subprocess, jax, torch, jax_amp_scale as j
d = os.path.dirname(os.path.dirname(os.path.abspath(j.__file__)))
git = lambda *a: subprocess.run(["git", "-C", d, *a], capture_output=True, text=True).stdout
dirty = "+dirty" if git("status", "--porcelain", "--untracked-files=no").strip() else ""
print(json.dumps({"package": d, "commit": git("rev-parse", "--short", "HEAD").strip() + dirty,
                  "jax": jax.__version__, "torch": torch.__version__}))
"""


def cpu_id() -> str:
    """/proc/cpuinfo's model name with its family, model and stepping (a VM
    may show only "AMD EPYC": the family and model then name the generation)."""
    info: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, val = line.partition(":")
        info.setdefault(key.strip(), val.strip())
    keys = ("cpu family", "model", "stepping")
    return (
        f"{info.get('model name', '?')} ("
        + ", ".join(f"{k} {info.get(k, '?')}" for k in keys)
        + ")"
    )


def paired(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def one_run(python: str, leaves: int, args) -> dict[str, float]:
    """bench_unscale.py in `python` at `leaves` leaves: the run's figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        cmd = [python, str(HERE / "bench_unscale.py"), "--in-process", "--no-peers"]
        cmd += ["--dtypes", "float32", "--leaves", str(leaves), "--mib", str(args.mib)]
        cmd += ["--reps", str(args.reps), "--json", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=args.timeout_s)
        table = _harness.Table.from_json(json.loads(Path(out).read_text())["tables"][0])
    ours, torch, floor = (table.row(n).times for n in (bu.OURS, bu.TORCH, bu.DISPATCH))
    less = [o - f for o, f in zip(ours, floor, strict=True)]
    return {
        "ours_over_torch": paired(ours, torch),
        "ours_less_floor_over_torch": paired(less, torch),
        "in_program_over_torch": paired(table.row(bu.IN_PROGRAM).times, torch),
        "ours_ms": 1e3 * statistics.median(ours),
        "torch_ms": 1e3 * statistics.median(torch),
        "floor_ms": 1e3 * statistics.median(floor),
    }


def summary(runs: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Per leaf count and side: each figure's median, min and max over rounds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for run in runs:
        out.setdefault(str(run["leaves"]), {}).setdefault(run["side"], {})
    for leaves, sides in out.items():
        for side, figs in sides.items():
            mine = [r for r in runs if str(r["leaves"]) == leaves and r["side"] == side]
            for key in ("ours_over_torch", "ours_less_floor_over_torch", "in_program_over_torch"):
                vals = [r[key] for r in mine]
                figs[key] = {
                    "median": round(statistics.median(vals), 3),
                    "min": round(min(vals), 3),
                    "max": round(max(vals), 3),
                }
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pythons", nargs=2, metavar="PYTHON", help="side A's and side B's python")
    p.add_argument("--labels", nargs=2, default=["A", "B"], help="the sides' names")
    p.add_argument("--leaves", type=int, nargs="+", default=[1], help="leaf counts (default 1)")
    p.add_argument("--rounds", type=int, nargs="+", default=[8], help="per leaf count, or one")
    p.add_argument("--mib", type=int, default=256, help="gradient bytes in MiB (default 256)")
    p.add_argument("--reps", type=int, default=10, help="repetitions per run (default 10)")
    p.add_argument("--timeout-s", type=int, default=900, help="per run (default 900)")
    p.add_argument("--out", required=True, help="the JSON written (after every run)")
    args = p.parse_args(argv)
    rounds = args.rounds * len(args.leaves) if len(args.rounds) == 1 else args.rounds
    if len(rounds) != len(args.leaves):
        p.error("--rounds takes one count, or one per leaf count")
    sides = dict(zip(args.labels, args.pythons, strict=True))
    probes = [[py, "-c", PROBE] for py in args.pythons]
    record = {
        "command": [Path(sys.executable).name, *sys.argv],
        "cpu": cpu_id(),
        "machine": _harness.machine_info(),
        "sides": {
            label: {"python": py, **json.loads(subprocess.check_output(cmd, text=True))}
            for (label, py), cmd in zip(sides.items(), probes, strict=True)
        },
        "runs": [],
    }
    for leaves, count in zip(args.leaves, rounds, strict=True):
        for k in range(count):
            for label in args.labels if k % 2 == 0 else args.labels[::-1]:
                run = {"leaves": leaves, "round": k, "side": label}
                run["load_1min"] = round(os.getloadavg()[0], 2)
                # Four significant digits, not places: under load a ratio can
                # fall below 1e-4 and must not be recorded as 0.
                figs = one_run(sides[label], leaves, args)
                run |= {key: float(f"{v:.4g}") for key, v in figs.items()}
                record["runs"].append(run)
                record["summary"] = summary(record["runs"])
                Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
                print(json.dumps(run), flush=True)
    return record


if __name__ == "__main__":
    main()
