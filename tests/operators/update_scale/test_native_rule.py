"""Builds and runs tests/native/rule_test.cc under ASan+UBSan (leak checks on).

It checks ffi/update_scale.h and the headers it is built from on their own:
MulByFactor (torch_rule.h) against the hardware's float(double(x) * g)
(torch's rounding) over millions of inputs, CANN's float32 product
(cann_rule.h) and the float16/bfloat16 conversions (float_formats.h), and the
rule with in-place aliasing.  Skipped only when no C++ compiler is present.
"""

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
CXX = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


@pytest.mark.slow
@pytest.mark.trimmed
@pytest.mark.skipif(CXX is None, reason="no C++ compiler on PATH")
def test_rule_header_under_sanitizers(tmp_path):
    exe = tmp_path / "rule_test"
    cmd = [
        CXX,
        "-std=c++17",
        "-O1",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=undefined",
        f"-I{ROOT / 'ffi'}",
        str(ROOT / "tests" / "native" / "rule_test.cc"),
        "-o",
        str(exe),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["ASAN_OPTIONS"] = "detect_leaks=1"
    res = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("ok")


@pytest.mark.slow  # every float32 pattern: about 14 s
@pytest.mark.skipif(CXX is None, reason="no C++ compiler on PATH")
def test_float16_loop_f16c_equals_portable(tmp_path):
    """tests/native/f16_test.cc: the F16C float16 loop against the portable one.

    Optimised, no sanitizers: it walks every float32 pattern (about 10 s).
    """
    exe = tmp_path / "f16_test"
    cmd = [CXX, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'ffi'}"]
    cmd += [str(ROOT / "tests" / "native" / "f16_test.cc"), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("ok")
