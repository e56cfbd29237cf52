"""Which float16 tensor of the backward pass overflows first as the loss scale grows (issue 45).

    python examples/overflow_first.py [--train-steps 0,300] [--max-log2 30]
        [--cost-reps 40] [--check] [--out results/overflow_first.json]

On fixed weights (initialisation, and after ``--train-steps`` float32 adam
steps of ``transformer_lm.py``'s own training), for two models built from
``transformer_lm.py`` (imported, not copied):

- ``transformer``: the example as it trains (float32 parameters, matrix
  products in float16 through casts, LayerNorm, softmax and loss float32):
  ``jax.grad`` returns float32 gradients, and what can overflow is inside
  the backward pass;
- ``all-float16``: the same model with its parameters cast to float16 before
  ``jax.grad`` (O3): every gradient leaf is float16, the residual stream too;

it raises the loss scale 2**0, 2**1, ..., 2**max_log2 on one batch and
records, at each scale, the largest |value| of every tensor of the backward
pass that it can see:

- at each of the model's taps (``transformer_lm.Tap``: every cast between
  float32 and the compute dtype, and a few identities), the cotangent there:
  ``attn_in``, ``attn``, ``mlp_in``, ``gelu`` and ``head_in`` hold the input
  gradients of the float16 matrix products (qkv, proj, fc, out, head), ``qkv``
  those of q, k and v (the attention products' outputs), ``probs`` the
  product ``dp = da v^T``, ``fc`` the GELU's input gradient; ``scores``,
  ``attn_out``, ``mlp_out`` and ``logits`` the float32 cotangents that the
  backward pass narrows to float16 there (a value above 65504 becomes inf
  in the cast); ``embed`` and ``block<i>`` the residual stream's;
- every parameter gradient: the kernels' and biases' (``matmul``: the
  float16 weight-gradient products and bias-gradient sums, widened to
  float32 in the transformer) apart from the LayerNorm, embedding and
  position gradients (``other``: float32 only in the transformer);
- the same float16 gradients once more, at the parameters' casts: each
  parameter whose gradient runs in float16 (the matmul ones in the
  transformer, all in all-float16) is cast by a watch before the model sees
  it, as a `Policy` cast would be (the example's bits do not change).

Each tap is `jax_amp_scale.watch_amax` (the amax of the finite entries,
returned as the gradient of a float32 probe) and a second probe that keeps
the non-finite entries (inf; NaN counted as inf), so that the sweep sees
the first scale at which each float16 tensor passes 65504 or turns inf.
Per model it reports the first tensor to overflow, its amax against the
others' (log2), and the scale ``amax_scaler``'s rule (the largest power of
two keeping ``amax * 2**k <= 65504 / 2**margin``) sets from (a) all
parameter gradients (today's statistic), (b) the float16 ones, (c) the
watched float16 activation cotangents, (d) all the float16 watches
(activations and parameter casts), measured at the last scale before the
first overflow and, for (d), at scale 1 (a first step at 1), against the
first overflow.  It checks that XLA:CPU's float16 is what it says: the sweep's
first overflow and the scale below it again in a child process with
``XLA_FLAGS=--xla_allow_excess_precision=false``, and four small cases
(an elementwise chain, a dot, a sum, partial sums past 65504).  It times a
jitted ``jax.grad`` of the transformer with and without the watches
(``--cost-reps`` interleaved runs; median, percentiles, paired ratio).

Writes ``--out`` (JSON: every amax, the analysis, jax/jaxlib versions, the
machine, the command, the date) and the tables beside it (``.md``).
``--check`` exits 1 unless, in every run, the watches at the float16 casts
equal the float16 gradients, (d) sets a scale below the first overflow and
the same one from scale 1, and the excess-precision rerun changed nothing.

What it found is in results/overflow_first.md, which the run that
``python tools/figures.py record overflow_first`` makes writes beside
results/overflow_first.json: which tensor overflows first, at which scale,
and how far below it the activation cotangents and the float32-only
gradients stay.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import transformer_lm as lm
from stdlib_corpus import load_corpus

import jax_amp_scale as jas

F16_MAX = 65504.0
MATMUL = ("qkv", "proj", "fc", "out", "head")  # the Linear layers' names
MODELS = ("transformer", "all-float16")


# ------------------------------------------------------------ the recording


@jax.custom_vjp
def amax_all(x: jax.Array, probe: jax.Array) -> jax.Array:
    """Identity; the probe's gradient is max |cotangent| with inf and NaN as inf."""
    return x


