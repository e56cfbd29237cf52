"""The examples' and studies' figures and tables, from results/NAME.json."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable
from typing import Any

from figures_data import Fig, entries, minutes_text, provenance_line, result
from figures_data import md_table as _md

Figs = dict[str, Fig]


def _demo(out: Figs) -> None:
    d, src = result("demo")["data"], "results/demo.json"
    out["demo.eval_loss"] = Fig(f"{d['eval_loss']:.4f}", src)
    out["demo.baseline_eval_loss"] = Fig(f"{d['baseline_eval_loss']:.4f}", src)
    out["demo.gap"] = Fig(f"{100 * (d['eval_loss'] / d['baseline_eval_loss'] - 1):+.1f}%", src)
    out["demo.final_scale"] = Fig(f"{d['final_scale']:g}", src)
    out["demo.last_batch_loss"] = Fig(f"{d['last_batch_loss']:.4f}", src)
    out["demo.skipped_at"] = Fig(", ".join(map(str, d["skipped_at"])), src)


def _transformer(out: Figs) -> None:
    src = "results/transformer_lm.json"
    modes = result("transformer_lm")["data"]["modes"]
    for mode, m in modes.items():
        out[f"lm.{mode}.eval_loss"] = Fig(f"{m['eval_loss']:.4f}", src)
        out[f"lm.{mode}.zeros"] = Fig(f"{100 * m['grad_zeros_at_init']:.1f}%", src)
    for mode in ("float16+scaling", "float16", "bfloat16"):
        gap = modes[mode]["eval_loss"] - modes["float32"]["eval_loss"]
        out[f"lm.{mode}.gap"] = Fig(f"{gap:+.4f}", src)
    for mode, m in result("transformer_lm_mean")["data"]["modes"].items():
        out[f"lm_mean.{mode}.eval_loss"] = Fig(f"{m['eval_loss']:.4f}", "results/transformer_lm_mean.json")  # fmt: skip


def _readme(out: Figs) -> None:
    """README's fresh-machine commands, timed by tools/time_readme_commands.py."""
    d, src = result("readme_commands")["data"]["commands"], "results/readme_commands.json"
    for name, r in d.items():
        out[f"readme.{name}.install"] = Fig(minutes_text(r["install_seconds"]), src)
        out[f"readme.{name}.run"] = Fig(minutes_text(r["run_seconds"]), src)
        out[f"readme.{name}.jax"] = Fig(r["jax"], src)
    for k, n in d["tests"]["counts"].items():
        out[f"readme.tests.{k}"] = Fig(f"{n:,}", src)


def _power_text(x: float) -> str:
    e = math.log2(x)
    return f"`2**{e:.0f}`" if e == round(e) else f"{x:g}"


def _twin(out: Figs) -> None:
    """examples/transformer_lm_torch.py: the JAX example against its torch twin."""
    d, src = result("transformer_lm_torch")["data"], "results/transformer_lm_torch.json"
    out["twin.steps"] = Fig(str(d["steps"]), src)
    out["twin.torch"] = Fig(d["torch"].split("+")[0], src)
    for mode, short in (("float32", "f32"), ("float16+scaling", "f16")):
        m = d["modes"][mode]
        out[f"twin.{short}.max_diff"] = Fig(f"{m['max_diff']:.1e}", src)
        out[f"twin.{short}.tolerance"] = Fig(f"{m['tolerance']:g}", src)
    m = d["modes"]["float16+scaling"]
    changes = ", ".join(f"to {_power_text(v)} at step {s}" for s, v in m["scale_changes"])
    out["twin.scales"] = Fig(
        ("the same at every step" if m["scales_equal"] else "different")
        + f" ({_power_text(m['first_scale'])}"
        + (f", changing {changes})" if changes else ", never changing)"),
        src,
    )


def _overflow(out: Figs) -> None:
    d, src = result("overflow_first")["data"], "results/overflow_first.json"
    c = d["excess_precision_check"]
    out["overflow.excess.compared"] = Fig(str(c["values_compared"]), src)
    out["overflow.excess.changed"] = Fig(str(len(c["changed"])), src)


