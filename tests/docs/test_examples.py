"""The scripts in examples/: each runs to the end and passes its own checks.

The slow tier runs every example as a user would (``python examples/<name>.py``,
in a subprocess, with settings small enough for a 2-core machine); each
example checks its own claim and exits non-zero when it fails.  The fast
tier runs the transformer example's training loop for two steps in-process.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str, timeout: int = 600) -> str:
    """Runs examples/<name> with `args`; returns its stdout; fails with its output."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # multi_device.py sets its own device count
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=EXAMPLES.parent,
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture
def transformer_lm():
    pytest.importorskip("flax")
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module("transformer_lm")
    finally:
        sys.path.remove(str(EXAMPLES))


@pytest.mark.slow
@pytest.mark.trimmed
def test_transformer_lm_two_steps_write_the_table(transformer_lm, tmp_path, capsys):
    args = ["--steps", "2", "--layers", "1", "--eval-windows", "8", "--out-dir", str(tmp_path)]
    assert transformer_lm.main([*args, "--modes", "float16+scaling"]) == 0
    lines = (tmp_path / "transformer_lm.md").read_text().splitlines()
    head, _, *rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert head == ["mode", "step 1", "step 2", "eval loss", "zeros at init"]
    assert [row[0] for row in rows] == ["float16+scaling"]
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "transformer_lm.png").read_bytes()[:4] == b"\x89PNG"


def test_corpus_is_the_stdlib_sources_and_deterministic():
    sys.path.insert(0, str(EXAMPLES))
    try:
        corpus = importlib.import_module("stdlib_corpus")
    finally:
        sys.path.remove(str(EXAMPLES))
    train, held_out = corpus.load_corpus()
    # Every tenth file is held out.  Their share of the bytes depends on the
    # Python version (3.11: 1/10.4, 3.12: 1/7.7), so check the files, not a ratio.
    tenth = corpus.corpus_files()[9::10]
    assert len(held_out) == len(b"\n".join(p.read_bytes() for p in tenth)) > 0
    assert len(train) > len(held_out)
    a = corpus.random_windows(train, 3, 4, 9, seed=0)
    b = corpus.random_windows(train, 3, 4, 9, seed=0)
    assert a.shape == (3, 4, 9) and (a == b).all()


@pytest.mark.slow
def test_transformer_lm_fp16_tracks_fp32_and_unscaled_falls_behind(tmp_path):
    pytest.importorskip("flax")
    out = run_example("transformer_lm.py", "--steps", "150", "--check", "--out-dir", str(tmp_path))
    assert "float16 with loss scaling tracks float32" in out
    assert "float16 without scaling falls behind" in out
    assert len((tmp_path / "transformer_lm.md").read_text().splitlines()) == 6


@pytest.mark.slow
def test_transformer_lm_torch_agrees_step_by_step(tmp_path):
    pytest.importorskip("flax")
    pytest.importorskip("torch")
    path = tmp_path / "twin.json"
    out = run_example("transformer_lm_torch.py", "--steps", "60", "--json", str(path))
    assert "all checks passed" in out
    modes = json.loads(path.read_text())["modes"]
    assert modes["float32"]["max_diff"] <= modes["float32"]["tolerance"] == 5e-4
    f16 = modes["float16+scaling"]
    assert f16["scales_equal"] and f16["passed"] and f16["first_scale"] == 2.0**15
    assert f16["scale_changes"] == [[51, 2.0**16]]  # growth interval 50, no overflow


@pytest.mark.slow
def test_overflow_first_watches_see_the_first_overflow(tmp_path):
    pytest.importorskip("flax")
    out = tmp_path / "overflow_first.json"
    args = ["--train-steps", "0", "--models", "transformer", "--max-log2", "26"]
    stdout = run_example(
        "overflow_first.py", *args, "--cost-reps", "3", "--check", "--out", str(out)
    )
    assert "all checks passed" in stdout
    assert out.with_suffix(".md").read_text().count("| transformer | init |") == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "args", "needs"),
    [
        ("flax_linen_trainstate.py", ("--steps", "100"), "flax"),
        ("equinox_mlp.py", ("--steps", "100"), "equinox"),
        ("torch_port.py", (), "torch"),
        ("accumulation.py", (), "optax"),
        ("multi_device.py", (), "optax"),
    ],
)
def test_short_example_runs_and_checks_itself(name, args, needs):
    pytest.importorskip(needs)
    run_example(name, *args)