def _amax_all_fwd(x: jax.Array, probe: jax.Array) -> tuple[jax.Array, None]:
    return x, None


def _amax_all_bwd(_: None, ct: jax.Array) -> tuple[jax.Array, jax.Array]:
    a = jnp.where(jnp.isnan(ct), jnp.inf, jnp.abs(ct))
    return ct, jnp.max(a, initial=0).astype(jnp.float32)


amax_all.defvjp(_amax_all_fwd, _amax_all_bwd)


def tap_names(graphdef: Any, params: Any, win: np.ndarray) -> dict[str, tuple[str, str]]:
    """``{name: (dtype in, dtype out)}`` of the model's taps, in forward order."""
    names: dict[str, tuple[str, str]] = {}

    def record(name: str, x: jax.Array, dtype: Any) -> jax.Array:
        names[name] = (x.dtype.name, jnp.dtype(dtype).name)
        return x.astype(dtype)

    jax.eval_shape(lambda p: lm.token_losses(nnx.merge(graphdef, p), win, record), params)
    return names


def probed_tap(names: list[str], finite: jax.Array, every: jax.Array | None) -> lm.Tap:
    """A tap that watches each named point (and, with `every`, keeps inf too)."""
    index = {n: i for i, n in enumerate(names)}

    def tap(name: str, x: jax.Array, dtype: Any) -> jax.Array:
        i = index[name]
        y = jas.watch_amax(x, finite[i], dtype=dtype)
        return y if every is None else amax_all(y, every[i])

    return tap


def model_and_params(cfg: lm.Config, model: str, params32: Any) -> tuple[Any, Any]:
    """The graphdef with float16 compute and the parameters it is differentiated at."""
    m = lm.make_model(cfg, jnp.float16)
    if model == "all-float16":
        # nnx.Embed fixed its output dtype (float32) when it was built: float16
        # here, so that the residual stream is float16 too.
        m.embed.dtype = jnp.float16
        params32 = jax.tree.map(lambda a: a.astype(jnp.float16), params32)
    graphdef, _ = nnx.split(m, nnx.Param)
    return graphdef, params32


def leaf_name(path: tuple) -> str:
    """``blocks.0.qkv.kernel`` for a parameter's key path."""
    keys = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
    return ".".join(k for k in keys if k != "value")


def leaf_group(name: str) -> str:
    return "matmul" if set(name.split(".")) & set(MATMUL) else "other"


class Watched(NamedTuple):
    """The objective with its watches, and what they are."""

    taps: dict[str, tuple[str, str]]  # tap name: (dtype in, dtype out), forward order
    leaves: list[str]  # parameter names, tree order
    float16: list[bool]  # per leaf: its gradient is a float16 tensor
    objective: Any  # (params, finite probes, every probes | None, scale) -> loss


def watched_objective(
    cfg: lm.Config, model: str, graphdef: Any, params: Any, win: np.ndarray, casts: bool = True
) -> Watched:
    """The scaled loss with a watch at every tap and (`casts`) at every float16
    parameter cast: the parameters whose gradient runs in float16 (the matmul
    ones in the transformer, all in all-float16) are cast by a watch before the
    model sees them, as a Policy's cast would, so the watch sees their float16
    gradient (the weight-gradient product, the bias-gradient sum)."""
    taps = tap_names(graphdef, params, win)
    names = list(taps)
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    leaves = [leaf_name(p) for p, _ in flat]
    f16 = [model == "all-float16" or leaf_group(n) == "matmul" for n in leaves]
    factor = np.float32(cfg.batch * cfg.context / cfg.global_batch_tokens)

    def objective(p: Any, finite: jax.Array, every: Any, scale: jax.Array) -> jax.Array:
        if casts:
            j = iter(range(len(names), len(names) + sum(f16)))
            ps = [
                jas.watch_amax(x, finite[next(j)], dtype=jnp.float16) if h else x
                for x, h in zip(jax.tree.leaves(p), f16, strict=True)
            ]
            p = treedef.unflatten(ps)
        tap = probed_tap(names, finite, every)
        return jnp.mean(lm.token_losses(nnx.merge(graphdef, p), win, tap)) * factor * scale

    return Watched(taps, leaves, f16, objective)