def _search(out: Figs) -> None:
    d, src = result("amax_search")["data"]["summary"], "results/amax_search.json"
    kept = d["models"] - d["twin_diverged"]
    for key, value in [("models", d["models"]), ("structures", d["structures"]),
                       ("steps", d["steps"]), ("kept", kept), ("diverged", d["twin_diverged"]),
                       ("amax_more", d["amax_more"]), ("fewer", d["amax_fewer"]),
                       ("equal", d["equal"]), ("skips.amax", d["skips_amax"]),
                       ("skips.dynamic", d["skips_dynamic"]),
                       ("diverged_more", d["amax_more_where_twin_diverged"])]:  # fmt: skip
        out[f"search.{key}"] = Fig(f"{value:,}", src)


# ---- the amax studies ------------------------------------------------------------

# figure prefix -> the study's results file: the transformer example (float32
# parameters, float16 matrix products).
STUDIES = {"amax": "amax_study"}


def _study(prefix: str) -> dict[str, Any]:
    return result(STUDIES[prefix])["data"]


def _runs(d: dict[str, Any], variant: str, kind: str) -> list[dict[str, Any]]:
    runs = (r for r in d["runs"] if r["variant"] == variant and r["kind"] == kind)
    return sorted(runs, key=lambda r: r["seed"])


def _skips(d: dict[str, Any], variant: str, kind: str) -> str:
    return ", ".join(str(r["skipped"]) for r in _runs(d, variant, kind))


def _gap(d: dict[str, Any], variant: str, kind: str) -> float:
    ref = {r["seed"]: r["eval_loss"] for r in _runs(d, variant, "float32")}
    gaps = [r["eval_loss"] - ref[r["seed"]] for r in _runs(d, variant, kind) if r["seed"] in ref]
    return statistics.mean(gaps) if gaps else math.nan


def _variants(d: dict[str, Any]) -> list[str]:
    return sorted({r["variant"] for r in d["runs"]} - {"default"})


def _study_figures(out: Figs, prefix: str) -> None:
    d, src = _study(prefix), f"results/{STUDIES[prefix]}.json"
    ev32 = [r["eval_loss"] for r in _runs(d, "default", "float32")]
    out[f"{prefix}.default.seeds"] = Fig(str(len(ev32)), src)
    out[f"{prefix}.default.spread"] = Fig(f"{max(ev32) - min(ev32):.4f}", src)
    for kind in d["settings"]["kinds"]:
        for v in ["default", *_variants(d)]:
            if _runs(d, v, kind):
                out[f"{prefix}.{v}.{kind}.skipped"] = Fig(_skips(d, v, kind), src)
        out[f"{prefix}.default.{kind}.gap"] = Fig(f"{_gap(d, 'default', kind):+.4f}", src)
        first = [r["first_underflow"] for r in _runs(d, "default", kind)]
        if first := [x for x in first if not math.isnan(x)]:
            out[f"{prefix}.default.{kind}.first_underflow"] = Fig(f"{max(first):.2%}", src)
    grown = [r for r in d["runs"] if not math.isnan(r["growth_log2"])]
    g = max(grown, key=lambda r: r["growth_log2"])
    out[f"{prefix}.growth.max"] = Fig(f"{g['growth_log2']:.2f}", src)
    out[f"{prefix}.growth.where"] = Fig(f"{g['variant']}, seed {g['seed']}, {g['kind']}", src)
    if shares := [
        r for r in d["runs"] if not math.isnan(r.get("float32_only_sets_amax", math.nan))
    ]:
        lo, hi = (f(r["float32_only_sets_amax"] for r in shares) for f in (min, max))
        out[f"{prefix}.float32_only.share"] = Fig(f"{lo:.0%}-{hi:.0%}", src)
        out[f"{prefix}.float32_only.gap"] = Fig(f"{max(r['float32_only_gap_log2'] for r in shares):.2f}", src)  # fmt: skip


