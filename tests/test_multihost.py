"""Many hosts: processes on this machine joined by `jax.distributed` agree bit for bit.

Starts NUM_PROCESSES copies of tests/multihost_worker.py (2 CPU devices each)
on loopback, with an overflow injected into ONE process's local batch at one
step, and checks that every process, and every device copy within it, ends
with the same scale, tracker, skipped count, found trace and params, bit for
bit.  The whole job is bounded by TIMEOUT_S; on failure or timeout every
process is killed and its log shown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests._rule import rule

# Three processes joined by jax.distributed: CI runs it (python -m pytest -m slow).
pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("multihost_worker.py")
NUM_PROCESSES = 3
OVERFLOW_PROCESS = 1
OVERFLOW_STEP = 2
STEPS = 6
TIMEOUT_S = 300  # the whole job, start to exit; a healthy run takes far less


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(procs):
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the worker and anything it spawned
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


def launch(n, out_dir, extra_args=(), timeout_s=TIMEOUT_S):
    """Runs n workers to completion; returns their logs or fails the test."""
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    # Each process: 2 devices (the test session's 8 would make 8n).
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(WORKER.parent.parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    coordinator = f"127.0.0.1:{_free_port()}"
    logs = [Path(out_dir) / f"process{i}.log" for i in range(n)]
    procs = []
    try:
        for i in range(n):
            with open(logs[i], "w") as log:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(WORKER),
                            f"--coordinator={coordinator}",
                            f"--num-processes={n}",
                            f"--process-id={i}",
                            f"--out={out_dir}",
                            f"--steps={STEPS}",
                            f"--overflow-process={OVERFLOW_PROCESS}",
                            f"--overflow-step={OVERFLOW_STEP}",
                            f"--timeout={timeout_s // 2}",
                            *extra_args,
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,  # killable as a group
                    )
                )
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                _kill(procs)
                why = f"process {failed} failed" if failed else f"timed out after {timeout_s}s"
                pytest.fail(f"multi-host job {why}:\n{_tails(logs)}")
            time.sleep(0.2)
        if any(p.returncode != 0 for p in procs):
            pytest.fail(f"multi-host job failed:\n{_tails(logs)}")
    finally:
        _kill(procs)
    return [log.read_text() for log in logs]


def _tails(logs, n=4000):
    return "\n".join(f"--- {log.name} ---\n{log.read_text()[-n:]}" for log in logs if log.exists())


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("multihost")
    launch(NUM_PROCESSES, out)
    return [dict(np.load(out / f"process{i}.npz")) for i in range(NUM_PROCESSES)]


# How the step is written (see multihost_worker.py): by hand under jit, data
# parallel and fully sharded; by hand, with jas.value_and_grad and with
# loss_scaled under shard_map (local found_inf, reduced by axis_name); and
# with loss_scaled under jit.
NAMES = (
    "data_parallel",
    "fully_sharded",
    "shard_map",
    "value_and_grad_shard_map",
    "loss_scaled",
    "loss_scaled_shard_map",
)
CONFIGS = [f"{name}/{backend}" for name in NAMES for backend in ("reference", "ffi")]


def test_every_process_joined_one_job(results):
    for r in results:
        assert int(r["process_count"]) == NUM_PROCESSES
        assert int(r["device_count"]) == 2 * NUM_PROCESSES
        assert str(r["cpu_collectives"]) == "gloo"  # JAX's default, not set by us


def _expected_trace():
    found = [step == OVERFLOW_STEP for step in range(STEPS)]
    scale, tracker = np.float32(2.0**8), 0
    for f in found:
        scale, tracker = rule(scale, tracker, f, 2.0, 0.5, 2)
    return found, scale, tracker


@pytest.mark.parametrize("config", CONFIGS)
def test_every_process_ends_in_the_same_state(results, config):
    keys = sorted(k for k in results[0] if k.startswith(config + "/"))
    assert {k.split("/", 2)[2] for k in keys} >= {
        "scale",
        "tracker",
        "skipped",
        "found",
        "params/w",
        "params/b",
    }
    first = results[0]
    for r in results[1:]:
        assert sorted(k for k in r if k.startswith(config + "/")) == keys
        for k in keys:
            # Bit for bit: same dtype, shape and bytes.
            assert r[k].dtype == first[k].dtype and r[k].shape == first[k].shape, k
            assert r[k].tobytes() == first[k].tobytes(), k
    # ... and every device copy within a process agrees too.
    for k in keys:
        if "params/" not in k:
            copies = first[k]
            assert len(copies) == 2, k
            assert all(c.tobytes() == copies[0].tobytes() for c in copies), k


@pytest.mark.parametrize("config", CONFIGS)
def test_the_one_overflow_is_everyone_s_skip(results, config):
    found, scale, tracker = _expected_trace()
    r = results[OVERFLOW_PROCESS]  # the others are equal (test above)
    np.testing.assert_array_equal(r[f"{config}/found"][0], found)
    assert r[f"{config}/skipped"][0] == 1
    assert r[f"{config}/scale"][0] == scale and r[f"{config}/tracker"][0] == tracker
    assert np.all(np.isfinite(r[f"{config}/params/w"]))
    if config.startswith("loss_scaled"):  # the optax state's own counters
        assert r[f"{config}/total"][0] == STEPS
        assert not r[f"{config}/last_found"][0]


def test_configurations_and_backends_agree(results):
    # The step written three ways sums float16 gradients in different orders:
    # close params.  The two backends of one way: the same bits.
    r = results[0]
    want = r["data_parallel/reference/params/w"]
    for config in CONFIGS:
        np.testing.assert_allclose(r[f"{config}/params/w"], want, rtol=2e-3, atol=1e-4)
    for name in NAMES:
        keys = [k.split("/", 2)[2] for k in r if k.startswith(f"{name}/reference/")]
        assert len(keys) >= 6
        for k in keys:
            a, b = r[f"{name}/reference/{k}"], r[f"{name}/ffi/{k}"]
            assert a.tobytes() == b.tobytes(), (name, k)


def test_readme_example_runs_and_processes_agree():
    # README's command: examples/multihost.py launches 2 processes itself and
    # bounds the job by its --timeout (it kills them on failure).
    example = WORKER.parent.parent / "examples" / "multihost.py"
    done = subprocess.run(
        [sys.executable, str(example), "--processes", "2", "--timeout", "150"],
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "PYTHONPATH": str(WORKER.parent.parent)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "all 2 processes agree"
    # 2**12, growth every 2 steps, 8 steps, the overflow at step 3:
    scale, tracker = np.float32(2.0**12), 0
    for t in range(8):
        scale, tracker = rule(scale, tracker, t == 3, 2.0, 0.5, 2)
    for i, line in enumerate(lines[:2]):
        assert line.startswith(f"process {i}/2: scale={scale} tracker={tracker} skipped=1/8 ")
