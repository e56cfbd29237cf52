"""Smoke test of bench/: every workload runs at a tiny size and reports.

No timing is asserted (performance is measured in bench/, never in tests):
this checks that `bench/run_all.py --tiny` runs every workload script in
its own process, that each reports every candidate with positive finite
times and paired ratios, and that RESULTS.md and the results file are written.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

# Minutes of subprocesses: CI runs it (python -m pytest -m slow).
pytestmark = pytest.mark.slow

pytest.importorskip("optax")
pytest.importorskip("jmp")
pytest.importorskip("flax")
pytest.importorskip("matplotlib")

sys.path.insert(0, str(BENCH))
import _harness  # noqa: E402
import _steps  # noqa: E402


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    # RESULTS.md already holding hand-written text: run_all must keep it.
    (out / "RESULTS.md").write_text(
        f"# kept\n\nbefore\n\n{_run_all().BEGIN}\nold\n{_run_all().END}\n\nafter\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "run_all.py"),
            "--tiny",
            "--out",
            str(out),
            "--results",
            str(out / "results.json"),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "results.json") as f:
        data = json.load(f)
    tables = [_harness.Table.from_json(t) for run in data["runs"].values() for t in run["tables"]]
    return out, data, tables


def _run_script(script: str, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python bench/<script> <args>``, checked to exit 0."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _run_all():
    import run_all

    return run_all


def _run_json(argv: list[str]) -> list[_harness.Table]:
    """Run one bench script with --json; its tables."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        proc = subprocess.run(
            [sys.executable, *argv, "--json", str(out)], capture_output=True, text=True, timeout=900
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        with open(out) as f:
            return [_harness.Table.from_json(t) for t in json.load(f)["tables"]]


def _ours_expected() -> bool:
    return _steps.ours_available() is None


def _check_rows(table: _harness.Table) -> None:
    assert table.rows, table.title
    for r in table.rows:
        assert r.times and all(math.isfinite(t) for t in r.times), (table.title, r)
        # A derived row is a difference of two timings: tiny runs may give < 0.
        if "inside a program" not in r.name:
            assert all(t > 0 for t in r.times), (table.title, r)
        assert len(r.times) == table.reps
        if table.baseline is not None:
            assert r.ratios is not None and len(r.ratios) == table.reps
    if table.baseline is not None:
        assert table.row(table.baseline).ratios == [1.0] * table.reps


def _tables(tables, prefix):
    found = [t for t in tables if t.workload.startswith(prefix)]
    assert found, f"no table for workload {prefix!r}"
    for t in found:
        _check_rows(t)
    return found


def test_step_overhead_every_candidate(suite):
    _, _, tables = suite
    ts = _tables(tables, "1.")
    assert [t.title.split(", ")[-1] for t in ts] == ["float16 compute", "float32 compute"]
    for t in ts:
        names = [r.name for r in t.rows]
        assert names[0] == "plain" and t.baseline == "plain"
        for peer in ("jmp DynamicLossScale", "flax DynamicScale", "optax apply_if_finite"):
            assert peer in names
        if _ours_expected():
            import jax_amp_scale as jas

            for b in ("auto", *jas.available_backends()):
                assert f"ours loss_scaled[{b}]" in names


def test_one_pass_over_gradients(suite):
    _, _, tables = suite
    jax_tables = [t for t in _tables(tables, "2.") if "torch" not in t.workload]
    assert [t.title.split(" MiB ")[1] for t in jax_tables] == [
        f"{d} over {n} leaves" for d in ("float32", "float16") for n in (1, 10, 100)
    ]
    for t in jax_tables:
        names = [r.name for r in t.rows]
        assert names[0] == "plain copy"
        ours = [
            "ours unscale_and_check[auto]",
            "ours[auto], loop of 1 pass",
            "ours[auto], the same loop, 9 passes",
            "ours[auto] inside a program: one pass ((9-pass - 1-pass loop) / 8)",
        ]
        if "float32" in t.title:
            ours.append("ours unscale_and_check[reference]")
        assert (names[1 : 1 + len(ours)] == ours) == _ours_expected()
        assert any(n.startswith("jit dispatch floor") for n in names)
        assert any(n.startswith("memory-bandwidth limit") for n in names)
        assert any(n.startswith("torch fused") for n in names)
        assert "% of copy throughput" in t.columns
        assert t.columns["ratio to torch fused"]