def sweep(cfg: lm.Config, model: str, params32: Any, win: np.ndarray, scales: list[int]) -> dict:
    """The amax of every tap, float16 parameter cast and parameter gradient at
    each scale 2**k, k in `scales`."""
    graphdef, params = model_and_params(cfg, model, params32)
    w = watched_objective(cfg, model, graphdef, params, win)
    grad = jax.jit(jax.grad(w.objective, argnums=(0, 1, 2)))
    n_casts = sum(w.float16)
    tensors: dict[str, dict] = {}
    for n, (dt_in, dt_out) in w.taps.items():
        f16 = "float16" in (dt_in, dt_out)
        tensors[n] = dict(kind="cotangent", dtype=f"{dt_out} -> {dt_in}", float16=f16)
    for n, f16, leaf in zip(w.leaves, w.float16, jax.tree.leaves(params), strict=True):
        dtype = "float16 -> float32" if f16 and leaf.dtype != jnp.float16 else leaf.dtype.name
        tensors[n] = dict(kind="gradient", group=leaf_group(n), dtype=dtype, float16=f16)
    for n in (n for n, f16 in zip(w.leaves, w.float16, strict=True) if f16):
        tensors[f"cast:{n}"] = dict(kind="parameter cast", dtype="float16", float16=True)
    for t in tensors.values():
        t["amax"], t["amax_finite"] = [], []
    finite0 = jas.watch_probes(len(w.taps) + n_casts)
    every0 = jas.watch_probes(len(w.taps))
    casts = [f"cast:{n}" for n, f16 in zip(w.leaves, w.float16, strict=True) if f16]
    zeros = []  # per scale: the fraction of float16 gradient entries that are exactly 0
    for k in scales:
        g, finite, every = jax.device_get(grad(params, finite0, every0, jnp.float32(2.0**k)))
        for i, n in enumerate(w.taps):
            tensors[n]["amax"].append(float(every[i]))
            tensors[n]["amax_finite"].append(float(finite[i]))
        f16_leaves = [x for x, h in zip(jax.tree.leaves(g), w.float16, strict=True) if h]
        zeros.append(sum(int(np.sum(x == 0)) for x in f16_leaves) / sum(x.size for x in f16_leaves))
        for n, leaf in zip(w.leaves, jax.tree.leaves(g), strict=True):
            a = np.abs(np.asarray(leaf, np.float32))
            tensors[n]["amax"].append(float(np.max(np.where(np.isnan(a), np.inf, a))))
            tensors[n]["amax_finite"].append(float(np.max(a[np.isfinite(a)], initial=0.0)))
        for i, n in enumerate(casts, start=len(w.taps)):
            tensors[n]["amax"].append(None)  # the watch keeps finite entries only
            tensors[n]["amax_finite"].append(float(finite[i]))
    # The watch at each cast saw its parameter's float16 gradient: the same numbers.
    same = all(tensors[c]["amax_finite"] == tensors[c[5:]]["amax_finite"] for c in casts)
    return dict(
        model=model,
        scales_log2=list(scales),
        casts_equal_gradients=same,
        float16_gradient_zeros=zeros,
        tensors=tensors,
    )


# ------------------------------------------------------------- the analysis


def rule_log2(amax: float, at_log2: int, margin: int) -> int:
    """log2 of the scale amax_scaler's rule sets from `amax` measured at 2**at_log2:
    the largest k with amax * 2**k <= 65504 / 2**margin, plus at_log2 (exact)."""
    m_t, e_t = math.frexp(F16_MAX / 2.0**margin)
    m_a, e_a = math.frexp(float(np.float32(amax)))
    return at_log2 + e_t - e_a - int(m_a > m_t)


