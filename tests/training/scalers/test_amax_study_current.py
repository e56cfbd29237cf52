"""results/amax_study.json was measured at an earlier commit (its runs take
hours); its sources changed since only where a CPU run does not go.  This
runs one of its runs again at this commit and asks for the same numbers, so
that a change that does move a run cannot hide behind that claim
(tools/figures_data.py lists the file as stale, with this test as its reason)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_recorded_study_runs_are_the_same_at_this_commit(tmp_path):
    # One invocation runs the default variant and one stress variant (seed 0):
    # both amax runs are compared, the stressed one being where dynamic skips.
    pytest.importorskip("flax")
    variant, kind = "init2^24-mean", "amax"
    recorded = json.loads((ROOT / "results" / "amax_study.json").read_text())["data"]
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        study = importlib.import_module("amax_scaler_study")
        stress = [] if variant == "default" else ["--stress", variant, "--stress-seeds", "0"]
        kinds = f"{kind},float32"  # the report measures every gap against float32
        args = ["--steps", "150", "--seeds", "0", "--kinds", kinds, "--stress", "", *stress]
        assert study.main([*args, "--out-dir", str(tmp_path)]) == 0
    finally:
        sys.path.remove(str(ROOT / "examples"))
    got = json.loads((tmp_path / "amax_study.json").read_text())["runs"]
    for each in ("default", variant):
        (run,) = [r for r in got if (r["variant"], r["kind"]) == (each, kind)]
        (want,) = [
            r for r in recorded["runs"] if (r["variant"], r["seed"], r["kind"]) == (each, 0, kind)
        ]
        for key in ("skipped", "skipped_at", "eval_loss", "mean_log2_scale", "largest_all_leaves"):
            assert run[key] == want[key], (each, key)
