"""Builds the test-only extension ``_ascend_testing`` with the project's CMake.

It configures this checkout's CMakeLists.txt with ``JAS_TESTING=ON`` (CUDA
off) and builds only that target, so it gets exactly the flags of the
installed extensions; ``JAS_SANITIZE=ON`` in the environment builds it with
AddressSanitizer + UBSan, like ``.ci/run``'s sanitizer job builds the package.
The module is never installed: tests import it from the build directory
(``$JAS_TEST_BUILD_DIR`` when set, else ``build/tests-<plain|asan>-<python
tag>/``; kept between runs, so a rebuild is incremental).

Needs CMake, a C++17 compiler, nanobind and jaxlib (``pip install -e
".[test]"`` provides the Python parts).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE = "_ascend_testing"


def sanitize() -> bool:
    return os.environ.get("JAS_SANITIZE", "").upper() in ("ON", "1", "TRUE")


def build_dir() -> Path:
    if os.environ.get("JAS_TEST_BUILD_DIR"):
        return Path(os.environ["JAS_TEST_BUILD_DIR"]).resolve()
    kind = "asan" if sanitize() else "plain"
    return ROOT / "build" / f"tests-{kind}-{sys.implementation.cache_tag}"


def _attempt(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    # The sanitizer job preloads the ASan runtime into Python; the compiler
    # needs none of it.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)


def _failure(res: subprocess.CompletedProcess[str]) -> str:
    """What a failed build printed, the failing command's part first (the
    header warnings after it can run to thousands of lines)."""
    out = res.stdout + res.stderr
    at = out.find("FAILED:")
    failed = out[at : at + 6000] if at >= 0 else ""
    return f"exit {res.returncode}\n{failed}\n[...]\n{out[-3000:]}"


def _run(cmd: list[str], tries: int = 1) -> None:
    """Runs `cmd`; a build (`tries` 2) runs once more, one job at a time,
    when it fails: CI once saw `ar` fail with no message, mid-suite, where
    the same build succeeds alone."""
    failures = []
    for n in range(tries):
        res = _attempt(cmd if n == 0 else [*cmd[:-2], "-j", "1"])
        if res.returncode == 0:
            return
        failures.append(_failure(res))
    raise RuntimeError(f"building {MODULE} failed: {' '.join(cmd)}\n" + "\n---\n".join(failures))


def build() -> Path:
    """Configures (first time) and builds the module; returns its path.

    One build at a time per build directory (a file lock): parallel test
    workers (``pytest -n``) each ask for the module."""
    out = build_dir()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _build(out)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(out: Path) -> Path:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError(f"cmake is needed to build the test extension {MODULE}")
    # Configured every time (about a second): a changed JAS_SANITIZE or
    # Python reconfigures the same directory instead of reusing stale flags.
    cmd = [
        cmake,
        "-S",
        str(ROOT),
        "-B",
        str(out),
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DPython_EXECUTABLE={sys.executable}",
        "-DJAS_TESTING=ON",
        "-DJAS_CUDA=OFF",
        f"-DJAS_SANITIZE={'ON' if sanitize() else 'OFF'}",
    ]
    if not (out / "CMakeCache.txt").exists() and shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    _run(cmd)
    _run([cmake, "--build", str(out), "--target", MODULE, "-j", str(os.cpu_count() or 2)], tries=2)
    path = out / f"{MODULE}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not path.exists():
        raise RuntimeError(f"building {MODULE} produced no {path}")
    return path


if __name__ == "__main__":
    print(build())
