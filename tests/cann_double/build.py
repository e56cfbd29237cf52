"""Builds the CANN test double with the system C compiler.

Layout of one build (``build(out_dir)``):

    out_dir/core/      libcann_double.so: the one copy of the double's state,
                       which every library below links (absolute rpath)
    out_dir/full/      libascendcl.so libnnopbase.so, libopapi_math.so
                       (aclnnAmpUpdateScale), libopapi_nn.so
                       (aclnnForeachNonFiniteCheckAndUnscale), libopapi.so (both)
    out_dir/full2/     the same again: a second installation (mixed-install tests)
    out_dir/legacy/    only libopapi.so (both operators) besides the two (older CANN)
    out_dir/no_op/     libopapi_math.so without the operator, libopapi.so with both
    out_dir/no_nn/     libopapi_math.so only: no fused operator
    out_dir/missing/   only libascendcl.so and libnnopbase.so

As in CANN, each operator library depends on the libnnopbase.so and
libascendcl.so of its own directory (DT_NEEDED, rpath $ORIGIN).

With JAS_SANITIZE=ON in the environment the double is built with
AddressSanitizer too (run Python with libasan preloaded).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _cc() -> str:
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise RuntimeError("no C compiler (cc, gcc or clang) to build the CANN test double")


def _flags() -> list[str]:
    flags = [
        "-std=gnu11",
        "-O1",
        "-g",
        "-fPIC",
        "-shared",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fvisibility=hidden",
        f"-I{HERE}",
    ]
    if os.environ.get("JAS_SANITIZE", "").upper() in ("ON", "1", "TRUE"):
        flags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    return flags


def _so(cc: str, out: Path, src: str, *extra: str, core: Path | None = None) -> None:
    cmd = [cc, *_flags(), str(HERE / src), "-o", str(out), *extra]
    if core is not None:
        cmd += [f"-L{core}", "-lcann_double", f"-Wl,-rpath,{core}"]
    else:
        cmd += ["-lm", "-lpthread", "-Wl,-soname,libcann_double.so"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def build(out_dir: Path) -> Path:
    cc = _cc()
    core = (out_dir / "core").resolve()
    core.mkdir(parents=True, exist_ok=True)
    _so(cc, core / "libcann_double.so", "cann_double.c")
    ops = {
        "full": {"libopapi_math.so": "M", "libopapi_nn.so": "N", "libopapi.so": "MN"},
        "full2": {"libopapi_math.so": "M", "libopapi_nn.so": "N", "libopapi.so": "MN"},
        "legacy": {"libopapi.so": "MN"},
        "no_op": {"libopapi_math.so": "", "libopapi.so": "MN"},
        "no_nn": {"libopapi_math.so": "M"},
        "missing": {},
    }
    for variant, libs in ops.items():
        d = (out_dir / variant).resolve()
        d.mkdir(parents=True, exist_ok=True)
        _so(cc, d / "libascendcl.so", "ascendcl.c", "-Wl,-soname,libascendcl.so", core=core)
        _so(cc, d / "libnnopbase.so", "nnopbase.c", "-Wl,-soname,libnnopbase.so", core=core)
        for name, which in libs.items():
            flags = [f'-DCD_LIBNAME="{name}"', f"-Wl,-soname,{name}"]
            flags += ["-DCD_MATH"] if "M" in which else []
            flags += ["-DCD_NN"] if "N" in which else []
            deps = [
                "-Wl,--no-as-needed",
                f"-L{d}",
                "-lnnopbase",
                "-lascendcl",
                "-Wl,-rpath,$ORIGIN",
            ]
            _so(cc, d / name, "opapi.c", *flags, *deps, core=core)
    return out_dir


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "build/cann_double")))
