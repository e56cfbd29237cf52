"""The documentation's code runs as tests, and its API reference is complete.

Every ```python block of a page under docs/ runs ALONE, in a fresh
namespace, as a reader pasting it into a new interpreter would run it.  A
block that goes on from the one before it says so on the line right above
its fence, and runs in that block's namespace (few blocks do):

    <!-- docs-test: continues -->

Blocks meant only to be read are written ```{code-block} python and are
not run.  A page can say what it needs in an HTML comment on a line of its
own:

    <!-- docs-test: requires optax, torch -->   skipped without these modules
    <!-- docs-test: devices 4 -->               run in a fresh process with
                                                 4 virtual CPU devices
    <!-- docs-test: fresh-process -->           run in a fresh process (a page
                                                 that registers global state)

The site itself is built by ``python -m sphinx -W --keep-going -b html docs
docs/_build/html`` (CI runs it); the check below that every public name has
an API entry runs here too, without Sphinx.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts and p.name != "README.md")
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(\w+)\s*(.*?)\s*-->")
CONTINUES = "<!-- docs-test: continues -->"

sys.path.insert(0, str(DOCS / "_ext"))
from public_api_coverage import PUBLIC_API_MODULES, undocumented  # noqa: E402

sys.path.remove(str(DOCS / "_ext"))


def page_blocks(page: Path) -> list[tuple[int, str]]:
    """``(line, code)`` for each ```python block of the page."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in FENCE.finditer(text)]


def continues(page: Path) -> list[bool]:
    """For each ```python block: whether it goes on from the block before it."""
    text = page.read_text()
    marked = []
    for m in FENCE.finditer(text):
        above = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marked.append(above.strip() == CONTINUES)
    return marked


def page_directives(page: Path) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in DIRECTIVE.finditer(page.read_text())}


RUNNABLE = [p for p in PAGES if page_blocks(p)]


def _page_id(page: Path) -> str:
    return str(page.relative_to(DOCS))


def _script(page: Path) -> str:
    """The page's blocks as one script, each compiled under its own line number
    and run in a fresh namespace unless it continues the block before it."""
    parts = []
    for (line, code), cont in zip(page_blocks(page), continues(page), strict=True):
        if not cont:
            parts.append("__ns__ = {'__name__': '__docs__'}")
        parts.append(f"exec(compile({code!r}, {f'{page}:{line}'!r}, 'exec'), __ns__)")
    return "\n".join(parts) + "\n"


def test_pages_found():
    assert RUNNABLE, "no docs page with ```python blocks: is docs/ there?"


# The longer pages (over 5 s each here) run in the slow tier.
SLOW_PAGES = {"guide/multi-device.md", "guide/export.md", "guide/training.md", "guide/nnx.md",
              "guide/porting-torch.md", "guide/porting-flax.md", "guide/porting-jmp.md"}  # fmt: skip
SLOW_MARKS = (pytest.mark.slow, pytest.mark.trimmed)


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=SLOW_MARKS) if _page_id(p) in SLOW_PAGES else p for p in RUNNABLE],
    ids=_page_id,
)
def test_page_code_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    directives = page_directives(page)
    for module in filter(None, re.split(r"[,\s]+", directives.get("requires", ""))):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{_page_id(page)} needs {module}")
    monkeypatch.chdir(tmp_path)  # files a page writes land here
    if "devices" in directives or "fresh" in directives:
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        if "devices" in directives:
            env["XLA_FLAGS"] = (
                env.get("XLA_FLAGS", "")
                + f" --xla_force_host_platform_device_count={int(directives['devices'])}"
            )
        proc = subprocess.run(
            [sys.executable, "-c", _script(page)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, textwrap.shorten(proc.stderr, 6000)
        return
    namespace: dict = {}
    for (line, code), cont in zip(page_blocks(page), continues(page), strict=True):
        if not cont:
            namespace = {"__name__": "__docs__"}
        exec(compile(code, f"{page}:{line}", "exec"), namespace)


def test_few_blocks_lean_on_the_one_before():
    """Pasted alone, a block must run: the exceptions are marked, and few."""
    marked = {
        f"{_page_id(page)}:{line}"
        for page in RUNNABLE
        for (line, _), cont in zip(page_blocks(page), continues(page), strict=True)
        if cont
    }
    total = sum(len(page_blocks(page)) for page in RUNNABLE)
    assert len(marked) <= total // 4, sorted(marked)
    # A marker (a line of its own) must sit right above a python fence.
    for page in PAGES:
        text = page.read_text()
        on_a_line = re.findall(rf"^{re.escape(CONTINUES)}$", text, re.M)
        above_a_fence = re.findall(rf"^{re.escape(CONTINUES)}\n```python", text, re.M)
        assert len(on_a_line) == len(above_a_fence), _page_id(page)


def test_landing_page_shows_the_readmes_loop():
    """docs/index.md opens with the README's first-screen loop and its output."""
    readme = (ROOT / "README.md").read_text()
    index = (DOCS / "index.md").read_text()
    loop = FENCE.search(readme).group(1)
    output = re.search(r"```text\n(.*?)```", readme, re.S).group(1)
    assert FENCE.search(index).group(1) == loop
    assert re.search(r"```text\n(.*?)```", index, re.S).group(1) == output