def test_compile_time_growth(suite):
    _, _, tables = suite
    ts = _tables(tables, "3.")
    assert [(t.workload, t.title) for t in ts] == [
        ("3. Compile time", "training step, 2 parameter leaves"),
        ("3. Compile time", "training step, 4 parameter leaves"),
    ]
    dense = _run_json([str(BENCH / "bench_compile.py"), "--tiny", "--models", "dense"])
    ts += _tables(dense, "3.")
    assert [(t.workload, t.title) for t in ts[2:]] == [
        ("3. Compile time, dense layers", "MLP training step, 2 parameter leaves"),
        ("3. Compile time, dense layers", "MLP training step, 4 parameter leaves"),
    ]
    for t in ts:
        names = [r.name for r in t.rows]
        assert names[0] == "plain"
        assert ("ours loss_scaled[auto]" in names) == _ours_expected()
        for r in t.rows:
            assert len(r.extra["lower_s"]) == len(r.extra["compile_s"]) == t.reps
        assert t.columns["growth exponent (1 = linear)"]["plain"].startswith("2->4: ")


def test_dense_model_is_what_it_says():
    """The dense model's tree: n // 2 layers of a 32x32 weight and a bias,
    whose weight gradients come out of dots (the tree model's do not)."""
    import bench_compile
    import jax

    assert bench_compile.MODELS["dense"].leaf_counts == (10, 100, 1000)
    assert bench_compile.MODELS["tree"].leaf_counts == (10, 100, 1000, 10_000)
    params = bench_compile.make_dense_params(10)
    assert len(jax.tree.leaves(params)) == 10
    assert {jax.typeof(x).shape for x in jax.tree.leaves(params)} == {(32,), (32, 32)}
    batch = bench_compile.MODELS["dense"].make_batch()
    hlo = jax.jit(jax.grad(bench_compile.dense_loss)).lower(params, batch).as_text()
    assert hlo.count("stablehlo.dot_general") >= 2 * 5 - 1
    assert "dot_general" not in (
        jax.jit(jax.grad(bench_compile.leafy_loss))
        .lower(bench_compile.make_params(10), bench_compile.MODELS["tree"].make_batch())
        .as_text()
    )


def test_operator_reference_vs_ffi(suite):
    _, _, tables = suite
    import jax_amp_scale as jas

    for t in _tables(tables, "4."):
        names = [r.name for r in t.rows]
        for b in jas.available_backends():
            assert any(b in n for n in names), (t.title, names)


def test_torch_grad_scaler(suite):
    pytest.importorskip("torch")
    _, _, tables = suite
    step, update = _tables(tables, "5.")
    assert [r.name for r in step.rows] == ["torch plain step", "torch GradScaler step"]
    assert update.baseline == "optimizer.step"


def test_bits_against_torch_on_cpu(suite):
    """Workload 6 on the CPU: every difference from torch's kernels is of
    an explained class (XLA:CPU's flush of subnormals; NaN payloads)."""
    pytest.importorskip("torch")
    out, data, _ = suite
    sections = data["runs"]["exact"]["sections"]
    assert [s["title"] for s in sections] == [
        "6. Bits against torch: update_scale",
        "6. Bits against torch: the gradient pass",
    ]
    assert [s["unexplained"] for s in sections] == [0, 0]
    text = (out / "RESULTS.md").read_text()
    assert "6. Bits against torch: the gradient pass: 0 unexplained differences: **met**" in text
    table = sections[1]["markdown"]
    # XLA:CPU flushes: torch's subnormal float32 results differ, and are explained
    head, _, *rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]]
    assert "flushed result" in head and "float32 [ffi]" in [row[0] for row in rows]


