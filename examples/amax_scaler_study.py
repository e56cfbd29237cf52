"""The amax scaler against dynamic_scaler and torch's GradScaler, on the transformer example.

    python examples/amax_scaler_study.py [--steps 150] [--seeds 0,1,2] [--out-dir examples/out]

Trains ``transformer_lm.py``'s byte-level transformer (its corpus, model,
batches and float32 evaluation) on the same batches from the same weights in
five ways:

- ``float32``: everything in float32 (JAX);
- ``dynamic``: float16 matrix products, ``loss_scaled`` with
  ``dynamic_scaler(2**15, growth_interval=50)`` (the example's settings);
- ``torch``: the torch twin (``transformer_lm_torch.py``) under CPU autocast
  float16 with ``torch.amp.GradScaler`` and the same settings;
- ``amax``: float16 matrix products, ``loss_scaled`` with ``amax_scaler()``
  (first step at the scale 1, its ceiling from torch's 2**16);
- ``amax-f16``: ``amax_scaler(measure=...)`` with the Linear layers marked:
  only the float16-path leaves set the amax.

for each seed (the seed picks the initial weights and the batch order), and
then the stress variants (``--stress-seeds``, by default the same seeds).
On the example's loss, which divides by a 2**18-token global batch:
``init2^24`` (every scaler starts at 2**24), ``high-lr`` (learning rate
1e-2, no warm-up: the example has none), ``accum8`` (8 micro-batches of 4
windows per step, ``accumulate_gradients``; the amax scaler with
``micro_batches=8``) and ``spike`` (the loss multiplied by 2**12 at one
step, mid-run).  The same four with ``-mean``: the plain per-batch mean as
the loss (``--global-batch-tokens 2048``, what a single-device loop
differentiates; gradients 128 times larger), for twice ``--steps``: there
the reactive scalers meet the overflow line.

``--grads float16`` trains the all-float16 model instead: the parameters
are cast to float16 before ``jax.grad``, so every gradient leaf is float16
(as in O3 or half-precision fine-tuning) and an overflow is a real inf that
skips the step.  They are copied into float32 before the scaler and Adam, as
master weights do.  Its runs are kept apart in the cache and the output.

Per run it records the loss, the scale, whether the step was skipped and the
step's amax (largest |gradient| of the parameters, unscaled, float32): the
amax traces give the step-to-step growth the margin must cover
(``amax_traces.json``).  Every ``--sample-every`` steps it measures
underflow two ways: in the run, the fraction of the float16 run's scaled
gradient entries that are exactly zero where the float32 gradient of the
same parameters and batch is not; and the scale's own, the fraction of the
float32 run's gradient entries that the float16 run's scale at that step
puts at or below 2**-25, where float16 rounds to zero.  It also counts the
applied steps whose scaled gradient amax on the float16-path leaves (the
Linear layers, ``FLOAT16_PATH``) passed 65504: the parameters and their
gradients are float32 here, so such a step is applied.

Output in ``--out-dir``: ``amax_study.md`` (the tables), ``amax_study.json``
(one record per run: what tools/figures.py publishes), ``amax_traces.json``
and ``amax_scaler.png`` (scale, amax and loss over steps, the first seed),
``amax_scaler_accum8-mean.png`` (the same for that variant); each run
is kept in ``runs/`` and reused by a later call (``--rerun amax`` trains
the amax runs again, after a change to the scaler).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import transformer_lm as lm

import jax_amp_scale as jas
from jax_amp_scale.optax import accumulate_gradients, get_loss_scaled_state, loss_scaled

SPIKE = 2.0**12  # the injected loss spike's factor


class Variant(NamedTuple):
    name: str
    init_scale: float | None = None  # None: each scaler's default for the example
    learning_rate: float = 2e-3
    accumulate: int = 1
    spike_step: int | None = None  # 0-based
    global_batch_tokens: int | None = None  # None: the example's 2**18
    steps: int | None = None  # None: --steps


class Run(NamedTuple):
    loss: np.ndarray
    scale: np.ndarray
    skipped: np.ndarray  # bool per step
    amax: np.ndarray  # unscaled float32 amax of the parameters' gradients per step
    amax_f16: np.ndarray  # the same over the float16-path leaves (FLOAT16_PATH) only
    eval_loss: float
    underflow: float  # mean sampled fraction after the first step (nan for float32)
    first_underflow: float  # the first step's fraction
    seconds: float
    # float32 runs only, per sampled step: how many nonzero gradient entries
    # have |g| <= 2**e for e in TINY_EXPONENTS, and (last column) how many are nonzero.
    tiny: np.ndarray


TINY_EXPONENTS = np.arange(-64, 1)


def sampled(i: int, every: int) -> bool:
    """Whether step i (0-based) is sampled for underflow: the first step, then
    every `every` steps from every // 2 (reported apart: the first, the rest)."""
    return bool(every) and (i == 0 or i % every == every // 2)


def objective_factor(cfg: lm.Config) -> np.float32:
    return np.float32(cfg.batch * cfg.context / cfg.global_batch_tokens)


def scaler_for(kind: str, v: Variant, cfg: lm.Config, params: Any = None) -> Any:
    if kind == "dynamic":
        init = cfg.init_scale if v.init_scale is None else v.init_scale
        return jas.dynamic_scaler(init, growth_interval=cfg.growth_interval)
    start = {} if v.init_scale is None else {"init_scale": v.init_scale}
    measure = None
    if kind == "amax-f16":  # the float16-path leaves only set the amax
        measure = jax.tree_util.tree_map_with_path(
            lambda k, _: on_float16_path(jax.tree_util.keystr(k)), params
        )
    return jas.amax_scaler(micro_batches=v.accumulate, measure=measure, **start)


# The leaves whose gradient a float16 matrix product computes (the Linear
# layers); the LayerNorm, embedding and position leaves stay float32 in this
# recipe, as under torch autocast, and cannot overflow float16.
FLOAT16_PATH = ("qkv", "proj", "fc", "out", "head")


def on_float16_path(name: str) -> bool:
    return any(f"'{m}'" in name or f".{m}." in name for m in FLOAT16_PATH)


def amax_of(tree: Any, float16_path_only: bool = False) -> jax.Array:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    keep = [g for k, g in flat if not float16_path_only or on_float16_path(jax.tree_util.keystr(k))]
    return jnp.max(jnp.stack([jnp.max(jnp.abs(g)) for g in keep]))


def tiny_counts(g32: Any) -> jax.Array:
    """int (len(TINY_EXPONENTS) + 1,): entries with |g| <= 2**e, then all of them.

    Only entries above 2**-24 times their leaf's largest count: below that a
    float32 gradient is rounding residue of a sum that is zero in exact
    arithmetic (the attention key bias's, for one: softmax ignores it)."""
    mags = []
    for g in jax.tree.leaves(g32):
        m = jnp.abs(g).reshape(-1)
        mags.append(jnp.where(m > jnp.max(m) * jnp.float32(2.0**-24), m, 0.0))
    flat = jnp.concatenate(mags)
    live = flat != 0
    bounds = jnp.ldexp(jnp.float32(1.0), jnp.asarray(TINY_EXPONENTS, jnp.int32))
    below = jnp.sum(live[None, :] & (flat[None, :] <= bounds[:, None]), axis=1)
    return jnp.concatenate([below, jnp.sum(live)[None]])


def scale_underflow(tiny: np.ndarray, scale: float) -> float:
    """The fraction of nonzero float32 entries that `scale` puts at or below
    2**-25, where float16 rounds them to 0 (`tiny`: one row of tiny_counts)."""
    e = int(np.floor(np.log2(scale)))  # the scalers' scales are powers of two
    idx = int(np.clip(-25 - e - TINY_EXPONENTS[0], 0, len(TINY_EXPONENTS) - 1))
    return float(tiny[idx] / tiny[-1])


def underflow_fraction(g16: Any, g32: Any) -> jax.Array:
    lost = sum(
        jnp.sum((a == 0) & (b != 0))
        for a, b in zip(jax.tree.leaves(g16), jax.tree.leaves(g32), strict=False)
    )
    live = sum(jnp.sum(b != 0) for b in jax.tree.leaves(g32))
    return lost / live


def to_float16(tree: Any) -> Any:
    return jax.tree.map(lambda x: x.astype(jnp.float16), tree)


def to_float32(tree: Any) -> Any:
    return jax.tree.map(lambda x: x.astype(jnp.float32), tree)


def train_jax(cfg: lm.Config, kind: str, v: Variant, data: np.ndarray, held_out: np.ndarray,
              sample_every: int, grads: str = "mixed") -> Run:  # fmt: skip
    dtype = jnp.float32 if kind == "float32" else jnp.float16
    # The all-float16 model differentiates float16 parameters: float16 gradients
    # (an overflow is an inf), copied into float32 for the scaler and the
    # optimizer, as master weights do (float16 Adam moments would underflow).
    all16 = grads == "float16" and kind != "float32"
    as_diffed, master = (to_float16, to_float32) if all16 else ((lambda t: t),) * 2
    graphdef, params = nnx.split(lm.make_model(cfg, dtype), nnx.Param)
    graph32, _ = nnx.split(lm.make_model(cfg, jnp.float32), nnx.Param)
    adam = optax.adam(v.learning_rate)
    tx = adam if kind == "float32" else loss_scaled(adam, scaler_for(kind, v, cfg, params))
    if v.accumulate > 1 and kind != "float32":
        tx = accumulate_gradients(tx, v.accumulate)
    opt_state = tx.init(params)
    factor = objective_factor(cfg)
    k = v.accumulate

    def scale_of(st: Any) -> jax.Array:
        return jnp.float32(1.0) if kind == "float32" else get_loss_scaled_state(st).scale

    def objective(p: Any, win: jax.Array, mult: jax.Array, gd: Any = graphdef) -> tuple:
        mean = jnp.mean(lm.token_losses(nnx.merge(gd, p), win))
        return mean * factor * mult, mean

    @jax.jit
    def step(p: Any, st: Any, win: jax.Array, spike: jax.Array) -> tuple:
        scale = scale_of(st)
        mults = spike * scale
        total, losses, amax, amax16 = None, [], jnp.float32(0), jnp.float32(0)
        for w in jnp.split(win, k):
            g, mean = jax.grad(objective, has_aux=True)(as_diffed(p), w, mults)
            g = master(g)
            losses.append(mean)
            amax = jnp.maximum(amax, amax_of(g))  # scaled units
            amax16 = jnp.maximum(amax16, amax_of(g, float16_path_only=True))
            if kind == "float32" and k > 1:
                total = g if total is None else jax.tree.map(jnp.add, total, g)
            else:
                u, st = tx.update(g, st, p)
                p = optax.apply_updates(p, u)
        if kind == "float32" and k > 1:
            u, st = tx.update(jax.tree.map(lambda t: t / k, total), st, p)
            p = optax.apply_updates(p, u)
        return p, st, jnp.mean(jnp.stack(losses)), scale, amax / scale, amax16 / scale

    @jax.jit
    def step32(p: Any, st: Any, win: jax.Array, spike: jax.Array) -> tuple:
        g, mean = jax.grad(objective, has_aux=True)(p, win, spike)
        u, st = tx.update(g, st, p)
        amax16 = amax_of(g, float16_path_only=True)
        return optax.apply_updates(p, u), st, mean, jnp.float32(1), amax_of(g), amax16

    @jax.jit
    def sample32(p: Any, win: jax.Array) -> jax.Array:
        return tiny_counts(jax.grad(lambda q: objective(q, win, jnp.float32(1), graph32)[0])(p))

    @jax.jit
    def sample(p: Any, win: jax.Array, scale: jax.Array) -> jax.Array:
        g16 = jax.grad(lambda q: objective(q, win, scale)[0])(as_diffed(p))
        g32 = jax.grad(lambda q: objective(q, win, jnp.float32(1), graph32)[0])(p)
        return underflow_fraction(g16, g32)

    run_step = step32 if (kind == "float32" and k == 1) else step
    starts = lm.batch_starts(len(data), cfg)
    out: dict[str, list] = {"loss": [], "scale": [], "amax": [], "amax_f16": [], "skipped": []}
    fractions, tiny = [], []
    t0 = time.perf_counter()
    for i in range(cfg.steps):
        win = lm.windows(data, starts[i], cfg.context)
        spike = jnp.float32(SPIKE if i == v.spike_step else 1.0)
        skipped_before = (
            None if kind == "float32" else get_loss_scaled_state(opt_state).skipped_steps
        )
        if kind != "float32" and sampled(i, sample_every):
            fractions.append(sample(params, win, scale_of(opt_state)))
        if kind == "float32" and sampled(i, sample_every):
            tiny.append(sample32(params, win))
        params, opt_state, loss, scale, amax, amax16 = run_step(params, opt_state, win, spike)
        out["loss"].append(loss)
        out["scale"].append(scale)
        out["amax"].append(amax)
        out["amax_f16"].append(amax16)
        if kind == "float32":
            out["skipped"].append(jnp.bool_(False))
        else:
            out["skipped"].append(get_loss_scaled_state(opt_state).skipped_steps > skipped_before)
    got = {key: np.asarray(jax.device_get(vals)) for key, vals in out.items()}
    return Run(
        got["loss"].astype(np.float32),
        got["scale"].astype(np.float32),
        got["skipped"].astype(bool),
        got["amax"].astype(np.float32),
        got["amax_f16"].astype(np.float32),
        lm.evaluate(cfg, graph32, params, held_out),
        float(np.mean(jax.device_get(fractions[1:]))) if fractions[1:] else float("nan"),
        float(jax.device_get(fractions[0])) if fractions else float("nan"),
        time.perf_counter() - t0,
        np.asarray(jax.device_get(tiny), np.int64).reshape(len(tiny), len(TINY_EXPONENTS) + 1),
    )


FLOOR_SCALES = [2.0**e for e in range(0, 25, 4)]


def floor_row(cfg: lm.Config, data: np.ndarray) -> list[float]:
    """The in-run underflow fraction at the first step's weights and batch, at each of FLOOR_SCALES."""
    graph16, params = nnx.split(lm.make_model(cfg, jnp.float16), nnx.Param)
    graph32, _ = nnx.split(lm.make_model(cfg, jnp.float32), nnx.Param)
    factor = objective_factor(cfg)

    def objective(p: Any, win: jax.Array, mult: jax.Array, gd: Any) -> jax.Array:
        return jnp.mean(lm.token_losses(nnx.merge(gd, p), win)) * factor * mult

    @jax.jit
    def fraction(p: Any, win: jax.Array, scale: jax.Array) -> jax.Array:
        g16 = jax.grad(objective)(p, win, scale, graph16)
        return underflow_fraction(g16, jax.grad(objective)(p, win, jnp.float32(1), graph32))

    win = lm.windows(data, lm.batch_starts(len(data), cfg)[0], cfg.context)
    return [float(fraction(params, win, jnp.float32(s))) for s in FLOOR_SCALES]


def floor_rows(cfg: lm.Config, data: np.ndarray) -> dict[str, list[float]]:
    """floor_row on the example's loss and on the plain mean: where the fraction
    stops falling, the zeros left are float16 arithmetic's, not the scale's."""
    return {
        label: floor_row(cfg._replace(global_batch_tokens=tokens), data)
        for label, tokens in (("example's", cfg.global_batch_tokens), ("plain mean", MEAN_TOKENS))
    }


def floor_table(rows: dict[str, list[float]]) -> str:
    head = ["loss", *(f"`2**{int(np.log2(s))}`" for s in FLOOR_SCALES)]
    return table([[label, *(f"{f:.1e}" for f in row)] for label, row in rows.items()], head)


def float32_only_share(r: Run) -> dict[str, float]:
    """How often, and by how much, the float32-only leaves (LayerNorm, embedding,
    position) set the step's amax above the float16-path leaves', over applied steps."""
    ok = ~r.skipped & np.isfinite(r.amax) & (r.amax_f16 > 0)
    gap = np.log2(r.amax[ok] / r.amax_f16[ok]) if ok.any() else np.zeros(0)
    return {
        "float32_only_sets_amax": float(np.mean(gap > 0)) if gap.size else float("nan"),
        "float32_only_gap_log2": float(np.max(gap, initial=0.0)),
    }


def records(results: dict[tuple[str, int, str], Run], stress: list[Variant],
            sample_every: int) -> list[dict[str, Any]]:  # fmt: skip
    """One plain record per run: the figures the tables and the docs show."""
    spikes = {v.name: v.spike_step for v in stress}
    out = []
    for (v, s, k), r in results.items():
        over16, top16 = over_line(r)
        over_all, top_all = over_line(r, float16_path_only=False)
        own, own_first = underflows(results, (v, s), k, sample_every)
        out.append({
            "variant": v, "seed": s, "kind": k, "steps": len(r.scale),
            "skipped": int(r.skipped.sum()), "skipped_at": np.flatnonzero(r.skipped).tolist(),
            "eval_loss": r.eval_loss, "underflow": r.underflow,
            "first_underflow": r.first_underflow, "scale_underflow": own,
            "first_scale_underflow": own_first,
            "mean_log2_scale": float(np.mean(np.log2(r.scale))),
            "past_65504_float16_path": over16, "largest_float16_path": top16,
            "past_65504_all_leaves": over_all, "largest_all_leaves": top_all,
            "growth_log2": growth(r.amax, r.skipped, spikes.get(v)),
            **float32_only_share(r),
            "seconds": r.seconds,
        })  # fmt: skip
    return out


def train_torch(cfg: lm.Config, v: Variant, data: np.ndarray, held_out: np.ndarray,
                sample_every: int) -> Run:  # fmt: skip
    import torch
    import torch.nn.functional as F
    import transformer_lm_torch as lmt

    torch.manual_seed(cfg.seed)
    model = lmt.torch_from_flax(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=v.learning_rate)
    init = cfg.init_scale if v.init_scale is None else v.init_scale
    scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_interval=cfg.growth_interval)
    factor = float(objective_factor(cfg))
    starts = lm.batch_starts(len(data), cfg)
    k = v.accumulate
    losses, scales, skipped, amaxes, amaxes16, fractions = [], [], [], [], [], []

    def xent(logits: Any, win: Any) -> Any:
        return F.cross_entropy(logits.reshape(-1, lm.VOCAB), win[:, 1:].reshape(-1))

    t0 = time.perf_counter()
    for i in range(cfg.steps):
        win = torch.from_numpy(lm.windows(data, starts[i], cfg.context)).long()
        spike = SPIKE if i == v.spike_step else 1.0
        scale = scaler.get_scale()
        if sampled(i, sample_every):
            model.zero_grad(set_to_none=True)
            xent(model(win[:, :-1]), win).mul(factor).backward()
            g32 = [p.grad.clone() for p in model.parameters()]
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                logits = model(win[:, :-1])
            scaler.scale(xent(logits, win) * factor).backward()
            lost = sum(
                int(((p.grad == 0) & (g != 0)).sum())
                for p, g in zip(model.parameters(), g32, strict=False)
            )
            fractions.append(lost / sum(int((g != 0).sum()) for g in g32))
        opt.zero_grad(set_to_none=True)
        mean_sum, amax, amax16 = 0.0, 0.0, 0.0
        for w in torch.chunk(win, k):
            before = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            with torch.autocast("cpu", dtype=torch.float16):
                logits = model(w[:, :-1])
            mean = xent(logits, w)
            mean_sum += mean.item()
            scaler.scale(mean * factor * spike / k).backward()
            # This micro-batch's own gradients (what its backward computed), as
            # the JAX runs record them: not the accumulated sum.
            for n, p in model.named_parameters():
                if p.grad is not None:
                    top = float((p.grad - before[n] if n in before else p.grad).abs().max())
                    amax = max(amax, top)
                    amax16 = max(amax16, top) if on_float16_path(f".{n}.") else amax16
        scaler.step(opt)
        scaler.update()
        losses.append(mean_sum / k)
        scales.append(scale)
        skipped.append(scaler.get_scale() < scale)
        amaxes.append(amax / scale)
        amaxes16.append(amax16 / scale)
    model.eval()
    ev = held_out
    win = torch.from_numpy(lm.windows(ev, lm.eval_starts(len(ev), cfg), cfg.context)).long()
    with torch.no_grad():
        evals = [float(xent(model(w[:, :-1]), w)) for w in torch.chunk(win, max(1, len(win) // 64))]
    return Run(
        np.asarray(losses, np.float32),
        np.asarray(scales, np.float32),
        np.asarray(skipped, bool),
        np.asarray(amaxes, np.float32),
        np.asarray(amaxes16, np.float32),
        float(np.mean(evals)),
        float(np.mean(fractions[1:])) if fractions[1:] else float("nan"),
        float(fractions[0]) if fractions else float("nan"),
        time.perf_counter() - t0,
        np.zeros((0, len(TINY_EXPONENTS) + 1), np.int64),
    )


def over_line(
    r: Run, largest: float = 65504.0, float16_path_only: bool = True
) -> tuple[int, float]:
    """Applied steps whose scaled amax (of the float16-path leaves, or of all)
    passed `largest`, and the largest scaled amax over `largest` among applied steps."""
    amax = r.amax_f16 if float16_path_only else r.amax
    ok = ~r.skipped & np.isfinite(amax)
    used = np.where(ok, amax * r.scale, 0.0) / largest
    return int(np.sum(used > 1)), float(np.max(used, initial=0.0))


def growth(amax: np.ndarray, skipped: np.ndarray, spike_step: int | None = None) -> float:
    """log2 of the largest step-to-step growth of the (unscaled) amax over applied
    steps, the injected spike's step left out (float32 applies it)."""
    keep = ~skipped & np.isfinite(amax) & (amax > 0)
    if spike_step is not None and spike_step < len(keep):
        keep[spike_step] = False
    a = amax[keep]
    if len(a) < 2:
        return float("nan")
    return float(np.max(np.log2(a[1:] / a[:-1])))


def plot(runs: dict[str, Run], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    for i, (name, r) in enumerate(runs.items()):
        steps = np.arange(1, len(r.loss) + 1)
        color = f"C{i}"  # one colour per scaler in every panel
        if name != "float32":
            axes[0].semilogy(steps, r.scale, label=name, color=color)
            axes[1].semilogy(steps, np.where(r.skipped, np.nan, r.amax * r.scale) / 65504.0,
                             label=name, color=color)  # fmt: skip
            bad = np.flatnonzero(r.skipped) + 1
            axes[0].plot(bad, r.scale[bad - 1], "x", color="k")
        axes[2].plot(steps, r.loss, label=name, lw=1, color=color)
    axes[0].set_ylabel("loss scale (x: skipped)")
    axes[1].set_ylabel("scaled amax / 65504")
    axes[1].axhline(2.0**-5, color="grey", ls=":", lw=1)  # the default margin
    axes[2].set_ylabel("training loss")
    axes[2].set_xlabel("step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--kinds", default="float32,dynamic,torch,amax,amax-f16")
    p.add_argument(
        "--grads",
        choices=["mixed", "float16"],
        default="mixed",
        help="mixed: float32 parameters (default); float16: the all-float16 model",
    )
    p.add_argument("--stress", default=",".join(STRESS), help="'' for none")
    p.add_argument("--stress-seeds", default=None, help="the stress variants' (default: --seeds)")
    p.add_argument("--stress-kinds", default=None, help="the stress variants' (default: --kinds)")
    p.add_argument("--sample-every", type=int, default=25)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64, help="the model's width (heads: 4)")
    p.add_argument("--learning-rate", type=float, default=2e-3,
                   help="the default runs' and the stress variants' (2e-3); high-lr keeps 1e-2")  # fmt: skip
    p.add_argument("--out-dir", type=Path, default=Path("examples/out"))
    p.add_argument("--plot", type=Path, default=None, help="where the PNG goes")
    p.add_argument("--json", type=Path, default=None, help="also write amax_study.json here")
    p.add_argument(
        "--rerun", default="", help="kinds to train again although --out-dir/runs has them"
    )
    args = p.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    kinds = [k for k in args.kinds.split(",") if k]
    stress_kinds = kinds if args.stress_kinds is None else args.stress_kinds.split(",")
    if args.grads == "float16" and "torch" in kinds + stress_kinds:
        p.error("--grads float16: the torch twin keeps float32 parameters; leave torch out")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    stress_seeds = (
        seeds if args.stress_seeds is None else [int(s) for s in args.stress_seeds.split(",")]
    )
    data, held_out = lm.load_corpus()
    base = lm.Config(steps=args.steps, layers=args.layers, d_model=args.d_model)
    variants = {v.name: v for v in stress_variants(args.steps, args.learning_rate)}
    stress = [variants[s] for s in args.stress.split(",") if s]

    rerun = {k for k in args.rerun.split(",") if k}
    default = Variant("default", learning_rate=args.learning_rate)
    lr = "" if args.learning_rate == 2e-3 else f"_lr{args.learning_rate:g}"
    cache = args.out_dir / "runs"
    cache.mkdir(exist_ok=True)

    def one(cfg: lm.Config, kind: str, v: Variant) -> Run:
        width = "" if cfg.d_model == lm.Config().d_model else f"_d{cfg.d_model}"
        width += "_g16" if args.grads == "float16" else ""
        width += lr if v.learning_rate == args.learning_rate else ""  # high-lr keeps its own
        path = cache / f"{v.name}_{cfg.seed}_{kind}_{cfg.steps}_{cfg.layers}{width}.npz"
        if path.exists() and kind not in rerun:
            z = np.load(path)
            if set(Run._fields) <= set(z.files):  # else written by an older study: train again
                return Run(*(z[f].item() if z[f].ndim == 0 else z[f] for f in Run._fields))
        r = compute(cfg, kind, v)
        np.savez(path, **r._asdict())
        return r

    def compute(cfg: lm.Config, kind: str, v: Variant) -> Run:
        if kind == "torch":
            r = train_torch(cfg, v, data, held_out, args.sample_every)
        else:
            r = train_jax(cfg, kind, v, data, held_out, args.sample_every, args.grads)
        print(f"  {v.name:>12} seed {cfg.seed} {kind:>8}: skipped {int(r.skipped.sum()):>2}, "
              f"eval {r.eval_loss:.4f}, underflow {r.underflow:.1e} (first step {r.first_underflow:.2f}), "
              f"amax growth log2 {growth(r.amax, r.skipped, v.spike_step):.2f}, {r.seconds:.0f} s", flush=True)  # fmt: skip
        return r

    results: dict[tuple[str, int, str], Run] = {}
    for seed in seeds:
        for kind in kinds:
            results[("default", seed, kind)] = one(base._replace(seed=seed), kind, default)
    for v in stress:
        for seed in stress_seeds:
            cfg = base._replace(seed=seed, steps=v.steps or args.steps)
            if v.global_batch_tokens is not None:
                cfg = cfg._replace(global_batch_tokens=v.global_batch_tokens)
            for kind in stress_kinds:
                results[(v.name, seed, kind)] = one(cfg, kind, v)

    settings = {
        "steps": args.steps,
        "seeds": seeds,
        "stress_seeds": stress_seeds,
        "stress_kinds": stress_kinds,
        "kinds": kinds,
        "layers": args.layers,
        "d_model": args.d_model,
        "grads": args.grads,
        "learning_rate": args.learning_rate,
        "sample_every": args.sample_every,
        "margin_default": 5,
    }
    runs = records(results, stress, args.sample_every)
    shown = published(runs, settings)
    floors = floor_rows(base._replace(seed=seeds[0]), data)
    text = report(shown) + (
        f"## In-run underflow at the first step's weights and batch (seed {seeds[0]}) "
        f"against the scale\n\n{floor_table(floors)}"
    )
    (args.out_dir / "amax_study.md").write_text(text)
    summary = {
        "settings": settings,
        "runs": runs,
        "floor": {"scales": FLOOR_SCALES, **floors},
        "figures": shown,
    }
    for path in [args.out_dir / "amax_study.json", *([args.json] if args.json else [])]:
        path.write_text(json.dumps(summary, indent=1))
    print(text)
    traces = {f"{v}/{s}/{k}": {"amax": r.amax.tolist(), "scale": r.scale.tolist(),
                              "skipped": r.skipped.tolist()} for (v, s, k), r in results.items()}  # fmt: skip
    (args.out_dir / "amax_traces.json").write_text(json.dumps(traces))
    picture = args.plot or args.out_dir / "amax_scaler.png"
    seed0 = {k: results[("default", seeds[0], k)] for k in kinds}
    if plot(seed0, picture, f"default settings, seed {seeds[0]}"):
        print(f"wrote {picture}")
    for v in stress:
        if v.name == PICTURED_STRESS:
            runs = {k: results[(v.name, stress_seeds[0], k)] for k in kinds}
            where = picture.with_name(picture.stem + "_" + v.name + picture.suffix)
            if plot(runs, where, f"{v.name}, seed {stress_seeds[0]}"):
                print(f"wrote {where}")
    return 0


# The plain per-batch mean (F.cross_entropy's default, what a single-device
# loop differentiates) has gradients 128 times the example's, which divides
# by a 2**18-token global batch: there the reactive scalers meet the overflow
# line within a few hundred steps.
MEAN_TOKENS = 2048
PICTURED_STRESS = "accum8-mean"  # drawn in a second picture


def stress_variants(steps: int, learning_rate: float = 2e-3) -> list[Variant]:
    mean = {"global_batch_tokens": MEAN_TOKENS, "steps": 2 * steps}
    lr = {"learning_rate": learning_rate}
    return [
        Variant("init2^24", init_scale=2.0**24, **lr),
        Variant("high-lr", learning_rate=1e-2),
        Variant("accum8", accumulate=8, **lr),
        Variant("spike", spike_step=steps // 2, **lr),
        Variant("init2^24-mean", init_scale=2.0**24, **mean, **lr),
        Variant("high-lr-mean", learning_rate=1e-2, **mean),
        Variant("accum8-mean", accumulate=8, **mean, **lr),
        Variant("spike-mean", spike_step=steps, **mean, **lr),
    ]


STRESS = [v.name for v in stress_variants(1)]


def underflows(results: dict[tuple[str, int, str], Run], key: tuple[str, int], kind: str,
               sample_every: int) -> tuple[float, float]:  # fmt: skip
    """The scale's own underflow for `kind`'s run: float32's gradients at the
    sampled steps, at the scales the run had there (after the first step, and
    the first step); nan without a float32 run."""
    ref = results.get((*key, "float32"))
    run = results[(*key, kind)]
    if ref is None or not len(ref.tiny):
        return float("nan"), float("nan")
    steps = [i for i in range(len(run.scale)) if sampled(i, sample_every)]
    f = [scale_underflow(ref.tiny[j], float(run.scale[i])) for j, i in enumerate(steps)]
    return (float(np.mean(f[1:])) if f[1:] else float("nan")), f[0]


def table(rows: list[list[str]], head: list[str]) -> str:
    """A markdown table, the cells as given."""
    return tabulate(rows, head, tablefmt="github", disable_numparse=True) + "\n"


# The per-run tables: title, the scalers left out (columns) and the cell of one run's record.
PER_RUN = {
    "first-step": (
        "The first step's in-run underflow",
        ("float32",),
        lambda r: f"{r['first_underflow']:.1e}",
    ),
    "underflow": (
        "Underflow, the scale's own: mean over the sampled steps after the first (the first step)",
        ("float32", "torch"),
        lambda r: f"{r['scale_underflow']:.0e} ({r['first_scale_underflow']:.0e})",
    ),
    "past-line": (
        "Applied steps past 65504 on the float16-path leaves (the largest / 65504)",
        ("float32",),
        lambda r: f"{r['past_65504_float16_path']} ({r['largest_float16_path']:.2f})",
    ),
    "growth": (
        "Largest step-to-step amax growth (log2) over applied steps",
        (),
        lambda r: f"{r['growth_log2']:.2f}",
    ),
    "scales": ("Mean log2 of the scale", ("float32",), lambda r: f"{r['mean_log2_scale']:.2f}"),
    "leaf-groups": (
        "Steps whose amax a float32-only leaf set (its largest lead, log2)",
        (),
        lambda r: f"{r['float32_only_sets_amax']:.0%} ({r['float32_only_gap_log2']:.2f})",
    ),
}


def published(runs: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, str]:
    """The figures and tables the docs show, by name, from the runs' records
    (tools/figures.py takes them from the results file as ``amax_study.NAME``)."""
    by = {(r["variant"], r["seed"], r["kind"]): r for r in runs}
    kinds = settings["kinds"]
    variants = sorted({r["variant"] for r in runs}, key=lambda v: (v != "default", v))

    def of(v: str, k: str) -> list[dict[str, Any]]:
        return sorted(
            (r for r in runs if (r["variant"], r["kind"]) == (v, k)), key=lambda r: r["seed"]
        )

    def skips(v: str, k: str) -> str:
        return ", ".join(str(r["skipped"]) for r in of(v, k))

    def gap(v: str, k: str) -> str:
        ref = {r["seed"]: r["eval_loss"] for r in of(v, "float32")}
        gaps = [r["eval_loss"] - ref[r["seed"]] for r in of(v, k) if r["seed"] in ref]
        return f"{np.mean(gaps):+.4f}" if gaps else "n/a"

    ev32 = [r["eval_loss"] for r in of("default", "float32")]  # none without float32's runs
    spread = f"{max(ev32) - min(ev32):.4f}" if ev32 else "n/a"
    out = {"default.seeds": str(len(settings["seeds"])), "default.spread": spread}
    out |= {f"{v}.{k}.skipped": skips(v, k) for v in variants for k in kinds if of(v, k)}
    for k in kinds:
        out[f"default.{k}.gap"] = gap("default", k)
        if first := [
            r["first_underflow"] for r in of("default", k) if not np.isnan(r["first_underflow"])
        ]:
            out[f"default.{k}.first_underflow"] = f"{max(first):.2%}"
    out["growth.max"] = f"{np.nanmax([r['growth_log2'] for r in runs]):.2f}"
    if led := [r for r in runs if not np.isnan(r.get("float32_only_sets_amax", np.nan))]:
        share = [r["float32_only_sets_amax"] for r in led]
        out["float32_only.share"] = f"{min(share):.0%}-{max(share):.0%}"
        out["float32_only.gap"] = f"{max(r['float32_only_gap_log2'] for r in led):.2f}"
    rows = [
        [
            k,
            skips("default", k),
            ", ".join(f"{r['eval_loss']:.4f}" for r in of("default", k)),
            gap("default", k),
        ]
        for k in kinds
    ]
    head = ["scaler", "skipped steps per seed", "eval loss per seed", "mean gap to float32"]
    out["default"] = (
        table(rows, head) + f"\nfloat32's own spread over the seeds: {out['default.spread']}.\n"
    )
    f16 = [k for k in kinds if k != "float32"]
    if stress := variants[1:]:
        rows = [
            [
                v,
                str(of(v, f16[0])[0]["steps"]),
                *(f"{skips(v, k)} ({gap(v, k)})" if of(v, k) else "" for k in f16),
            ]
            for v in stress
        ]
        seeds = ", ".join(map(str, settings["stress_seeds"]))
        out["stress"] = table(rows, ["variant", "steps", *f16]) + (
            f"\nSkipped steps per seed ({seeds}), and the mean eval-loss gap to float32.\n"
        )
    keys = sorted(
        {(r["variant"], r["seed"]) for r in runs}, key=lambda vs: (vs[0] != "default", vs)
    )
    for name, (_, left_out, cell) in PER_RUN.items():
        cols = [k for k in kinds if k not in left_out]
        rows = [
            [f"{v}, seed {s}", *(cell(by[v, s, k]) if (v, s, k) in by else "" for k in cols)]
            for v, s in keys
        ]
        out[name] = table(rows, ["run", *cols])
    return out


def report(shown: dict[str, str]) -> str:
    """The study's tables, as ``amax_study.md`` has them."""
    titles = {"default": "Default settings", "stress": "Stress variants"}
    titles |= {name: title for name, (title, *_) in PER_RUN.items()}
    return "".join(f"## {t}\n\n{shown[n]}\n" for n, t in titles.items() if n in shown)


if __name__ == "__main__":
    sys.exit(main())
