"""bench/bench_multidevice.py runs (tiny sizes, one repetition; no timing value)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_multidevice_tiny(tmp_path):
    out = tmp_path / "md.json"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_multidevice.py"), "--tiny"]
    done = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    tables = json.loads(out.read_text())["tables"]
    assert len(tables) == 4
    for t in tables:
        assert {r["name"] for r in t["rows"]} >= {"reference", "native"}
