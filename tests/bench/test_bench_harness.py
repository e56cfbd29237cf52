"""bench/_harness.py's measurement order and paired ratios (no optional package needed)."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _harness


def test_harness_ratios_are_paired():
    ticks = iter(range(1000))
    seen: list[str] = []

    def cand(name):
        def run():
            seen.append(name)
            next(ticks)

        return run

    rows = _harness.measure(
        {"a": cand("a"), "b": cand("b"), "c": cand("c")}, baseline="a", reps=4, warmup=1
    )
    # warm-up once each in order, then the order rotates every repetition
    assert seen[:3] == ["a", "b", "c"]
    assert seen[3:6] == ["a", "b", "c"] and seen[6:9] == ["b", "c", "a"]
    assert seen[9:12] == ["c", "a", "b"]
    for r in rows:
        assert len(r.times) == 4
        assert r.ratios == [x / y for x, y in zip(r.times, rows[0].times, strict=True)]
    with pytest.raises(ValueError, match="baseline"):
        _harness.measure({"a": cand("a")}, baseline="z", reps=1)
    with pytest.raises(ValueError, match="reps"):
        _harness.measure({"a": cand("a")}, baseline=None, reps=0)


def test_compile_notes_name_each_model_and_its_growth():
    """run_all's notes: the growth exponents per model after its last size, and
    no verdict (the verdicts are tools/figures.py's, from the same results file)."""
    import run_all

    def table(workload, title, growth, notes=()):
        rows = [_harness.Row("plain", [1.0], [1.0]), _harness.Row("ours", [1.3], [1.3])]
        cols = {"growth exponent (1 = linear)": {"plain": growth, "ours": growth}}
        return _harness.Table(workload, title, "plain", rows, unit="s", columns=cols,
                              notes=list(notes))  # fmt: skip

    lines = run_all.notes(
        [
            table(
                "3. Compile time", "training step, 10 parameter leaves", "", ["not run at 10: x"]
            ),
            table("3. Compile time", "training step, 100 parameter leaves", "10->100: 1.00"),
            table("3. Compile time, dense layers", "MLP, 10 parameter leaves", "10->100: 0.90"),
            table("1. Step overhead", "MLP", "10->100: 2.00"),
        ]
    )
    assert lines == [
        "- 3. Compile time, training step, 10 parameter leaves: not run at 10: x.",
        "- 3. Compile time, growth exponent (1 = linear): plain (10->100: 1.00); "
        "ours (10->100: 1.00).",
        "- 3. Compile time, dense layers, growth exponent (1 = linear): plain (10->100: 0.90); "
        "ours (10->100: 0.90).",
    ]
    assert not any(re.search(r"\bmet\b", line) for line in lines)


@pytest.mark.slow  # two workloads run to their time limits
def test_a_workload_stopped_at_its_limit_keeps_what_it_finished(tmp_path):
    """run_all.run_workload past --timeout-s: the tables the workload had
    saved (`_harness.save`, after each one) are kept and marked as cut; a
    workload that saved nothing gives no tables, and no crash."""
    import json
    import subprocess

    import run_all

    script = tmp_path / "slow.py"  # an absolute path: run_all.HERE / script is script
    script.write_text(
        "import sys, time, argparse\n"
        f"sys.path.insert(0, {str(run_all.HERE)!r})\n"
        "import _harness\n"
        "p = argparse.ArgumentParser(); p.add_argument('--json'); p.add_argument('--save', type=int)\n"
        "a = p.parse_args()\n"
        "row = _harness.Row('x', [0.001])\n"
        "t = _harness.Table('9. test', 'first', None, [row], reps=1)\n"
        "if a.save: _harness.save(a, [t])\n"
        "time.sleep(600)\n"
    )
    # 30 s: importing _harness (jax) took over 8 s on a loaded 2-core machine.
    out = run_all.run_workload(str(script), ["--save", "1"], tmp_path / "a.json", 30.0)
    assert out["cut"].startswith("stopped at its 30 s limit")
    assert [t["title"] for t in out["tables"]] == ["first"]
    out = run_all.run_workload(str(script), ["--save", "0"], tmp_path / "b.json", 3.0)
    assert out["cut"] and out["tables"] == []
    with pytest.raises(subprocess.CalledProcessError):
        run_all.run_workload("no_such_workload.py", [], tmp_path / "c.json", 5.0)
    assert json.loads(json.dumps(out))  # what results.json holds stays JSON