STATISTICS = {
    "(a) all gradients": lambda t: t["kind"] == "gradient",
    "(b) float16 gradients": lambda t: t["kind"] == "gradient" and t["float16"],
    "(c) watched activations": lambda t: t["kind"] == "cotangent" and t["float16"],
    "(d) all watches": lambda t: t["kind"] in ("cotangent", "parameter cast") and t["float16"],
}


def analyse(run: dict, margin: int) -> dict:
    """First overflow, who, the log2 gaps, and the scale each statistic would set."""
    ks, tensors = run["scales_log2"], run["tensors"]
    for t in tensors.values():
        over = [k for k, a in zip(ks, t["amax"], strict=True) if a is not None and a > F16_MAX]
        t["first_overflow_log2"] = over[0] if over else None
    # The float16 tensors (a parameter cast's watch repeats its gradient: left out).
    f16 = {n: t for n, t in tensors.items() if t["float16"] and t["kind"] != "parameter cast"}
    firsts = [t["first_overflow_log2"] for t in f16.values()]
    first = min((k for k in firsts if k is not None), default=None)
    if first is None or first == ks[0] or first - 1 not in ks:
        return dict(first_overflow_log2=first)
    ref = ks.index(first - 1)  # the last scale at which no float16 tensor overflowed

    def amax(select: Any, i: int = ref) -> float:
        return max(t["amax_finite"][i] for t in tensors.values() if select(t))

    who = sorted(
        (n for n, t in f16.items() if t["first_overflow_log2"] == first),
        key=lambda n: -f16[n]["amax"][ref],
    )
    grads = [t for t in tensors.values() if t["kind"] == "gradient"]
    bad = [k for i, k in enumerate(ks) if any(not math.isfinite(t["amax"][i]) for t in grads)]
    a_first = tensors[who[0]]["amax"][ref]
    chosen = {s: rule_log2(amax(sel), first - 1, margin) for s, sel in STATISTICS.items()}
    if 0 in ks:  # what a first step at scale 1 would set from all the watches
        chosen["(d) measured at 2**0"] = rule_log2(
            amax(STATISTICS["(d) all watches"], ks.index(0)), 0, margin
        )
    gap = {s: math.log2(a_first / amax(sel)) for s, sel in STATISTICS.items()}
    return dict(
        first_overflow_log2=first,
        first=who,
        reference_log2=first - 1,
        first_amax_at_reference=a_first,
        gradients_nonfinite_from_log2=bad[0] if bad else None,
        log2_first_over=gap,
        rule_log2=chosen,
        highest_safe_log2=first - 1,
    )


# ----------------------------------------------------------- the watch cost


