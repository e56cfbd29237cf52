"""Runs tests/multidevice (eight virtual devices) in a process of its own.

The quick part runs with the default suite; the long grids carry the
``slow`` marker there and run with ``-m slow`` (CI).  The process is started
as soon as collection selects one of these tests (`pytest_collection_finish`
in tests/conftest.py), so it runs beside the rest of the session; the test
waits for it.  Under pytest-xdist every worker collects, but only the first
to claim a tier starts it (two children would each take a core).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARKERS = {"test_multidevice_quick_tier": "not slow", "test_multidevice_slow_tier": "slow"}


def _folder(name: str) -> Path:
    """Where tier `name` writes its log and exit code: one folder per run,
    the same for every pytest-xdist worker (they share the run's id), so that
    one child serves whichever worker runs the test."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    return Path(tempfile.gettempdir()) / f"jas-multidevice-{run}" / name


class Tier:
    """`pytest tests/multidevice -m MARKER` in a child process, started by the
    first worker that claims the tier's folder; its output and exit code go
    to files there, for any worker to read."""

    def __init__(self, name: str) -> None:
        self.folder = _folder(name)
        self.proc: subprocess.Popen | None = None
        self.folder.mkdir(parents=True, exist_ok=True)
        try:  # the claim: only the first worker's open succeeds
            os.close(os.open(self.folder / "claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
        env |= {"JAS_MULTIDEVICE": "1", "JAX_PLATFORMS": "cpu"}  # a session of its own
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", MARKERS[name]]
        # The exit code is written by the shell, after the child: readable
        # whichever process waits for it.
        script = '"$@" > "$0/log" 2>&1; echo $? > "$0/rc.part"; mv "$0/rc.part" "$0/rc"'
        self.proc = subprocess.Popen(
            ["sh", "-c", script, str(self.folder), *cmd, "tests/multidevice"],
            cwd=ROOT,
            env=env,
            start_new_session=True,  # stop() ends the child with its shell
        )

    def result(self, timeout_s: float = 3600.0) -> tuple[int, str]:
        rc_file, deadline = self.folder / "rc", time.monotonic() + timeout_s
        while not rc_file.exists():
            if time.monotonic() > deadline:
                return -1, f"no exit code in {rc_file} after {timeout_s:.0f} s"
            time.sleep(0.5)
        log = self.folder / "log"
        return int(rc_file.read_text()), log.read_text() if log.exists() else ""

    def stop(self, interrupted: bool) -> None:
        """At the end of the session that started the child: wait for it (a
        test on another worker may still be reading it) unless the session
        was interrupted, then remove its folder (and the run's, once empty:
        the other tier may have been claimed by another worker)."""
        if self.proc is not None:
            if interrupted and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            shutil.rmtree(self.folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.folder.parent.rmdir()


def _check(request: pytest.FixtureRequest, name: str) -> None:
    tier = request.config.stash.get(TIERS, {}).get(name) or Tier(name)
    request.config.stash.setdefault(TIERS, {})[name] = tier
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