def test_every_public_name_has_an_api_entry():
    """What the Sphinx build checks (docs/_ext/public_api_coverage.py), without Sphinx."""
    documented: set[str] = set()
    auto = re.compile(r"^\s*\.\. (?:auto\w+|py:\w+):: ([\w.]+)", re.M)
    current = re.compile(r"^\s*\.\. (?:currentmodule|py:currentmodule|module):: ([\w.]+)", re.M)
    for page in sorted((DOCS / "api").glob("*.rst")):
        module = ""
        for line in page.read_text().splitlines():
            if m := current.match(line):
                module = m.group(1)
            elif m := auto.match(line):
                name = m.group(1)
                documented.add(name if name.startswith("jax_amp_scale") else f"{module}.{name}")
    assert undocumented(PUBLIC_API_MODULES, documented) == []


def test_code_fits_the_page():
    """Python lines of at most 88 characters: the theme shows that many without
    scrolling.  (Shell commands quoted verbatim, one command a line, may scroll.)"""
    fence = re.compile(r"^```(?:python|\{code-block\} python)[ \t]*\n(.*?)^```", re.S | re.M)
    long = [
        f"{_page_id(page)}: {line}"
        for page in PAGES
        for m in fence.finditer(page.read_text())
        for line in m.group(1).splitlines()
        if len(line) > 88
    ]
    assert not long, "\n".join(long)


def test_no_bare_powers_in_prose():
    """``2**15 to 2**20`` outside code renders as bold text in Markdown: quote it."""
    pages = [*PAGES, ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "examples" / "README.md"]
    bare = re.compile(r"\d\*\*\d")
    found = []
    for page in pages:
        in_fence = False
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_fence = not in_fence
                continue
            prose = "".join(line.split("`")[::2])  # outside inline code
            if not in_fence and bare.search(prose):
                found.append(f"{page.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "write powers as code (`2**15`):\n" + "\n".join(found)


def test_signatures_show_dtypes_as_written_in_code():
    """A dataclass's generated signature prints its dtype defaults as
    jnp.float32, not "<class 'jax.numpy.float32'>" (docs/conf.py)."""
    import inspect

    import jax_amp_scale as jas

    spec = importlib.util.spec_from_file_location("docs_conf", DOCS / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    raw = str(inspect.signature(jas.Policy))
    assert "<class 'jax.numpy.float32'>" in raw  # what autodoc would print
    shown, _ = conf._dtypes_as_written(None, "class", "Policy", jas.Policy, {}, raw, None)
    assert "= jnp.float32" in shown and "<class" not in shown