def watch_cost(cfg: lm.Config, params32: Any, win: np.ndarray, reps: int) -> dict:
    """ms per jitted jax.grad of the transformer: no watch, a watch at every
    tap, and also at every float16 parameter cast (interleaved runs)."""
    graphdef, params = model_and_params(cfg, "transformer", params32)
    factor = np.float32(2.0**10)  # a scale: the values do not matter here

    def plain(p: Any) -> jax.Array:
        return jnp.mean(lm.token_losses(nnx.merge(graphdef, p), win)) * factor

    fns: dict[str, tuple[Any, tuple]] = {"no watch": (jax.jit(jax.grad(plain)), (params,))}
    for casts in (False, True):
        w = watched_objective(cfg, "transformer", graphdef, params, win, casts=casts)
        n = len(w.taps) + (sum(w.float16) if casts else 0)
        probes = jas.watch_probes(n)
        grad = jax.jit(jax.grad(w.objective, argnums=(0, 1)))
        what = "taps and float16 casts" if casts else "taps"
        fns[f"{n} watches ({what})"] = (grad, (params, probes, None, jnp.float32(factor)))
    out: dict[str, Any] = {"reps": reps}
    for n, (f, args) in fns.items():  # compile, warm up, and XLA's own count
        cost = f.lower(*args).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost  # jax < 0.7: one per device
        out[n] = {k: float(cost.get(k, math.nan)) for k in ("flops", "bytes accessed")}
        for _ in range(3):
            jax.block_until_ready(f(*args))
    times: dict[str, list[float]] = {n: [] for n in fns}
    names = list(fns)
    for r in range(reps):
        for n in names[r % len(names) :] + names[: r % len(names)]:  # interleaved, rotated
            f, args = fns[n]
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            times[n].append(1e3 * (time.perf_counter() - t0))
    for n, t in times.items():
        if not t:
            continue
        q = np.percentile(t, [0, 10, 25, 50, 75, 90])
        ratios = sorted(a / b for a, b in zip(t, times["no watch"], strict=True))
        out[n].update(
            min_ms=float(q[0]),
            p10_ms=float(q[1]),
            p25_ms=float(q[2]),
            median_ms=float(q[3]),
            p75_ms=float(q[4]),
            p90_ms=float(q[5]),
            paired_ratio_median=statistics.median(ratios),
            paired_ratio_p25_p75=[float(x) for x in np.percentile(ratios, [25, 75])],
        )
    return out


# -------------------------------------------------------- excess precision


