"""Runs tests/multidevice (eight virtual devices) in a process of its own.

The quick part runs with the default suite; the long grids carry the
``slow`` marker there and run with ``-m slow`` (CI).  The process is started
as soon as collection selects one of these tests (`pytest_collection_finish`
in tests/conftest.py), so it runs beside the rest of the session; the test
waits for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARKERS = {"test_multidevice_quick_tier": "not slow", "test_multidevice_slow_tier": "slow"}


class Tier:
    """`pytest tests/multidevice -m MARKER` running in a child process."""

    def __init__(self, marker: str) -> None:
        env = {**os.environ, "JAS_MULTIDEVICE": "1", "JAX_PLATFORMS": "cpu"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker]
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in result)
        self.proc = subprocess.Popen(
            [*cmd, "tests/multidevice"],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def result(self) -> tuple[int, str]:
        rc = self.proc.wait()
        self.log.seek(0)
        out = self.log.read()
        self.log.close()
        return rc, out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _check(request: pytest.FixtureRequest, name: str) -> None:
    tier = request.config.stash.get(TIERS, {}).pop(name, None) or Tier(MARKERS[name])
    rc, out = tier.result()
    # 5: nothing selected for this marker, which would hide a lost folder.
    assert rc == 0, out[-9000:]
    assert " passed" in out, out[-2000:]


TIERS = pytest.StashKey[dict]()


def test_multidevice_quick_tier(request):
    _check(request, "test_multidevice_quick_tier")


@pytest.mark.slow
def test_multidevice_slow_tier(request):
    _check(request, "test_multidevice_slow_tier")
