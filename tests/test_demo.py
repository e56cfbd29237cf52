"""python -m jax_amp_scale.demo: flags, summary table, plot (and its absence)."""

import builtins
import subprocess
import sys

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
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