def recheck_without_excess_precision(
    args: argparse.Namespace, scales: list[int], runs: list[dict]
) -> dict:
    """The same sweep at `scales` in a child process with
    XLA_FLAGS=--xla_allow_excess_precision=false; the numbers that changed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--train-steps",
            str(runs[0]["train_steps"]),
            "--models",
            ",".join(r["model"] for r in runs),
            "--scales",
            ",".join(map(str, scales)),
            "--cost-reps",
            "0",
            "--no-recheck",
            "--raw",
            "--out",
            str(out),
        ]
        env = {
            **os.environ,
            "XLA_FLAGS": (
                os.environ.get("XLA_FLAGS", "") + " --xla_allow_excess_precision=false"
            ).strip(),
        }
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        child_report = json.loads(out.read_text())
        child = child_report["runs"]
    changed, compared = [], 0
    for mine, theirs in zip(runs, child, strict=True):
        for n, t in theirs["tensors"].items():
            for j, k in enumerate(theirs["scales_log2"]):
                i = mine["scales_log2"].index(k)
                for field in ("amax", "amax_finite"):
                    a, b = jsonable(mine["tensors"][n][field][i]), t[field][j]
                    compared += a is not None
                    if a != b:
                        changed.append(
                            dict(
                                model=mine["model"],
                                weights=mine["weights"],
                                tensor=n,
                                scale_log2=k,
                                field=field,
                                default=a,
                                no_excess_precision=b,
                            )
                        )
    return dict(
        xla_flags="--xla_allow_excess_precision=false",
        scales_log2=scales,
        values_compared=compared,
        changed=changed,
        float16_semantics=child_report["float16_semantics"],
    )


def float16_semantics() -> dict[str, str]:
    """What XLA here does with float16 intermediates (jitted): each case is
    inf where every float16 result is rounded to float16."""
    h = jnp.float16
    cases = {
        "(300*300)*0.5, elementwise": (lambda x: (x * x) * h(0.5), jnp.full((4,), 300, h)),
        "(40-row dot 40, 64 terms)*0.5": (
            lambda a: (a @ a.T) * h(0.5),
            jnp.full((4, 64), 40, h),
        ),
        "sum(2048 x 40)*0.5": (lambda a: jnp.sum(a) * h(0.5), jnp.full((2048,), 40, h)),
        "sum(60000, 60000, -60000, -30000): partial sums past 65504": (
            jnp.sum,
            jnp.array([60000, 60000, -60000, -30000], h),
        ),
    }
    return {k: str(np.asarray(jax.jit(f)(x)).reshape(-1)[0]) for k, (f, x) in cases.items()}


# ---------------------------------------------------------------- reporting


def dumps(report: dict) -> str:
    """Indented JSON with each list of numbers on one line, floats to 9 digits
    (float32's round trip); a watched amax only where it is not the amax."""
    report = json.loads(json.dumps(jsonable(report)))  # a copy
    for r in report["runs"]:
        for t in r["tensors"].values():
            if t["kind"] == "parameter cast":
                del t["amax"]
                continue
            finite = t.pop("amax_finite")
            t["amax_finite_where_not_amax"] = {
                str(k): b
                for k, a, b in zip(r["scales_log2"], t["amax"], finite, strict=True)
                if a != b
            }
    flat = re.compile(r"\[[^\[\]{}]*\]")
    text = json.dumps(report, indent=1)
    text = flat.sub(lambda m: re.sub(r"\s+", " ", m.group(0)), text)
    return re.sub(r"-?\d+\.\d{10,}(e-?\d+)?", lambda m: f"{float(m.group(0)):.9g}", text) + "\n"


def jsonable(x: Any) -> Any:
    """`x` with inf and NaN written as the strings "inf", "-inf", "nan" (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    return x


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cores (os.cpu_count)": os.cpu_count(),
        "load average at start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "jax devices": [str(d) for d in jax.devices()],
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
    }


def overflow_tables(runs: list[dict]) -> list[str]:
    """Who overflows first, and the scale each statistic sets."""
    names = list(STATISTICS)
    lines = [
        "| model | weights | first overflow | first tensor(s) | amax at the scale before | "
        + " | ".join(f"log2(first / {n[4:]})" for n in names)
        + " | gradients non-finite from |",
        "| --- | --- | --- | --- | --- |" + " --- |" * len(names) + " --- |",
    ]
    for r in runs:
        a = r["analysis"]
        if a.get("first") is None:
            lines.append(f"| {r['model']} | {r['weights']} | none in 2**{r['scales_log2']} |")
            continue
        nf = a["gradients_nonfinite_from_log2"]
        gaps = " | ".join(f"{a['log2_first_over'][n]:+.2f}" for n in names)
        lines.append(
            f"| {r['model']} | {r['weights']} | `2**{a['first_overflow_log2']}` "
            f"| {', '.join(a['first'])} | {a['first_amax_at_reference']:.0f} | {gaps} "
            f"| {'never' if nf is None else f'`2**{nf}`'} |"
        )
    done = [r for r in runs if "rule_log2" in r["analysis"]]
    if not done:
        return lines
    stats = list(done[0]["analysis"]["rule_log2"])
    lines += [
        "",
        "The scale the amax rule sets (log2; in brackets, doublings below the first overflow):",
        "",
        "| model | weights | first overflow | " + " | ".join(stats) + " |",
        "| --- | --- | --- |" + " --- |" * len(stats),
    ]
    for r in done:
        a = r["analysis"]
        cells = [f"{k} ({a['first_overflow_log2'] - k})" for k in a["rule_log2"].values()]
        lines.append(
            f"| {r['model']} | {r['weights']} | {a['first_overflow_log2']} | "
            + " | ".join(cells)
            + " |"
        )
    lines += ["", "Exact zeros among the float16 gradients' entries, at scale 1 and at (d)'s:", ""]
    for r in done:
        if r["scales_log2"][0] != 0:
            continue
        k = r["analysis"]["rule_log2"]["(d) all watches"]
        zk = r["float16_gradient_zeros"][r["scales_log2"].index(k)]
        z0 = r["float16_gradient_zeros"][0]
        lines.append(
            f"- {r['model']}, {r['weights']}: {100 * z0:.1f}% at 2**0, {100 * zk:.1f}% at 2**{k}"
        )
    return lines


def tensor_table(runs: list[dict]) -> list[str]:
    """Each float16 tensor's first overflow and amax per unit of scale, per run."""
    runs = [r for r in runs if "reference_log2" in r["analysis"]]
    if not runs:
        return []
    lines = [
        "Each float16 tensor: its first overflow (log2 scale; None: not up to the last scale; "
        "f32: a float32 tensor in that model) and, in brackets, log2 of its amax per unit of "
        "scale (at the scale before the run's first overflow):",
        "",
        "| tensor | dtype (backward) | "
        + " | ".join(f"{r['model']}, {r['weights']}" for r in runs)
        + " |",
        "| --- | --- |" + " --- |" * len(runs),
    ]

    def unit(r: dict, n: str) -> float:
        ref = r["scales_log2"].index(r["analysis"]["reference_log2"])
        return r["tensors"][n]["amax_finite"][ref] / 2.0 ** r["scales_log2"][ref]

    names = [
        n
        for n, t in runs[0]["tensors"].items()
        if t["kind"] != "parameter cast" and any(r["tensors"][n]["float16"] for r in runs)
    ]
    for n in sorted(names, key=lambda n: -unit(runs[0], n)):
        dtypes = " / ".join(sorted({r["tensors"][n]["dtype"] for r in runs}))
        cells = [
            f"{r['tensors'][n]['first_overflow_log2'] if r['tensors'][n]['float16'] else 'f32'}"
            f" ({math.log2(max(unit(r, n), 2.0**-149)):.2f})"
            for r in runs
        ]
        lines.append(f"| {n} | {dtypes} | " + " | ".join(cells) + " |")
    return lines


def cost_table(w: dict) -> list[str]:
    lines = [
        f"Cost: a jitted jax.grad of the transformer (float32 parameters, float16 matrix "
        f"products), {w['reps']} interleaved runs each; XLA's cost analysis of the "
        "compiled program:",
        "",
        "| backward | XLA flops | XLA bytes accessed | min ms | median ms | p10-p90 ms "
        "| time / no watch, paired: median [p25, p75] |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n, v in w.items():
        if not isinstance(v, dict):
            continue
        row = f"| {n} | {v['flops']:.4g} | {v['bytes accessed']:.4g} |"
        if "median_ms" in v:
            lo, hi = v["paired_ratio_p25_p75"]
            row += (
                f" {v['min_ms']:.1f} | {v['median_ms']:.1f} | {v['p10_ms']:.1f}-{v['p90_ms']:.1f}"
                f" | {v['paired_ratio_median']:.3f} [{lo:.3f}, {hi:.3f}] |"
            )
        else:
            row += " | | | |"
        lines.append(row)
    return lines


def markdown(report: dict) -> str:
    lines = [f"`{report['command']}`, {report['date']}, jax {report['machine']['jax']}", ""]
    if report["runs"]:
        lines += [*overflow_tables(report["runs"]), "", *tensor_table(report["runs"])]
    c = report.get("excess_precision_check")
    if c:
        lines += [
            "",
            f"XLA_FLAGS={c['xla_flags']} at scales 2**{c['scales_log2']}: "
            f"{len(c['changed'])} of {c['values_compared']} values changed; XLA's float16 "
            f"here: {c['float16_semantics']}.",
        ]
    if report.get("watch_cost"):
        lines += ["", *cost_table(report["watch_cost"])]
    return "\n".join(lines) + "\n"


def check(report: dict) -> list[str]:
    """The claims --check holds the run to; the failed ones."""
    failed = []
    for r in report["runs"]:
        run, a = f"{r['model']}, {r['weights']}", r["analysis"]
        if not r["casts_equal_gradients"]:
            failed.append(f"{run}: a watch at a float16 cast differs from its gradient's amax")
        if "rule_log2" not in a:
            failed.append(f"{run}: no overflow in the scales swept, nothing to compare")
            continue
        if a["rule_log2"]["(d) all watches"] >= a["first_overflow_log2"]:
            failed.append(f"{run}: the watches' statistic sets a scale that overflows")
        if (
            a["rule_log2"].get("(d) measured at 2**0", a["rule_log2"]["(d) all watches"])
            != a["rule_log2"]["(d) all watches"]
        ):
            failed.append(f"{run}: a first step at scale 1 would set another scale")
    c = report.get("excess_precision_check")
    if c and c["changed"]:
        failed.append(f"--xla_allow_excess_precision=false changed {len(c['changed'])} values")
    return failed


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--train-steps",
        type=ints,
        default=[0, 300],
        help="fixed weights: after these float32 steps (0: init)",
    )
    p.add_argument("--max-log2", type=int, default=30, help="scales 2**0 .. 2**max_log2")
    p.add_argument(
        "--scales", type=ints, default=None, help="only these log2 scales (default 0..max-log2)"
    )
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--margin", type=int, default=5, help="amax_scaler's margin")
    p.add_argument(
        "--cost-reps", type=int, default=40, help="timed runs of each backward (0: none)"
    )
    p.add_argument("--no-recheck", action="store_true", help="skip the excess-precision rerun")
    p.add_argument("--raw", action="store_true", help="--out: plain JSON, every value")
    p.add_argument("--check", action="store_true", help="exit 1 unless the claims hold")
    p.add_argument(
        "--cost-only", action="store_true", help="only the watches' cost (--out gets it alone)"
    )
    p.add_argument("--out", type=Path, default=Path("results/overflow_first.json"))
    args = p.parse_args(argv)
    started = machine()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cfg = lm.Config()
    scales = args.scales if args.scales is not None else list(range(args.max_log2 + 1))
    data, held_out = load_corpus()
    runs = []
    for steps in [] if args.cost_only else args.train_steps:
        if steps:
            t0 = time.perf_counter()
            params32 = lm.train(cfg._replace(steps=steps), "float32", data, held_out).params
            print(f"trained {steps} float32 steps in {time.perf_counter() - t0:.0f} s", flush=True)
        else:
            _, params32 = nnx.split(lm.make_model(cfg, jnp.float32), nnx.Param)
        # The batch the next step would take (the example's data order).
        start = lm.batch_starts(len(data), cfg._replace(steps=steps + 1))[steps]
        win = lm.windows(data, start, cfg.context)
        for model in args.models.split(","):
            t0 = time.perf_counter()
            run = sweep(cfg, model, params32, win, scales)
            run["seconds"] = round(time.perf_counter() - t0, 1)
            run.update(
                weights="init" if not steps else f"after {steps} float32 steps",
                train_steps=steps,
                batch_index=steps,
            )
            run["analysis"] = analyse(run, args.margin)
            runs.append(run)
            a = run["analysis"]
            print(
                f"{model}, {run['weights']}: first overflow at 2**{a['first_overflow_log2']}: {a.get('first')}",
                flush=True,
            )
    report: dict[str, Any] = dict(
        issue=45,
        command=" ".join([Path(sys.executable).name, *sys.argv]),
        date=date,
        machine=started,
        config=cfg._asdict(),
        margin=args.margin,
        float16_max=F16_MAX,
        float16_semantics=float16_semantics(),
        runs=runs,
    )
    if not args.no_recheck and runs:
        # The first overflow's scale and the one below it, on the first weights.
        firsts = sorted(
            {
                k
                for r in runs
                if r["train_steps"] == args.train_steps[0]
                and r["analysis"]["first_overflow_log2"] is not None
                for k in (
                    r["analysis"]["first_overflow_log2"] - 1,
                    r["analysis"]["first_overflow_log2"],
                )
            }
        )
        report["excess_precision_check"] = recheck_without_excess_precision(
            args, firsts, [r for r in runs if r["train_steps"] == args.train_steps[0]]
        )
    if args.cost_reps:
        _, params32 = nnx.split(lm.make_model(cfg, jnp.float32), nnx.Param)
        win = lm.windows(data, lm.batch_starts(len(data), cfg)[0], cfg.context)
        report["watch_cost"] = watch_cost(cfg, params32, win, args.cost_reps)
    if c := report.get("excess_precision_check"):  # what the docs show (overflow_first.NAME)
        report["figures"] = {
            "excess.compared": str(c["values_compared"]),
            "excess.changed": str(len(c["changed"])),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(jsonable(report)) if args.raw else dumps(report))
    md = markdown(report)
    args.out.with_suffix(".md").write_text(md)
    print(md, end="")
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    if args.check:
        failed = check(report)
        for line in failed:
            print(f"CHECK FAILED: {line}")
        print("all checks passed" if not failed else f"{len(failed)} checks failed")
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