def test_step_beside_torch_and_the_hand_written_skip():
    """The GPU check's step table (on the CPU here): ours, the hand-written
    exact skip and torch's two steps, interleaved in one table."""
    pytest.importorskip("torch")
    args = ["--tiny", "--torch", "--optimizer", "adam", "--compute", "float16"]
    (t,) = _run_json([str(BENCH / "bench_step.py"), *args])
    _check_rows(t)
    names = [r.name for r in t.rows]
    assert names[0] == "plain" and _steps.HANDWRITTEN in names
    torch_rows = [n for n in names if n.startswith("torch")]
    assert [n.split(" (")[0] for n in torch_rows] == ["torch plain step", "torch GradScaler step"]
    assert set(t.columns["ratio to torch plain"]) == set(torch_rows)
    # No verdict of run_all's own: the pages' come from tools/figures.py.
    assert _run_all().notes([t]) == []


def test_reports_written(suite):
    out, data, tables = suite
    text = (out / "RESULTS.md").read_text()
    run_all = _run_all()
    # the hand-written text around the generated block is kept
    assert text.startswith("# kept\n\nbefore\n\n") and text.rstrip().endswith("after")
    assert "\nold\n" not in text
    for t in tables:
        assert f"#### {t.workload}: " in text  # a column of its workload's table
    assert set(data["runs"]) == set(run_all.WORKLOADS)
    for w, run in data["runs"].items():
        assert run["command"] == f"python bench/{run_all.WORKLOADS[w]} --tiny"
        assert "python bench/run_all.py --tiny" in run["via"]
        assert f"`{run['command']}`" in text
        for key in ("jax", "jaxlib", "cpu", "optax"):
            assert key in run["machine"]
    assert text.count(run_all.BEGIN) == 1 and "## Notes" in text
    for run in data["runs"].values():  # what the currency check reads
        assert isinstance(run["machine"]["dirty"], bool) and run["sources"]


def test_rerun_one_workload_keeps_the_others(suite):
    out, data, _ = suite
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "run_all.py"),
            "--tiny",
            "--only",
            "update_scale",
            "--out",
            str(out),
            "--results",
            str(out / "results.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "results.json") as f:
        again = json.load(f)
    assert set(again["runs"]) == set(data["runs"])
    for w in data["runs"]:
        same = again["runs"][w] == data["runs"][w]
        assert same == (w != "update_scale"), w
    assert "--only update_scale" in again["runs"]["update_scale"]["via"]
    text = (out / "RESULTS.md").read_text()
    assert "#### 1. Step overhead" in text and "#### 4. The operator" in text


def test_probe_trace_counts_package_files():
    """The traced update's package files: a count, then that many paths."""
    proc = _run_script("probe_trace.py", timeout=300)
    head, *files = proc.stdout.strip().splitlines()
    assert head == f"package files entered: {len(files)}" and files
    assert all(f.strip().endswith(".py") and not f.strip().startswith("/") for f in files)
    assert any("loss_scaled" in f for f in files)  # the optax transformation's own module


def test_ab_unscale_alternates_the_sides(tmp_path):
    """bench/ab_unscale.py with this Python on both sides: every run is
    recorded with finite figures (ours less the floor may be noise at 1 MiB:
    finite only), the order flips every round, and each side has a summary."""
    pytest.importorskip("torch")
    out = tmp_path / "ab.json"
    args = ("--labels", "a", "b", "--mib", "1", "--reps", "1", "--rounds", "2")
    _run_script("ab_unscale.py", sys.executable, sys.executable, *args, "--out", str(out))
    data = json.loads(out.read_text())
    assert [r["side"] for r in data["runs"]] == ["a", "b", "b", "a"]
    for run in data["runs"]:
        figs = [run[k] for k in ("ours_over_torch", "in_program_over_torch", "torch_ms")]
        assert all(math.isfinite(v) and v > 0 for v in figs), run
        assert math.isfinite(run["ours_less_floor_over_torch"]), run
    assert set(data["summary"]["1"]) == {"a", "b"} and data["cpu"]
