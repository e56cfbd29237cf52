"""Smoke test of bench/: every workload runs at a tiny size and reports.

No timing is asserted (performance is measured in bench/, never in tests):
this checks that `bench/run_all.py --tiny` runs every workload script in
its own process, that each reports every candidate with positive finite
times and paired ratios, and that RESULTS.md and the PNG plot are written.
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
        [sys.executable, str(BENCH / "run_all.py"), "--tiny", "--out", str(out)],
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
    assert "flushed result" in table and "| float32 [ffi] |" in table


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
    lines = _run_all().targets([t])
    assert any(line.startswith("- Default step within 1% of the hand-written") for line in lines)
    assert any(line.startswith("- Scaling's cost, float16 compute: ours") for line in lines)
    assert any(line.startswith("- The host reports' cost, float16 compute:") for line in lines)


def test_reports_written(suite):
    out, data, tables = suite
    text = (out / "RESULTS.md").read_text()
    run_all = _run_all()
    # the hand-written text around the generated block is kept
    assert text.startswith("# kept\n\nbefore\n\n") and text.rstrip().endswith("after")
    assert "\nold\n" not in text
    for t in tables:
        assert f"#### {t.workload}: {t.title}" in text
    assert set(data["runs"]) == set(run_all.WORKLOADS)
    for w, run in data["runs"].items():
        assert run["command"] == f"python bench/{run_all.WORKLOADS[w]} --tiny"
        assert "python bench/run_all.py --tiny" in run["via"]
        assert f"`{run['command']}`" in text
        for key in ("jax", "jaxlib", "cpu", "optax"):
            assert key in run["machine"]
    assert text.count(run_all.BEGIN) == 1 and "## Targets" in text
    png = (out / "results.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


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


def test_probe_hlo_counts_every_candidate():
    proc = _run_script("probe_hlo.py", "--leaves", "2", "4")
    names = list(_steps.candidates(("auto", "reference") if _ours_expected() else ()))
    for n in (2, 4):
        section = proc.stdout.split(f"#### step with {n} parameter leaves")[1].split("####")[0]
        rows = [
            line for line in section.splitlines() if line.startswith("| ") and "---" not in line
        ]
        assert [r.split(" | ")[0][2:] for r in rows[1:]] == names
        for r in rows[1:]:
            kernels, reductions, operands, lines = (int(c) for c in r.split(" | ")[1:5])
            assert kernels > 0 and operands > 0 and lines > 0 and reductions >= 0
    assert "per-leaf kernels alone" in proc.stdout
    skip_rows = (
        proc.stdout.split("an exact skip in a plain momentum step")[1].split("####")[0].splitlines()
    )
    assert [r.split(" | ")[0][2:] for r in skip_rows if r.startswith("| ")][1:] == [
        "none",
        "select",
        "bit blend",
    ]
    cond_rows = proc.stdout.split("#### one conditional")[-1].splitlines()
    assert [r.split(" | ")[0][2:] for r in cond_rows if r.startswith("| ")][1:] == [
        "none",
        "lax.cond, a scalar branch",
        "jax.debug.callback, every step",
        "lax.cond around jax.debug.callback",
    ]
    if _ours_expected():
        parts = proc.stdout.split("loss_scaled's parts, one added after another, 2 leaves")[1]
        rows = [r for r in parts.split("####")[0].splitlines() if r.startswith("| ")]
        import probe_hlo

        assert [r.split(" | ")[0][2:] for r in rows[1:]] == list(probe_hlo.PARTS)


def test_probe_step_overhead_reports_every_variant():
    proc = _run_script("probe_step_overhead.py", "--tiny")
    import probe_step_overhead

    tables = proc.stdout.split("#### 1. Step overhead, decomposed")[1:]
    rows = [r for r in tables[0].splitlines() if r.startswith("| ") and "---" not in r]
    assert [r.split(" | ")[0][2:] for r in rows[1:]] == list(probe_step_overhead.CANDIDATES)
    for r in rows[1:]:
        median, ratio = float(r.split(" | ")[1]), float(r.split(" | ")[4])
        assert median > 0 and math.isfinite(ratio) and ratio > 0
    rows = [r for r in tables[1].splitlines() if r.startswith("| ") and "---" not in r]
    assert [r.split(" | ")[0][2:] for r in rows[1:]] == [
        "elementwise",
        "elementwise + never-run host callback",
    ]


def test_probe_hlo_parts_add_what_they_name():
    """Each step of the probe's ablation holds what its row says it adds."""
    pytest.importorskip("jax_amp_scale")
    if not _ours_expected():
        pytest.skip("no native module")
    import probe_hlo

    hlo = {name: probe_hlo.compile_step(b, 3)[0] for name, b in probe_hlo.PARTS.items()}
    plain, unscale, skip, default = hlo.values()
    assert "custom_call_target" not in plain
    assert "jas_unscale_and_check" in unscale and "jas_update_scale" not in unscale
    assert " select(" not in unscale and " conditional(" not in unscale
    # One scalar conditional decides the skip; a select per leaf (3 params,
    # 3 momenta at least) applies it; no host callback.
    assert "jas_update_scale" in skip and skip.count(" conditional(") == 1
    assert skip.count(" select(") >= 6 and "callback" not in skip
    assert "jas_host_report" not in skip
    # The report: on CPU the native host report, not a host callback.
    assert default.count(" conditional(") >= 1 and "jas_host_report" in default
    assert "callback" not in default


def test_probe_hlo_skips_are_exact():
    """The probe's two skips keep the old values bit for bit, or apply the step."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import probe_hlo

    params = [jnp.array([0.5, -1.0, jnp.nan]), jnp.array([2.0, 0.0, -0.0])]
    moms = [jnp.array([0.1, -0.0, 3.0]), jnp.array([jnp.inf, 1e-40, -2.0])]
    batch = jnp.array([1.0, -0.5, 0.25])
    plain = jax.jit(probe_hlo.momentum_step("none"))(params, moms, batch, jnp.float32(0))
    for skip in ("select", "bit blend"):
        f = jax.jit(probe_hlo.momentum_step(skip))
        for got, want in zip(
            jax.tree.leaves(f(params, moms, batch, jnp.float32(0))),
            jax.tree.leaves(plain),
            strict=True,
        ):
            np.testing.assert_array_equal(
                np.asarray(got).view(np.int32), np.asarray(want).view(np.int32)
            )
        new_p, new_m = f(params, moms, batch, jnp.float32(1))  # skipped
        # moments kept bit for bit; parameters get a zero update (p + 0:
        # -0.0 becomes 0.0, as with optax's zero updates)
        for got, want in zip(new_m, moms, strict=True):
            np.testing.assert_array_equal(
                np.asarray(got).view(np.int32), np.asarray(want).view(np.int32)
            )
        for got, want in zip(new_p, params, strict=True):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want) + 0.0)


@pytest.mark.skipif(not _ours_expected(), reason="needs the native extension")
def test_probe_transpose_times_every_shape():
    proc = _run_script("probe_transpose.py", "--tiny", timeout=300)
    table = proc.stdout.split("#### probe:")[1]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ")][1:]
    assert [r[0][2:] for r in rows] == [
        "fused",
        "copy, native pass, update",
        "transpose copy alone",
        "dot alone",
    ]
    assert all(float(r[1]) > 0 for r in rows)
