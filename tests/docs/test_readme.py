"""README.md's Python examples, each run alone as a reader would paste it, and its links.

Every ```python block runs by itself in a fresh namespace (nothing defined
beforehand), and what it prints is checked: the quick start's against the
```text block the README shows under it, the other block's against the
``# expected: ...`` comment of each print.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _block(marker: str) -> str:
    (code,) = [b for b in BLOCKS if marker in b]
    return code


def _run_alone(code: str) -> tuple[dict, list[str]]:
    """Runs `code` in a fresh namespace; returns it and the lines printed."""
    namespace: dict = {"__name__": "__readme__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), namespace)
    return namespace, out.getvalue().splitlines()


def _same_numbers(got: str, want: str, rel: float) -> None:
    """Equal text around the numbers; the numbers equal within `rel`."""
    assert NUMBER.sub("#", got) == NUMBER.sub("#", want), (got, want)
    for g, w in zip(NUMBER.findall(got), NUMBER.findall(want), strict=True):
        assert float(g) == pytest.approx(float(w), rel=rel), (got, want)


def test_first_screen_is_a_complete_loop_and_its_output():
    """The first 40 lines hold the loss_scaled loop (under 25 lines) and what it prints."""
    first = "\n".join(README.splitlines()[:40])
    loop = BLOCKS[0]
    assert "loss_scaled(optax.adamw(" in loop and loop in first
    assert len(loop.splitlines()) < 25
    shown = re.search(r"```python\n.*?```\n\n.*?```text\n(.*?)```", first, re.S)
    assert shown, "the loop's output is not within the first 40 lines"


def test_quick_start_prints_what_the_readme_shows():
    namespace, printed = _run_alone(BLOCKS[0])
    shown = re.search(r"```text\n(.*?)```", README, re.S).group(1).splitlines()
    assert len(printed) == len(shown) == 3
    for got, want in zip(printed, shown, strict=True):
        # Steps and skips exactly; the float16 losses within 2% (other jax
        # versions may round the float16 matmuls differently).
        _same_numbers(got, want, rel=0.02)
        assert got.split("skipped")[1] == want.split("skipped")[1] == " 0"
    # The README's sentences under it: no step skipped, the scale at most
    # torch's first scale 2**16 (the ceiling) and above the probe 1.
    state = namespace["opt_state"]
    assert int(state.skipped_steps) == 0 and 1.0 < float(state.scale) <= 2.0**16
    assert "No step was skipped." in README


def test_core_api_step_prints_its_comments():
    code = _block("def train_step(")
    _, printed = _run_alone(code)
    expected = re.findall(r"^print\(.*\)\s+# ([^:]+):", code, re.M)
    assert printed == expected == ["65536.0 1", "32768.0 0"]


def test_every_python_block_is_tested():
    assert len(BLOCKS) == 2, "a new README block needs a test here"


def test_links_resolve():
    """Every relative link of the front page (into docs/, bench/, ...) exists."""
    root = Path(__file__).resolve().parents[2]
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    relative = [link for link in links if "://" not in link]
    assert relative, "no relative links found"
    missing = [link for link in relative if not (root / link).exists()]
    assert not missing, missing
