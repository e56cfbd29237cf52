"""tools/layering.py, the layering check `.ci/run` runs in its lint step."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "layering.py"


def _run(root: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), str(root)], capture_output=True, text=True, timeout=60
    )


def test_the_package_has_no_finding():
    res = _run(ROOT)
    assert res.returncode == 0, res.stdout
    assert res.stdout.splitlines()[-1] == "layering: 0 findings"


def test_each_kind_of_finding_is_counted_and_fails(tmp_path):
    pkg = tmp_path / "jax_amp_scale"
    (pkg / "a").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "a" / "__init__.py"):
        init.write_text("")
    (pkg / "a" / "m.py").write_text("def _p():\n    pass\n")
    (pkg / "b.py").write_text(
        "from jax_amp_scale.a.m import _p\n"  # a private name of another module
        "from jax_amp_scale.a import m\n"  # a module: fine
        "import jax\n"
        "m._p()\n"  # a private name through the module
        "def test_hook():\n    pass\n"  # a test hook in the package
        "x = jax._src\n"  # informational only
    )
    res = _run(tmp_path)
    assert res.returncode == 1
    assert res.stdout.splitlines() == [
        "(informational) jax_amp_scale/b.py:7: uses jax._src",
        "jax_amp_scale/b.py:1: from jax_amp_scale.a.m import _p",
        "jax_amp_scale/b.py:5: test hook 'test_hook' ships in the package",
        "jax_amp_scale/b.py:4: m._p",
        "layering: 3 findings",
    ]
