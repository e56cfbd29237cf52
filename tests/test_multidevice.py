"""Runs tests/multidevice (eight virtual devices) in a process of its own.

The quick part runs with the default suite; the long grids carry the
``slow`` marker there and run with ``-m slow`` (CI).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(marker: str) -> None:
    env = {**os.environ, "JAS_MULTIDEVICE": "1", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker]
    out = subprocess.run(
        [*cmd, "tests/multidevice"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    # 5: nothing selected for this marker, which would hide a lost folder.
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert " passed" in out.stdout, out.stdout[-2000:]


def test_multidevice_quick_tier():
    _run("not slow")


@pytest.mark.slow
def test_multidevice_slow_tier():
    _run("slow")
