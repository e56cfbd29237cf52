"""jax.export of library steps: serialized, run in a fresh process, same bits.

Oracles: the unexported step's outputs (bits), computed in another process;
the artifacts committed in tests/fixtures/ (made by an earlier release, run
by this one); the versioned update-scale target called by hand, which
refuses any other attribute set.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_amp_scale as jas
from jax_amp_scale import export
from tests import export_worker, jax_compat
from tests.fixtures import make_export_fixtures as fx

pytest.importorskip("flatbuffers")  # jax.export's serializer (the "export" extra)

ROOT = pathlib.Path(__file__).resolve().parents[2]
fx.register_optax_states()  # the inner optimizer's state types, by name
FIXTURES = sorted(fx.HERE.glob("*.jax_exported"))


def _run_worker(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.export_worker", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_round_trip_in_a_fresh_process_gives_the_unexported_bits(tmp_path):
    # This process exports and serializes each step and runs it unexported;
    # a fresh one (no library call before) deserializes every artifact, runs
    # it and compares bits.  One checking process serves every case.
    dirs = []
    for name in sorted(fx.STEP_FACTORIES):
        for backend in ["auto", "ffi", "reference"]:
            d = tmp_path / f"{name}-{backend}"
            d.mkdir()
            export_worker.save(name, backend, str(d))
            mlir = export.deserialize((d / "step.bin").read_bytes()).mlir_module()
            if backend == "reference":
                assert "jas_" not in mlir, d.name
            else:  # the native handlers on CPU, under their versioned names
                assert "jas_unscale_and_check_v1" in mlir, d.name
                assert "jas_update_scale_v2" in mlir, d.name
            dirs.append(str(d))
    out = _run_worker("check", *dirs)
    assert out.count("same bits") == len(dirs) == 6, out


@pytest.mark.xfail(
    not jax_compat.CALLS_ARTIFACTS_OF_NEWER_JAX, reason=jax_compat.ARTIFACT_DEVICES, strict=True
)
@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_committed_artifacts_still_run_with_the_same_bits(path):
    # Made by an earlier release (tests/fixtures/make_export_fixtures.py);
    # never regenerated: a failure here breaks users' deployed artifacts.
    data = dict(np.load(path.with_suffix(".npz")))
    got, want = export_worker.run_artifact(path.read_bytes(), data)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(f"u{g.itemsize}"), w.view(f"u{w.itemsize}"))


def test_every_committed_step_has_a_fixture():
    assert {p.stem for p in FIXTURES} == set(fx.STEPS)


def test_jax_alone_refuses_our_targets_and_the_helper_allows_exactly_them():
    state = jas.init_scale_state()
    step = jax.jit(lambda g, s: jas.unscale_and_check(g, s, backend="ffi"))
    args = ([jnp.ones(3)], state)
    with pytest.raises(ValueError, match="jas_unscale_and_check_v1"):
        jax.export.export(step)(*args).serialize()
    assert export.export(step)(*args).serialize()
    assert set(export.exportable_targets()) == {
        "jas_update_scale_v2",
        "jas_unscale_and_check_v1",
        "jas_unscale_check_amax_v1",
    }


def test_scale_state_serializes_with_its_static_fields():
    state = jas.init_scale_state(
        3.0, growth_factor=1.1, backoff_factor=0.3, growth_interval=7, rule="cann"
    )
    exp = export.export(lambda s: jas.update_scale(s, jnp.array(True), backend="reference"))(state)
    back = export.deserialize(exp.serialize())
    out = back.call(state)
    assert (out.growth_factor, out.backoff_factor, out.growth_interval, out.rule) == (
        1.1,
        0.3,
        7,
        "cann",
    )
    assert out.scale.dtype == jnp.float32 and float(out.scale) == float(
        jas.update_scale(state, jnp.array(True), backend="reference").scale
    )


def _update_scale_call(**attrs):
    export.register_handlers()
    call = jax.ffi.ffi_call(
        "jas_update_scale_v2",
        (jax.ShapeDtypeStruct((4,), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.int32)),
    )
    scale = jnp.array([2.0**20, 2.0**20, 3.0, 1.5], jnp.float32)
    tracker = jnp.array([6, 2, 0, 6], jnp.int32)
    found = jnp.array([0.0, 0.0, 1.0, 0.0], jnp.float32)
    return jax.jit(lambda s, t, f: call(s, t, f, **attrs))(scale, tracker, found), (
        scale,
        tracker,
        found,
    )


_V2 = dict(
    growth_factor=np.float64(1.1), backoff_factor=np.float64(0.5), growth_interval=np.int64(7)
)


def test_the_versioned_update_scale_target_called_by_hand():
    # What a serialized program calls: the v2 attribute set, by name.
    got, (scale, tracker, found) = _update_scale_call(**_V2, rule="torch")
    want = jax.vmap(
        lambda s, t, f: jas.amp_update_scale(
            s, t, f, growth_factor=1.1, backoff_factor=0.5, growth_interval=7, backend="reference"
        )
    )(scale, tracker, found)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize(
    "attrs",
    [_V2, {**_V2, "rule": "torch", "extra": np.int64(1)}],
    ids=["without-rule", "an-extra-attribute"],
)
def test_the_versioned_update_scale_target_refuses_another_attribute_set(attrs):
    # A changed attribute set needs a new name (ffi/targets.h): the handler
    # refuses any set but its own instead of guessing.
    with pytest.raises(Exception, match="Wrong number of attributes"):
        _update_scale_call(**attrs)