def _default(f: Figs, prefix: str) -> str:
    d = _study(prefix)
    rows = [[k, _skips(d, "default", k),
             ", ".join(format(r["eval_loss"], ".4f") for r in _runs(d, "default", k)),
             f"{_gap(d, 'default', k):+.4f}"] for k in d["settings"]["kinds"]]  # fmt: skip
    head = ["scaler", "skipped steps per seed", "eval loss per seed", "mean gap to float32"]
    return _md(rows, head) + f"\nfloat32's own spread over the seeds: {f[f'{prefix}.default.spread'].text}.\n"  # fmt: skip


def _source(f: Figs, prefix: str) -> str:
    return f"- {f['source.' + STUDIES[prefix]].text}\n"


def _stress(f: Figs, prefix: str) -> str:
    d = _study(prefix)
    kinds = [k for k in d["settings"]["kinds"] if k != "float32"]
    rows = [[v, str(_runs(d, v, kinds[0])[0]["steps"])]
            + [_skips(d, v, k) + (f" ({_gap(d, v, k):+.4f})" if _runs(d, v, k) else "") for k in kinds]
            for v in _variants(d)]  # fmt: skip
    seeds = ", ".join(map(str, d["settings"]["stress_seeds"]))
    text = _md(rows, ["variant", "steps", *kinds])
    text += f"\nSkipped steps per seed ({seeds}), and the mean eval-loss gap to float32.\n"
    if "torch" in kinds and "dynamic" in kinds:
        every = ["default", *_variants(d)]
        same = [v for v in every if _skips(d, v, "torch") == _skips(d, v, "dynamic")]
        differ = [f"`{v}`" for v in every if v not in same]
        text += (f"\n`torch` skipped as many steps as `dynamic` in every seed of: "
                 f"{', '.join(f'`{v}`' for v in same) or 'none'}; not in: "
                 f"{', '.join(differ) or 'none'}.\n")  # fmt: skip
    return text


def _per_run(prefix: str, skip: tuple[str, ...], cell: Callable[[dict[str, Any]], str]) -> str:
    d = _study(prefix)
    cols = [k for k in d["settings"]["kinds"] if k not in skip]
    keys = sorted({(r["variant"], r["seed"]) for r in d["runs"]}, key=lambda vs: (vs[0] != "default", vs))  # fmt: skip
    by = {(r["variant"], r["seed"], r["kind"]): r for r in d["runs"]}
    rows = [[f"{v}, seed {s}", *(cell(by[(v, s, k)]) if (v, s, k) in by else "" for k in cols)]
            for v, s in keys]  # fmt: skip
    return _md(rows, ["run", *cols])


def _past_line(f: Figs, prefix: str) -> str:
    # The all-float16 model has no float32-only leaf: every leaf counts.
    w = "all_leaves" if _study(prefix)["settings"].get("grads") == "float16" else "float16_path"
    return _per_run(prefix, ("float32",), lambda r: f"{r['past_65504_' + w]} ({r['largest_' + w]:.2f})")  # fmt: skip


_STUDY_BLOCKS: dict[str, Callable[[Figs, str], str]] = {
    "source": _source,
    "default": _default,
    "stress": _stress,
    "first-step": lambda f, p: _per_run(p, ("float32",), lambda r: f"{r['first_underflow']:.1e}"),
    "underflow": lambda f, p: _per_run(
        p,
        ("float32", "torch"),
        lambda r: f"{r['scale_underflow']:.0e} ({r['first_scale_underflow']:.0e})",
    ),
    "past-line": _past_line,
    "growth": lambda f, p: _per_run(p, (), lambda r: f"{r['growth_log2']:.2f}"),
    "scales": lambda f, p: _per_run(p, ("float32",), lambda r: f"{r['mean_log2_scale']:.2f}"),
    "leaf-groups": lambda f, p: _per_run(
        p, (), lambda r: f"{r['float32_only_sets_amax']:.0%} ({r['float32_only_gap_log2']:.2f})"
    ),
}
_SHOWN = {"amax": list(_STUDY_BLOCKS)}


# ---- the other blocks ----------------------------------------------------------------


