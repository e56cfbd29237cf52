"""README's two commands for a fresh machine, each timed in a fresh clone and venv.

    python tools/time_readme_commands.py [--only demo|tests] [--json PATH]

Reads the committed README's Quick start (the ``bash`` lines that begin
``python3 -m venv .venv``: the one that runs the demo and the one that runs
pytest), clones the committed HEAD once per command into a scratch folder,
and runs the command there with bash, as written, on a PATH without this
interpreter's virtual environment.  The install (everything before the
last ``&&``) and the run (the last command) are timed apart; packages come
from wherever this machine's pip takes them.  For the tests it keeps
pytest's counts.  A command that fails is an error: nothing is written.
``tools/figures.py record readme_commands`` calls it and keeps its JSON in
``results/readme_commands.json``, which README's figures come from (both
commands: ``--only`` writes no ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARK = "__readme_install_done__"


def readme_commands(text: str) -> dict[str, str]:
    """``{"demo": ..., "tests": ...}``: README's fresh-machine command lines."""
    lines = [ln.strip() for ln in text.splitlines() if ln.startswith("python3 -m venv .venv")]
    found = {
        "demo": [ln for ln in lines if "jax_amp_scale.demo" in ln],
        "tests": [ln for ln in lines if "pytest" in ln],
    }
    for name, hits in found.items():
        if len(hits) != 1:
            raise SystemExit(f"README.md: expected one {name} command line, found {hits}")
    return {name: hits[0] for name, hits in found.items()}


def fresh_path() -> str:
    """PATH without this interpreter's virtual environment (a fresh shell's)."""
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if sys.prefix != sys.base_prefix:
        venv_bin = str(Path(sys.prefix) / "bin")
        parts = [p for p in parts if p != venv_bin]
    return os.pathsep.join(parts)


def pytest_counts(output: str) -> dict[str, int]:
    """pytest's last summary line (``1349 passed, 21 skipped in 296.12s``) as counts."""
    lines = [ln for ln in output.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    if not lines:
        raise SystemExit("no pytest summary line in the test command's output")
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1])}


def run_one(name: str, command: str, scratch: Path) -> dict[str, object]:
    install, run = command.rsplit(" && ", 1)
    clone = scratch / name
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = fresh_path()
    script = f"{install} && echo {MARK} $(date +%s.%N) && {run}"
    print(f"[{name}] {command}", flush=True)
    t0 = time.time()
    proc = subprocess.Popen(["bash", "-c", script], cwd=clone, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    out = []
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        print(f"[{name}] {line}", end="", flush=True)
    rc = proc.wait()
    t1 = time.time()
    text = "".join(out)
    if rc != 0:
        raise SystemExit(f"README's {name} command exited {rc}")
    marks = re.findall(rf"^{MARK} ([\d.]+)$", text, re.M)
    if len(marks) != 1:
        raise SystemExit(f"README's {name} command: the install's end was not seen")
    done = float(marks[0])
    record: dict[str, object] = {
        "command": command,
        "install_seconds": round(done - t0, 1),
        "run_seconds": round(t1 - done, 1),
    }
    if name == "tests":
        record["counts"] = pytest_counts(text)
    versions = "import jax, jaxlib; print(jax.__version__, jaxlib.__version__)"
    got = subprocess.run([str(clone / ".venv/bin/python"), "-c", versions],
                         capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    record["jax"], record["jaxlib"] = got
    return record


def minutes(s: float) -> str:
    """``3 min 16 s`` (whole seconds: a fresh install varies by more)."""
    m, sec = divmod(round(s), 60)
    return f"{m} min {sec} s" if m else f"{sec} s"


def shown(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    """What the docs show (tools/figures.py: readme_commands.NAME)."""
    out = {f"tests.{k}": f"{n:,}" for k, n in results["tests"]["counts"].items()}
    for name, r in results.items():
        out |= {f"{name}.install": minutes(r["install_seconds"]), f"{name}.jax": r["jax"]}
        out[f"{name}.run"] = minutes(r["run_seconds"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["demo", "tests"])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.only and args.json:
        ap.error("--json records both commands: leave out --only")
    head = ["git", "-C", str(ROOT), "show", "HEAD:README.md"]  # the clones' README
    commands = readme_commands(subprocess.run(head, capture_output=True, text=True,
                                              check=True).stdout)  # fmt: skip
    names = [args.only] if args.only else list(commands)
    with tempfile.TemporaryDirectory(prefix="jas-readme-") as tmp:
        results = {n: run_one(n, commands[n], Path(tmp)) for n in names}
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"commands": results, "figures": shown(results)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
