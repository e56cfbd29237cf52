"""The facts that recur across pages say the same thing everywhere.

One source, docs/_facts.toml: the platform status, the exceptions users
catch, the optax.MultiSteps rule (inside works, around raises), the path
`"auto"` takes on several devices and on each platform, and what the
reference-only fallback promises.  The facts the code decides are checked
against the code; then README.md, every page under docs/ and, where users
read them too, the package's docstrings and warnings are checked against
the facts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FACTS = tomllib.loads((DOCS / "_facts.toml").read_text())
PAGES = sorted([ROOT / "README.md", *(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)])


def _prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)


def _paragraphs(page: Path) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", _prose(page)) if p.strip()]


def _where(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


# ---- the facts against the code -------------------------------------------


def test_the_exception_facts_are_what_the_code_raises():
    optax = pytest.importorskip("optax")
    import jax
    import jax.numpy as jnp

    from jax_amp_scale.optax import loss_scaled

    exc = FACTS["exceptions"]
    assert exc["multisteps_around"] == "TypeError"
    assert exc["apply_if_finite_around"] == "TypeError"
    params = {"w": jnp.ones(2)}
    with pytest.raises(TypeError):
        optax.MultiSteps(loss_scaled(optax.sgd(0.1)), 2).init(params)
    with pytest.raises(TypeError):
        optax.apply_if_finite(loss_scaled(optax.sgd(0.1)), 3).init(params)

    assert exc["max_consecutive_overflows"] == "jax.errors.JaxRuntimeError"
    tx = loss_scaled(optax.sgd(0.1), max_consecutive_overflows=2)
    state = tx.init(params)
    step = jax.jit(lambda g, s: tx.update(g, s, params))
    bad = {"w": jnp.array([jnp.inf, 1.0])}
    with pytest.raises(jax.errors.JaxRuntimeError, match="max_consecutive_overflows=2"):
        for _ in range(3):
            _, state = step(bad, state)
            jax.block_until_ready(state)


def test_multisteps_inside_works():
    optax = pytest.importorskip("optax")
    import jax.numpy as jnp

    from jax_amp_scale.optax import loss_scaled

    assert FACTS["multisteps"]["inside_status"] == "works"
    tx = loss_scaled(optax.MultiSteps(optax.sgd(0.1), 2))
    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    _, state = tx.update({"w": jnp.ones(2)}, state, params)
    assert int(state.skipped_steps) == 0


def test_the_native_calls_are_partitioned():
    """Several devices: the native calls carry partitioning rules, so "auto" keeps them."""
    assert FACTS["multi_device"]["partitioned"] is True
    from jax_amp_scale.operators import unscale_and_check, update_scale

    for operator in (unscale_and_check, update_scale):
        assert "@custom_partitioning" in Path(operator.__file__).read_text()


# ---- the pages against the facts ------------------------------------------


def test_the_support_table_is_the_facts():
    page = (DOCS / "support.md").read_text()
    rows = {
        cells[0]: cells[1]
        for line in page.splitlines()
        if line.startswith("| ") and not line.startswith("| ---")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    for key, platform in FACTS["platform"].items():
        assert rows.get(platform["label"]) == platform["status"], (key, rows.get(platform["label"]))
        assert platform["status"] in FACTS["status_words"].values(), key


def test_platform_sentences_use_the_support_tables_words():
    """No page says a GPU or an NPU ran what has not run there."""
    claims = re.compile(
        r"(tested|verified|runs|ran|measured|works) on (a |an |the )?(GPU|NPU|TPU|CUDA|Ascend)",
        re.I,
    )
    negated = re.compile(r"(not|never|no|nothing|yet to be)\b[^.]{0,40}$", re.I)
    found = []
    for page in PAGES:
        for para in _paragraphs(page):
            for m in claims.finditer(para):
                if not negated.search(para[: m.start()]):
                    found.append(f"{_where(page)}: ...{para[max(0, m.start() - 60) : m.end()]}")
    assert not found, "\n".join(found)


def test_readme_and_landing_page_give_cuda_and_ascend_their_status():
    status = FACTS["platform"]["cuda"]["status"]
    assert status == FACTS["platform"]["ascend"]["status"]
    for page in (ROOT / "README.md", DOCS / "index.md"):
        text = " ".join(_prose(page).split())
        assert status in text, _where(page)
        assert "support" in text, f"{_where(page)} does not link the support table"


def test_multisteps_sentences_say_inside_or_around():
    """A sentence on MultiSteps that says it fails says 'around'; one that says
    it works says 'inside'."""
    fails = re.compile(r"TypeError|cannot|raises|refuse", re.I)
    works = re.compile(r"\bworks\b|tested with", re.I)
    bad = []
    for page in PAGES:
        for para in _paragraphs(page):
            for sentence in re.split(r"(?<=[.;:])\s+(?=[A-Z`(])", para):
                if "MultiSteps" not in sentence:
                    continue
                around = "around" in sentence or "MultiSteps(loss_scaled(" in sentence
                inside = "inside" in sentence or "loss_scaled(optax.MultiSteps(" in sentence
                if fails.search(sentence) and not (around or inside):
                    bad.append(f"{_where(page)}: {sentence}")
                if works.search(sentence) and not (inside or around):
                    bad.append(f"{_where(page)}: {sentence}")
    assert not bad, "\n".join(bad)


def test_no_page_says_the_native_calls_cannot_be_partitioned():
    bad = [
        _where(page)
        for page in PAGES
        if re.search(r"cannot be\s+partitioned", page.read_text())
        or re.search(r"auto[^.]{0,80}reference[^.]{0,40}several devices", _prose(page))
    ]
    assert not bad, bad
    backends = " ".join((DOCS / "backends.md").read_text().split())
    assert "keeps them" in backends and "custom_partitioning" in backends


def test_the_benchmark_page_is_not_the_working_notes():
    page = (DOCS / "bench-results.md").read_text()
    assert "RESULTS.md" not in re.findall(r"\{include\}[^\n]*", page) and "{include}" not in page
    assert not re.search(r"\bissue \d+", page)


def test_readme_links_follow_project_urls():
    """With a public address in [project.urls], README's links must be absolute
    under it (a package index shows README without the repository's files)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    urls = pyproject["project"].get("urls", {})
    base = urls.get("Source") or urls.get("Repository")
    links = re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    relative = [x for x in links if "://" not in x and not x.startswith("#")]
    if base:
        assert not relative, f"README links not absolute under {base}: {relative}"
    else:
        assert all((ROOT / x.split("#")[0]).exists() for x in relative)


# ---- the overflow error, in the pages and in the docstrings ---------------

PACKAGE = ROOT / "jax_amp_scale"


def _docstrings() -> list[tuple[str, str]]:
    """``(where, docstring)`` for every module, class and function of the
    package: what the API pages render, and more."""
    import ast

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if not doc:
                    continue
                where = f"{path.relative_to(ROOT)}: {getattr(node, 'name', '(module)')}"
                # A paragraph, or one entry of Args:/Returns:/Raises:, at a time.
                for part in re.split(r"\n\s*\n|\n(?=\s{2,}\*{0,2}\w+(?:, \w+)*:\s)", doc):
                    if part.strip():
                        found.append((where, " ".join(part.split())))
    return found


def _sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.;])\s+(?=[A-Z`(])", text)


def test_the_overflow_error_is_named_as_users_receive_it_in_every_sentence_and_docstring():
    """A sentence (of a page or of a docstring: the rendered API) that names
    FloatingPointError names the JaxRuntimeError users catch too: the former
    is only the text inside the latter, and ``except FloatingPointError``
    does not catch it."""
    users_get = FACTS["exceptions"]["max_consecutive_overflows"]
    texts = [(_where(p), para) for p in PAGES for para in _paragraphs(p)] + _docstrings()
    bad = [
        f"{where}: {sentence[:200]}"
        for where, text in texts
        for sentence in _sentences(text)
        if "FloatingPointError" in sentence and users_get.rsplit(".", 1)[-1] not in sentence
    ]
    assert not bad, "\n".join(bad)


# ---- a frozen run's likely causes -----------------------------------------


def _sections(page: Path) -> list[tuple[str, str]]:
    """``(heading, prose)`` per section of the page, code blocks left out."""
    parts = re.split(r"^(#{1,6} .*)$", _prose(page), flags=re.M)
    heads = ["(top)", *parts[1::2]]
    return [
        (h.lstrip("# ").strip(), " ".join(body.split()))
        for h, body in zip(heads, parts[::2], strict=True)
    ]


def test_multisteps_around_is_no_cause_of_a_frozen_run():
    """optax.MultiSteps around loss_scaled raises TypeError at init, so it can
    never be why a run is frozen: no list of the likely causes (a page's
    section, the runaway warning itself) names it."""
    assert FACTS["multisteps"]["around_status"] == "TypeError"
    bad = [
        f"{_where(page)} ({heading}): lists MultiSteps among the likely causes"
        for page in PAGES
        for heading, prose in _sections(page)
        if re.search(r"likely causes?", prose) and "MultiSteps" in prose
    ]
    import warnings

    import numpy as np

    from jax_amp_scale.training import reports

    report = reports.OverflowReport(limit=None, floor=None, dynamic=True)
    bits = np.array(np.float32(1.0)).view(np.uint32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report(np.array(True), bits, np.array(reports.RUNAWAY_WARNING), bits)
    runaway = [str(w.message) for w in caught if "overflowing steps in a row" in str(w.message)]
    assert runaway, [str(w.message) for w in caught]
    bad += [f"the runaway warning: {m}" for m in runaway if "MultiSteps" in m]
    with pytest.raises(FloatingPointError) as raised:
        reports.OverflowReport(limit=3, floor=None, dynamic=True)(
            np.array(True), bits, np.array(3), bits
        )
    if "MultiSteps" in str(raised.value):
        bad.append(f"the max_consecutive_overflows error: {raised.value}")
    assert not bad, "\n".join(bad)


# ---- the scalers ----------------------------------------------------------


def _scaler_constructors() -> set[str]:
    import jax_amp_scale

    return {name for name in jax_amp_scale.__all__ if name.endswith("_scaler")}


NUMBER_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def test_the_scalers_the_training_guide_lists_are_the_public_constructors():
    constructors = _scaler_constructors()
    assert len(constructors) >= 4, constructors  # amax, dynamic, no_op, static at least
    text = (DOCS / "guide" / "training.md").read_text()
    section = text.split("\n## Scalers\n", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| ")]
    listed = {m for line in table for m in re.findall(r"jas\.(\w+_scaler)\(", line)}
    assert listed == constructors, (
        f"the Scalers table builds {listed}, the package has {constructors}"
    )
    count = re.search(r"\b(\w+) kinds share one interface", " ".join(section.split()))
    assert count, "the Scalers section no longer says how many kinds share the interface"
    assert NUMBER_WORDS.get(count.group(1).lower()) == len(constructors), count.group(0)


def test_the_landing_page_names_every_scaler():
    constructors = _scaler_constructors()
    named = set(re.findall(r"\b(\w+_scaler)\b", _prose(DOCS / "index.md")))
    assert named == constructors, f"docs/index.md names {named}, the package has {constructors}"


# ---- what "auto" picks, per platform --------------------------------------


def test_the_auto_facts_are_what_the_code_picks():
    import jax_amp_scale as jas
    from jax_amp_scale.mechanisms import handlers

    auto = FACTS["auto"]
    examples = {"cpu": "cpu", "cuda": "cuda", "ascend": "ascend", "other": "tpu"}
    assert set(auto) == set(examples)
    for op in (handlers.UPDATE_SCALE, handlers.UNSCALE_AND_CHECK):
        native = handlers.AUTO_NATIVE[op]
        for key, platform in examples.items():
            picks = "ffi" if platform in native else "reference"
            assert picks == auto[key]["picks"], (op, key)
    # amax_scaler's pass: native on the CPU only.
    assert handlers.AUTO_NATIVE[handlers.UNSCALE_CHECK_AMAX] == {"cpu"}
    assert auto["ascend"]["platform_names"] == sorted(handlers.CANN_PLATFORMS)
    # What this process answers where it decides without hardware.
    if "ffi" in jas.available_backends("cpu"):
        assert jas.auto_backend("cpu") == auto["cpu"]["picks"]
    for platform in ("cuda", "gpu", "tpu", "rocm"):
        assert jas.auto_backend(platform) == "reference", platform
    # The reasons the facts give are the platform status the support table gives.
    assert FACTS["platform"]["cuda"]["status"] == FACTS["status_words"]["built"]
    assert "never" in auto["cuda"]["why"] and "never" in auto["ascend"]["why"]


def _says_auto_is_measured_faster(text: str) -> bool:
    """Whether `text` says "auto" picks, on every platform, what was measured faster."""
    return bool(
        re.search(
            r"auto\W[^.]{0,80}?\b(the one measured faster|the faster one|"
            r"picks the faster|the faster per platform|the fastest)\b",
            text,
            re.I,
        )
    )


@pytest.mark.parametrize("page", PAGES, ids=_where)
def test_no_page_says_auto_picks_what_was_measured_faster(page):
    """On CUDA "auto" takes the reference, never measured against the native
    handler; on Ascend the native operator, never run: neither is a
    measurement.  A page says what "auto" picks per platform and why."""
    bad = [p for p in _paragraphs(page) if _says_auto_is_measured_faster(p)]
    assert not bad, f"{_where(page)}: " + "\n".join(bad)


def test_no_docstring_says_auto_picks_what_was_measured_faster():
    bad = [
        f"{where}: {doc[:160]}"
        for where, doc in _docstrings()
        if _says_auto_is_measured_faster(doc)
    ]
    assert not bad, "\n".join(bad)


def test_the_backends_table_gives_the_auto_facts():
    page = (DOCS / "backends.md").read_text()
    rows = {
        cells[0]: cells
        for line in page.split("## Which backend runs where", 1)[1].splitlines()
        if line.startswith("| ") and not line.startswith("| ---")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    header = rows.pop("platform")
    column = header.index('`"auto"` picks')
    for key, fact in FACTS["auto"].items():
        cell = rows[fact["label"]][column]
        assert re.match(r"\w+", cell).group() == fact["picks"], (key, cell)
        assert fact["why_short"] in " ".join(cell.split()), (key, cell, fact["why_short"])


# ---- "eight devices": virtual CPU devices ---------------------------------

EIGHT_DEVICES = re.compile(r"\b(eight|8)[- ](?:\w+ ){0,2}?devices?\b|\beight-device\b", re.I)
SAYS_VIRTUAL_CPU = re.compile(r"virtual CPU devices?|xla_force_host_platform_device_count", re.I)
TABLE_LINE = re.compile(r"^\s*(\||\* -|  - )")


def _units(page: Path) -> list[tuple[str, str, str]]:
    """``(heading, before, unit)``: each paragraph of the page's prose, and
    each line of its tables (pipe tables and list-tables) on its own, with
    the heading of its section and, for a table line, the paragraph that
    introduces the table.  Code blocks are left out."""
    kept, fence = [], None
    for line in page.read_text().splitlines():
        if fence is None and line.startswith("```"):
            fence = line
            kept.append("")
        elif fence is not None and line.rstrip() == "```":
            fence = None
            kept.append("")
        elif fence is None or fence.startswith("```{list-table}"):
            kept.append("" if line.startswith(":") else line)
    heading, before, units = "(top)", "", []
    for block in re.split(r"\n\s*\n", "\n".join(kept)):
        lines = [x for x in block.splitlines() if x.strip()]
        if lines and lines[0].startswith("#"):
            heading = lines[0].lstrip("# ").strip()
            units.append((heading, "", heading))
            lines = lines[1:]
        if not lines:
            continue
        if all(TABLE_LINE.match(x) for x in lines):
            units += [(heading, before, " ".join(x.split())) for x in lines]
        else:
            before = " ".join(" ".join(lines).split())
            units.append((heading, "", before))
    return units


def _linked_pages(page: Path, text: str) -> list[Path]:
    targets = re.findall(r"\{doc\}`(?:[^`<]*<)?([^`>]+)>?`", text)
    targets += [t for t in re.findall(r"\]\(([^)#\s]+\.md)", text)]
    found = []
    for target in targets:
        base = DOCS if target.startswith("/") else page.parent
        path = (base / target.lstrip("/")).with_suffix(".md")
        if path.exists():
            found.append(path.resolve())
    return found


def _says_eight_virtual_cpu_devices(page: Path) -> bool:
    return any(
        EIGHT_DEVICES.search(unit) and SAYS_VIRTUAL_CPU.search(unit) for _, _, unit in _units(page)
    )


def _eight_devices_unqualified(page: Path) -> list[str]:
    bad = []
    for heading, before, unit in _units(page):
        if not EIGHT_DEVICES.search(unit):
            continue
        if any(SAYS_VIRTUAL_CPU.search(t) for t in (unit, heading, before)):
            continue
        if any(_says_eight_virtual_cpu_devices(p) for p in _linked_pages(page, unit)):
            continue
        bad.append(f"{_where(page)} ({heading}): {unit[:160]}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=_where)
def test_every_eight_devices_says_virtual_cpu_devices(page):
    """The multi-device tests, benchmarks and contract cells run on eight
    virtual CPU devices in one process, never on eight accelerators: each
    mention says so (its paragraph, its table's heading or introduction), or
    links to a page whose mention does."""
    bad = _eight_devices_unqualified(page)
    assert not bad, "\n".join(bad)


def test_the_eight_devices_check_catches_an_unqualified_mention(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "# T\n\nTested on eight devices.\n\n| a | b |\n| --- | --- |\n| x, 8 devices | y |\n"
    )
    assert len(_eight_devices_unqualified(page)) == 2
    page.write_text(
        "# T\n\nOn 8 virtual CPU devices:\n\n| a | b |\n| --- | --- |\n| x, 8 devices | y |\n"
    )
    assert _eight_devices_unqualified(page) == []


# ---- the examples ---------------------------------------------------------

EXAMPLES = ROOT / "examples"
COUNT_WORDS = {**NUMBER_WORDS, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}


def test_the_examples_pages_count_the_scripts_there_are():
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    for page in (DOCS / "examples.md", EXAMPLES / "README.md"):
        text = " ".join(_prose(page).split())
        stated = [
            w
            for w in re.findall(r"\b(\w+) (?:Python )?scripts\b", text)
            if w.lower() in COUNT_WORDS
        ]
        counts = [COUNT_WORDS[w.lower()] for w in stated if w.lower() in COUNT_WORDS]
        assert counts, f"{_where(page)} does not say how many scripts examples/ holds"
        assert set(counts) == {len(scripts)}, (_where(page), stated, scripts)
    # examples/README.md's table has a row per script.
    rows = re.findall(r"^\| `(\w+\.py)` \|", (EXAMPLES / "README.md").read_text(), flags=re.M)
    assert sorted(rows) == scripts


def test_the_examples_pages_say_the_study_takes_hours():
    for page in (DOCS / "examples.md", EXAMPLES / "README.md"):
        paragraphs = [p for p in _paragraphs(page) if "amax_scaler_study.py" in p]
        lines = [x for x in page.read_text().splitlines() if "amax_scaler_study.py" in x]
        said = [t for t in paragraphs + lines if re.search(r"\bhours?\b", t)]
        assert said, f"{_where(page)} does not say that amax_scaler_study.py takes hours"
        # Nothing says that every script runs in minutes.
        for para in _paragraphs(page):
            if re.search(r"\b(each|every|all)\b[^.]{0,80}\bin (a few )?minutes\b", para, re.I):
                assert "amax_scaler_study" in para, f"{_where(page)}: {para[:160]}"


def test_the_study_run_count_is_what_its_defaults_run():
    """The pages' "N training runs" is counted from the study's own defaults."""
    import sys

    pytest.importorskip("flax")
    source = (EXAMPLES / "amax_scaler_study.py").read_text()
    kinds = re.search(r'"--kinds", default="([^"]+)"', source).group(1).split(",")
    seeds = re.search(r'"--seeds", default="([^"]+)"', source).group(1).split(",")
    sys.path.insert(0, str(EXAMPLES))
    try:
        import amax_scaler_study as study
    finally:
        sys.path.remove(str(EXAMPLES))
    stress = study.stress_variants(150)
    # A variant that sets the first scale runs amax1 as amax (main() skips it).
    skipped = sum(v.init_scale is not None for v in stress) * ("amax1" in kinds)
    runs = len(seeds) * len(kinds) * (1 + len(stress)) - len(seeds) * skipped
    for page in (DOCS / "examples.md", EXAMPLES / "README.md"):
        said = re.findall(r"\((\d+)\s+training\s+runs", page.read_text())
        assert said == [str(runs)], (_where(page), said, runs)


# ---- without the compiled module: the same bits per operator --------------


def _fallback_texts() -> list[tuple[str, str]]:
    """Paragraphs and docstrings on the reference-only fallback, and the
    warning that announces it."""
    import ast

    about = re.compile(r"JAX_AMP_SCALE_DISABLE_NATIVE|compiled module|_native_cpu")
    texts = [(_where(p), para) for p in PAGES for para in _paragraphs(p) if about.search(para)]
    texts += [(w, d) for w, d in _docstrings() if about.search(d)]
    tree = ast.parse((PACKAGE / "mechanisms" / "handlers.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "warn":
            words = " ".join(
                c.value
                for arg in node.args[:1]
                for c in ast.walk(arg)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            )
            if "pure-JAX reference" in words:
                texts.append(("mechanisms/handlers.py: the fallback warning", words))
    return texts


def _fallback_promises() -> list[str]:
    """Where the fallback's "same bits" is promised of more than each operator."""
    fact = FACTS["native_fallback"]
    texts = _fallback_texts()
    assert any("warning" in where for where, _ in texts)
    bad = []
    for where, text in texts:
        if "same bits" not in text:
            continue
        for sentence in _sentences(text):
            if "same bits" in sentence and fact["same_bits_of"] not in sentence:
                bad.append(f"{where}: {sentence[:200]}")
        if fact["whole_run"] not in text:
            bad.append(f"{where}: does not say a whole run may differ ({fact['whole_run']!r})")
    return bad


def test_the_fallback_promises_the_same_bits_per_operator_not_per_run():
    """Without the native module each operator gives the same bits; a whole
    run may not, since XLA fuses the program around the operators otherwise."""
    bad = [b for b in _fallback_promises() if not b.startswith("README.md")]
    assert not bad, "\n".join(bad)


def test_readme_promises_the_fallback_s_same_bits_per_operator():
    bad = [b for b in _fallback_promises() if b.startswith("README.md")]
    assert not bad, "\n".join(bad)


# ---- one answer to "which scaler?" -------------------------------------------

RECOMMENDATION = FACTS["recommendation"]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_default_scaler_is_the_facts():
    import jax_amp_scale as jas
    from jax_amp_scale.optax import get_loss_scaled_state, loss_scaled

    optax = pytest.importorskip("optax")
    state = loss_scaled(optax.sgd(0.1)).init({"w": jax_zeros()})
    name = RECOMMENDATION["default"]
    assert type(get_loss_scaled_state(state).scaler) is type(getattr(jas, name)())


def jax_zeros():
    import jax.numpy as jnp

    return jnp.zeros(2)


@pytest.mark.parametrize("page", RECOMMENDATION["pages"])
def test_every_page_that_recommends_says_the_one_sentence(page):
    assert _flat(RECOMMENDATION["sentence"]) in _flat((ROOT / page).read_text()), page


@pytest.mark.parametrize("name", RECOMMENDATION["docstrings"])
def test_the_user_facing_docstrings_say_the_one_sentence(name):
    import jax_amp_scale as jas
    from jax_amp_scale import optax as jas_optax

    obj = getattr(jas_optax, name, None) or getattr(jas, name)
    assert _flat(RECOMMENDATION["sentence"]) in _flat(obj.__doc__), name


# "`dynamic_scaler()` (the default", "the default `dynamic_scaler()`",
# "`dynamic_scaler()` is the default": every page that names the default
# scaler names the same one.
DEFAULT_NAMED = re.compile(
    r"`(\w+_scaler)\(\)`,? \(?(?:is )?the default\b|the default,? `(\w+_scaler)\(\)`"
)


def test_every_page_naming_a_default_scaler_names_the_same_one():
    named = {}
    for page in PAGES:
        for m in DEFAULT_NAMED.finditer(_flat(_prose(page))):
            named.setdefault(m.group(1) or m.group(2), []).append(_where(page))
    assert set(named) == {RECOMMENDATION["default"]}, named


def test_no_page_recommends_a_scaler_in_other_words():
    # The sentences the three answers of issue 51 used: gone in favour of the one.
    others = re.compile(r"use `amax_scaler` when|Use `dynamic_scaler` when|should use `\w+_scaler")
    found = [_where(p) for p in PAGES if others.search(_flat(p.read_text()))]
    assert not found