def demo_summary(f: Figs) -> str:
    t = {k: v.text for k, v in f.items()}
    rows = [("final scale", t["demo.final_scale"]), ("last loss (batch)", t["demo.last_batch_loss"]),
            ("loss (all data)", f"{t['demo.eval_loss']} (float32: {t['demo.baseline_eval_loss']}, {t['demo.gap']})")]  # fmt: skip
    body = "\n".join(f"| {k:<17} | {v:<40} |" for k, v in rows)
    return f"```text\n{body}\n```\n\nfrom {t['source.demo']}.\n"


def transformer_table(f: Figs) -> str:
    modes = result("transformer_lm")["data"]["modes"]
    marks = list(next(iter(modes.values()))["smoothed_loss"])
    rows = [[mode, *(f"{m['smoothed_loss'][k]:.4f}" for k in marks),
             f[f"lm.{mode}.eval_loss"].text, f[f"lm.{mode}.zeros"].text] for mode, m in modes.items()]  # fmt: skip
    head = ["mode", *(f"step {m}" for m in marks), "eval loss", "zeros at init"]
    return _md(rows, head) + f"\nFrom {f['source.transformer_lm'].text}.\n"


def transformer_summary(f: Figs) -> str:
    t = {k: v.text for k, v in f.items()}
    return (
        f"float16 with loss scaling tracks float32 (evaluation loss {t['lm.float16+scaling.gap']}); "
        f"float16 without scaling falls behind ({t['lm.float16.gap']}): at initialisation "
        f"{t['lm.float16.zeros']} of its gradient entries are exactly zero against "
        f"{t['lm.float32.zeros']} in float32 (the embedding rows of bytes absent from the batch).  "
        "With the plain mean (`--global-batch-tokens 2048`, gradients 128 times larger) this "
        "small model does not need scaling: evaluation loss float32 "
        f"{t['lm_mean.float32.eval_loss']}, float16 without scaling {t['lm_mean.float16.eval_loss']} "
        f"({t['source.transformer_lm_mean']}).\n"
    )


def torch_twin(f: Figs) -> str:
    t = {k: v.text for k, v in f.items()}
    return (
        f'Against torch {t["twin.torch"]} (`GradScaler("cpu")`, `autocast("cpu", float16)`), '
        f"{t['twin.steps']} steps: float32 losses agree within {t['twin.f32.max_diff']} at every "
        f"step (tolerance {t['twin.f32.tolerance']}), float16 within {t['twin.f16.max_diff']} "
        f"(tolerance {t['twin.f16.tolerance']}), and the scale is {t['twin.scales']}.  From "
        f"{t['source.transformer_lm_torch']}.\n"
    )


def readme_commands(f: Figs) -> str:
    t = {k: v.text for k, v in f.items()}
    return (
        "Both commands, timed in a fresh clone and venv: the demo's install "
        f"{t['readme.demo.install']} and the demo {t['readme.demo.run']}; the tests' install "
        f"{t['readme.tests.install']} and the tests {t['readme.tests.run']} "
        f"({t['readme.tests.passed']} passed, {t['readme.tests.skipped']} skipped), jax "
        f"{t['readme.tests.jax']}; from {t['source.readme_commands']}.  The install compiles "
        "the native handlers.  `python tools/figures.py record readme_commands` times them again.\n"
    )


BLOCKS: dict[str, Callable[[Figs], str]] = {
    "readme-commands": readme_commands,
    "torch-twin": torch_twin,
    "transformer-table": transformer_table,
    "transformer-summary": transformer_summary,
    "demo-summary": demo_summary,
}
for _prefix, _parts in _SHOWN.items():
    for _part in _parts:
        BLOCKS[f"{_prefix}-{_part}"] = functools.partial(
            lambda f, part, prefix: _STUDY_BLOCKS[part](f, prefix), part=_part, prefix=_prefix
        )


def figures(out: Figs) -> None:
    groups = [_demo, _transformer, _twin, _overflow, _readme, _search]
    groups += [functools.partial(_study_figures, prefix=p) for p in STUDIES]
    for group in groups:
        try:
            group(out)
        except FileNotFoundError:
            continue  # not recorded yet: a block or role that needs it fails by name
    for name, p in entries().items():
        if not name.startswith("bench:"):
            out[f"source.{name}"] = Fig(provenance_line(name, p, f"results/{name}.json"), name)
