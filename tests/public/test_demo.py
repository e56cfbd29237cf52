"""python -m jax_amp_scale.demo: flags, summary table, plot (and its absence)."""

import builtins
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from jax_amp_scale import demo


def test_main_writes_table_and_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "run.png"
    rc = demo.main(
        ["--steps", "30", "--inject", "3,4", "--out", str(out), "--growth-interval", "5"]
    )
    assert rc == 0
    text = capsys.readouterr()
    assert "| skipped           | 2 (at 3, 4)" in text.out
    assert "| steps             | 30" in text.out
    assert "30/30" in text.err  # the progress bar reached the end
    # The float32 baseline's loss stands beside the run's.
    (row,) = [line for line in text.out.splitlines() if "loss (all data)" in line]
    ours, base, rel = re.match(
        r"\| loss \(all data\)\s+\| (\S+) \(float32: (\S+), (\S+)%\)", row
    ).groups()
    assert float(rel) == pytest.approx(100 * (float(ours) / float(base) - 1), abs=0.1)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.trimmed
def test_without_matplotlib_says_so_and_skips(tmp_path, capsys, monkeypatch):
    real_import = builtins.__import__

    def fake(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    out = tmp_path / "none.png"
    assert demo.main(["--steps", "5", "--inject", "", "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr()
    assert "matplotlib is not installed" in text.err and "skipping the plot" in text.err
    assert not out.exists()
    assert "| skipped           | 0" in text.out


@pytest.mark.slow
@pytest.mark.trimmed
@pytest.mark.parametrize("level, scale", [("O0", "none"), ("O2", "static"), ("O1", "dynamic")])
def test_levels_and_scales(level, scale):
    r = demo.train(12, level, scale, inject=(4,))
    assert r.skipped.tolist() == [i == 4 for i in range(12)]
    expected = {"none": 1.0, "static": 1024.0, "dynamic": 65536.0}[scale]
    assert float(r.scale[0]) == expected


def test_bad_flags():
    with pytest.raises(SystemExit):
        demo.main(["--level", "O7"])
    with pytest.raises(SystemExit):
        demo.main(["--inject", "a,b"])
    with pytest.raises(ValueError, match="inject"):
        demo.train(5, inject=(9,))
    with pytest.raises(ValueError, match="steps"):
        demo.train(0)


@pytest.mark.slow
def test_module_entry_point(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "jax_amp_scale.demo",
            "--steps",
            "8",
            "--inject",
            "2",
            "--no-plot",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "skipped           | 1 (at 2)" in r.stdout


class _Stream:
    def __init__(self, tty):
        self.tty, self.parts = tty, []

    def isatty(self):
        return self.tty

    def write(self, text):
        self.parts.append(text)

    def flush(self):
        pass


def test_progress_is_a_bar_on_a_terminal_and_lines_in_a_log():
    tty, log = _Stream(True), _Stream(False)
    for step in (1, 2):
        demo._progress(step, 2, 0.5, 1024.0, stream=tty)
        demo._progress(step, 2, 0.5, 1024.0, stream=log)
    out = "".join(tty.parts)
    assert out.count("\r") == 2 and out.endswith("\n") and "[" + "#" * 30 + "]" in out
    text = "".join(log.parts)
    assert "\r" not in text and "[" not in text
    assert text.splitlines() == [
        "step     1/2  loss   0.5000  scale       1024",
        "step     2/2  loss   0.5000  scale       1024",
    ]


@pytest.mark.slow
@pytest.mark.trimmed
def test_log_progress_has_about_ten_lines(capsys):
    demo.train(40, "O0", "none", progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err  # pytest's stderr is not a terminal
    assert [line.split()[1] for line in err.splitlines()] == [f"{4 * i}/40" for i in range(1, 11)]


@pytest.mark.slow
@pytest.mark.trimmed
def test_summary_shows_growth_interval_and_reasons():
    r = demo.train(12, "O2", "dynamic", inject=(4,), growth_interval=7)
    table = demo.summary_table(r, level="O2", scale="dynamic")
    assert "| growth interval   | 7 finite steps (scale x2)" in table
    assert "|   of which        | 1 overflow, 0 non-finite update" in table
    r = demo.train(3, "O2", "static")
    assert "| growth interval   | - (fixed scale)" in demo.summary_table(r, level="O2", scale="s")


@pytest.mark.slow
@pytest.mark.trimmed
def test_o3_trains_300_steps_without_nan():
    """Issue 14: O3 skipped 119/120 steps (adam's eps=1e-8 is 0 in float16)."""
    r = demo.train(300, "O3", inject=(100,))
    assert np.isfinite(r.loss).all()
    assert r.skipped.tolist() == [i == 100 for i in range(300)]
    assert all(np.isfinite(np.asarray(x, np.float32)).all() for x in jax.tree.leaves(r.params))
    assert r.eval_loss < 0.2  # float32 O0 reaches 0.123 on this task; O3 0.142


@pytest.mark.slow
@pytest.mark.trimmed
def test_plot_with_baseline(tmp_path):
    pytest.importorskip("matplotlib")
    r = demo.train(6, "O2", inject=(2,))
    base = demo.train(6, "O0", "none")
    out = tmp_path / "b.png"
    assert demo.plot(r, str(out), baseline=base, title="t")
    table = demo.summary_table(r, level="O2", scale="auto", baseline=base)
    rel = 100 * (r.eval_loss / base.eval_loss - 1)
    assert f"| {r.eval_loss:.4f} (float32: {base.eval_loss:.4f}, {rel:+.1f}%)" in table
    assert "float32" not in demo.summary_table(r, level="O2", scale="auto")
    assert out.read_bytes()[:4] == b"\x89PNG"
