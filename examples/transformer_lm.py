"""A byte-level transformer language model in flax NNX, trained in four precisions.

    python examples/transformer_lm.py [--steps 300] [--out-dir examples/out]

The corpus is the Python standard library's own source: the top-level ``*.py``
files of ``sysconfig.get_paths()["stdlib"]``, sorted by name; every tenth file
is held out for evaluation (nothing is downloaded; the exact bytes depend on
the Python version, the selection does not).  The model is a small GPT: byte
embeddings and learned positions, ``--layers`` pre-LayerNorm blocks (causal
self-attention, a GELU MLP), a final LayerNorm and a linear head.  It is
trained four times from the same initial weights on the same batches, in the
same order, with the same optimizer (adam):

- ``float32``: everything in float32;
- ``float16+scaling``: the matrix products in float16 (flax's
  ``dtype=float16``; parameters, LayerNorm, softmax and loss stay float32, as
  under torch's CPU autocast), with ``jax_amp_scale.optax.loss_scaled`` and a
  dynamic scaler;
- ``float16``: the same float16 compute, without loss scaling;
- ``bfloat16``: the matrix products in bfloat16, without loss scaling.

How small the gradients are, and why float16 needs scaling here.  The loss
the gradients are taken of is the sum of the per-token cross-entropies of
this batch divided by ``--global-batch-tokens`` (default 2**18 = 262,144),
not by the 2,048 tokens of this batch: that is the backward pass one device
runs in a jitted data-parallel step whose global batch holds 2**18 tokens
(``jnp.mean`` over a global batch sharded over 128 devices), the regime of
real language-model training.  Adam is invariant to a constant factor on the
loss (up to its ``eps``), so float32 and bfloat16 train as they would with
the plain mean; float16, whose smallest subnormal is 6e-8, loses a large
part of the gradients (the logits' gradients are about (p - y) / 2**18) to
underflow unless the loss is scaled.  The reported losses are per-token means.

What it measured, and the same with the plain mean (``--global-batch-tokens
2048``, gradients 128 times larger, where this small model does not need
scaling), is in examples/README.md, from ``results/transformer_lm.json``
and ``results/transformer_lm_mean.json``: the gap there is the one a device
sees in a large data-parallel step, not something this model suffers at
batch 32.

Output, in ``--out-dir``: ``transformer_lm.png`` (training loss of the four
runs and the loss scale) and ``transformer_lm.md`` (training loss averaged
over the ten steps up to fixed steps, the final evaluation loss on held-out
files, computed in float32 from each run's float32 parameters, and the share
of gradient entries that are zero at initialisation).  ``--check`` exits non-zero unless float16 with scaling
ends within ``--track-tol`` of float32's evaluation loss and float16 without
scaling ends at least ``--behind-min`` above it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stdlib_corpus
from stdlib_corpus import corpus_files, load_corpus

import jax_amp_scale as jas
from jax_amp_scale.optax import loss_scaled

VOCAB = 256  # bytes
MODES = ("float32", "float16+scaling", "float16", "bfloat16")
COMPUTE_DTYPE = {
    "float32": jnp.float32,
    "float16+scaling": jnp.float16,
    "float16": jnp.float16,
    "bfloat16": jnp.bfloat16,
}


class Config(NamedTuple):
    """Model and training settings (the command-line flags)."""

    layers: int = 2
    d_model: int = 64
    heads: int = 4
    context: int = 64
    batch: int = 32
    steps: int = 300
    learning_rate: float = 2e-3
    global_batch_tokens: int = 2**18
    init_scale: float = 2.0**15
    growth_interval: int = 50
    eval_windows: int = 256
    seed: int = 0


# ---------------------------------------------------------------- the corpus


def batch_starts(n_bytes: int, cfg: Config) -> np.ndarray:
    """Window starts (steps, batch): the same data order for every run."""
    rng = np.random.default_rng(cfg.seed)
    return rng.integers(0, n_bytes - cfg.context - 1, size=(cfg.steps, cfg.batch))


def windows(data: np.ndarray, starts: np.ndarray, context: int) -> np.ndarray:
    """(len(starts), context + 1) int32 windows: inputs and next-byte targets."""
    return stdlib_corpus.windows(data, starts, context + 1)


def eval_starts(n_bytes: int, cfg: Config) -> np.ndarray:
    return np.linspace(0, n_bytes - cfg.context - 2, cfg.eval_windows).astype(np.int64)


# ----------------------------------------------------------------- the model

# A tap sees the model's named points, tap(name, x, dtype) -> x.astype(dtype):
# every cast between float32 and the compute dtype and a few identities
# (dtype == x.dtype).  examples/overflow_first.py passes one that records the
# backward pass there; the default is the cast itself.
Tap = Callable[[str, jax.Array, Any], jax.Array]


def cast(name: str, x: jax.Array, dtype: Any) -> jax.Array:
    """The default tap: the cast, nothing else."""
    return x.astype(dtype)


class Block(nnx.Module):
    """Pre-LayerNorm block: causal self-attention then a GELU MLP."""

    def __init__(self, cfg: Config, dtype: Any, *, rngs: nnx.Rngs):
        d = cfg.d_model
        init = nnx.initializers.normal(0.02)
        # GPT-2's residual projections: std 0.02 / sqrt(2 * layers).
        init_out = nnx.initializers.normal(0.02 / math.sqrt(2 * cfg.layers))
        lin = dict(dtype=dtype, bias_init=nnx.initializers.zeros, rngs=rngs)
        self.heads = cfg.heads
        self.dtype = dtype
        self.ln1 = nnx.LayerNorm(d, epsilon=1e-5, rngs=rngs)
        self.qkv = nnx.Linear(d, 3 * d, kernel_init=init, **lin)
        self.proj = nnx.Linear(d, d, kernel_init=init_out, **lin)
        self.ln2 = nnx.LayerNorm(d, epsilon=1e-5, rngs=rngs)
        self.fc = nnx.Linear(d, 4 * d, kernel_init=init, **lin)
        self.out = nnx.Linear(4 * d, d, kernel_init=init_out, **lin)

    def __call__(self, x: jax.Array, tap: Tap = cast) -> jax.Array:
        b, t, d = x.shape
        hd = d // self.heads
        dt = self.dtype
        qkv = tap("qkv", self.qkv(tap("attn_in", self.ln1(x), dt)), dt)
        qkv = qkv.reshape(b, t, 3, self.heads, hd)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * jnp.asarray(1 / math.sqrt(hd), q.dtype)
        causal = jnp.tril(jnp.ones((t, t), bool))
        s = jnp.where(causal, tap("scores", s, jnp.float32), -1e9)  # softmax in float32
        p = tap("probs", jax.nn.softmax(s, axis=-1), dt)
        a = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, t, d)
        # float32 residual stream (float32 + float16 -> float32)
        x = x + tap("attn_out", self.proj(tap("attn", a, dt)), x.dtype)
        fc = tap("fc", self.fc(tap("mlp_in", self.ln2(x), dt)), dt)
        h = tap("gelu", jax.nn.gelu(fc, approximate=False), dt)
        return x + tap("mlp_out", self.out(h), x.dtype)


class TransformerLM(nnx.Module):
    """A small GPT over bytes; matrix products in `dtype`, the rest float32."""

    def __init__(self, cfg: Config, dtype: Any = jnp.float32, *, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.02)
        self.dtype = dtype
        self.embed = nnx.Embed(VOCAB, cfg.d_model, embedding_init=init, rngs=rngs)
        self.pos = nnx.Param(init(rngs.params(), (cfg.context, cfg.d_model), jnp.float32))
        self.blocks = nnx.List([Block(cfg, dtype, rngs=rngs) for _ in range(cfg.layers)])
        self.ln_f = nnx.LayerNorm(cfg.d_model, epsilon=1e-5, rngs=rngs)
        self.head = nnx.Linear(
            cfg.d_model, VOCAB, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs
        )

    def __call__(self, tokens: jax.Array, tap: Tap = cast) -> jax.Array:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        x = tap("embed", x, x.dtype)
        for i, block in enumerate(self.blocks):

            def tap_i(name: str, y: jax.Array, dtype: Any, i: int = i) -> jax.Array:
                return tap(f"block{i}.{name}", y, dtype)

            x = tap(f"block{i}", block(x, tap_i), x.dtype)
        logits = self.head(tap("head_in", self.ln_f(x), self.dtype))
        return tap("logits", logits, jnp.float32)  # logits, float32


def make_model(cfg: Config, dtype: Any = jnp.float32) -> TransformerLM:
    """The model; the same initial parameters for every `dtype` (seeded by cfg.seed)."""
    return TransformerLM(cfg, dtype, rngs=nnx.Rngs(cfg.seed))


def token_losses(model: TransformerLM, win: jax.Array, tap: Tap = cast) -> jax.Array:
    """Per-token cross-entropy (batch, context), float32."""
    logits = model(win[:, :-1], tap)
    return optax.softmax_cross_entropy_with_integer_labels(logits, win[:, 1:])


# -------------------------------------------------------------- the training


class RunResult(NamedTuple):
    loss: np.ndarray  # (steps,) per-token mean training loss
    scale: np.ndarray  # (steps,) the loss scale used (1 without scaling)
    eval_loss: float
    params: Any
    seconds: float  # the whole run, compilation included
    step_ms: float  # per step after the first tenth of the run (no compilation)


def make_optimizer(cfg: Config, mode: str) -> optax.GradientTransformation:
    adam = optax.adam(cfg.learning_rate)
    if mode == "float16+scaling":
        scaler = jas.dynamic_scaler(cfg.init_scale, growth_interval=cfg.growth_interval)
        return loss_scaled(adam, scaler)
    return adam


def current_scale(opt_state: Any) -> jax.Array:
    """The loss scale in `opt_state` (1.0 for a plain optimizer)."""
    try:
        return jas.find_scale_state(opt_state).scale
    except (ValueError, TypeError):
        return jnp.float32(1.0)


def train(cfg: Config, mode: str, data: np.ndarray, held_out: np.ndarray) -> RunResult:
    """Trains one mode; the data order and the initial parameters are the same for all."""
    model = make_model(cfg, COMPUTE_DTYPE[mode])
    graphdef, params = nnx.split(model, nnx.Param)
    tx = make_optimizer(cfg, mode)
    opt_state = tx.init(params)
    scaled = mode == "float16+scaling"
    # Sum over this batch's tokens / the global batch's token count (module docstring).
    factor = np.float32(cfg.batch * cfg.context / cfg.global_batch_tokens)

    def loss_fn(p: Any, win: jax.Array, opt_state: Any) -> tuple[jax.Array, jax.Array]:
        mean = jnp.mean(token_losses(nnx.merge(graphdef, p), win))
        objective = mean * factor
        if scaled:
            objective = jas.scale_loss(objective, opt_state)
        return objective, mean

    @jax.jit
    def step(p: Any, opt_state: Any, win: jax.Array) -> tuple[Any, Any, jax.Array, jax.Array]:
        grads, mean = jax.grad(loss_fn, has_aux=True)(p, win, opt_state)
        scale = current_scale(opt_state)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, mean, scale

    starts = batch_starts(len(data), cfg)
    losses, scales = [], []
    warm = cfg.steps // 10  # the steps after this one are timed per step
    t0 = t_warm = time.perf_counter()
    for i in range(cfg.steps):
        params, opt_state, loss, scale = step(
            params, opt_state, windows(data, starts[i], cfg.context)
        )
        losses.append(loss)
        scales.append(scale)
        if i == warm:
            jax.block_until_ready(loss)
            t_warm = time.perf_counter()
    losses_np = np.asarray(jax.device_get(losses), np.float32)
    t_end = time.perf_counter()
    timed = cfg.steps - 1 - warm
    return RunResult(
        losses_np,
        np.asarray(jax.device_get(scales), np.float32),
        evaluate(cfg, graphdef, params, held_out),
        params,
        t_end - t0,
        1e3 * (t_end - t_warm) / timed if timed > 0 else float("nan"),
    )


def evaluate(cfg: Config, graphdef: Any, params: Any, held_out: np.ndarray) -> float:
    """Mean per-token loss on fixed held-out windows, in float32 (any run's parameters)."""
    model32 = make_model(cfg, jnp.float32)
    graphdef32, _ = nnx.split(model32, nnx.Param)
    win = windows(held_out, eval_starts(len(held_out), cfg), cfg.context)
    fn = jax.jit(lambda p, w: jnp.mean(token_losses(nnx.merge(graphdef32, p), w)))
    return float(np.mean([fn(params, w) for w in np.array_split(win, max(1, len(win) // 64))]))


def underflow_report(cfg: Config, data: np.ndarray, modes: Sequence[str]) -> dict[str, float]:
    """Fraction of gradient entries that are exactly 0 at initialisation, per mode.

    Taken on the first batch, of the objective each mode differentiates
    (scaled by the initial loss scale for float16+scaling).
    """
    win = windows(data, batch_starts(len(data), cfg)[0], cfg.context)
    factor = np.float32(cfg.batch * cfg.context / cfg.global_batch_tokens)
    out = {}
    for mode in modes:
        graphdef, params = nnx.split(make_model(cfg, COMPUTE_DTYPE[mode]), nnx.Param)
        mult = factor * (cfg.init_scale if mode == "float16+scaling" else 1.0)

        def f(p: Any, graphdef: Any = graphdef, mult: float = mult) -> jax.Array:
            return jnp.mean(token_losses(nnx.merge(graphdef, p), win)) * mult

        grads = jax.jit(jax.grad(f))(params)
        leaves = [np.asarray(g) for g in jax.tree.leaves(grads)]
        zeros = sum(int(np.sum(g == 0)) for g in leaves)
        out[mode] = zeros / sum(g.size for g in leaves)
    return out


# ------------------------------------------------------------------ reporting


def table_steps(steps: int) -> list[int]:
    """The steps (1-based) the table reports: about six, always the last."""
    every = max(1, steps // 6)
    marks = list(range(every, steps, every))
    return [*marks[:5], steps]


def smoothed(loss: np.ndarray, step: int) -> float:
    """Mean training loss over the ten steps up to `step` (1-based)."""
    return float(np.mean(loss[max(0, step - 10) : step]))


def figures_of(results: dict[str, RunResult], zeros: dict[str, float], cfg: Config) -> dict:
    """The table's figures as plain numbers, and as the docs show them (``--json``)."""
    marks = table_steps(len(next(iter(results.values())).loss))
    shown = {"table": table(results, zeros)}
    for mode, r in results.items():
        shown[f"{mode}.eval_loss"] = f"{r.eval_loss:.4f}"
        shown[f"{mode}.zeros"] = f"{100 * zeros[mode]:.1f}%"
        if "float32" in results:
            shown[f"{mode}.gap"] = f"{r.eval_loss - results['float32'].eval_loss:+.4f}"
    return {
        "config": cfg._asdict(),
        "modes": {
            mode: {
                "smoothed_loss": {str(m): float(smoothed(r.loss, m)) for m in marks},
                "eval_loss": float(r.eval_loss),
                "grad_zeros_at_init": float(zeros[mode]),
                "final_scale": float(r.scale[-1]) if len(r.scale) else None,
                "seconds": r.seconds,
            }
            for mode, r in results.items()
        },
        "figures": shown,  # tools/figures.py: transformer_lm.NAME
    }


def table(results: dict[str, RunResult], zeros: dict[str, float]) -> str:
    """Smoothed training loss at fixed steps, the evaluation loss and the zeros at init."""
    marks = table_steps(len(next(iter(results.values())).loss))
    rows = [
        [
            mode,
            *(f"{smoothed(r.loss, m):.4f}" for m in marks),
            f"{r.eval_loss:.4f}",
            f"{100 * zeros[mode]:.1f}%",
        ]
        for mode, r in results.items()
    ]
    head = ["mode", *(f"step {m}" for m in marks), "eval loss", "zeros at init"]
    return tabulate(rows, head, tablefmt="github", disable_numparse=True) + "\n"


def plot(results: dict[str, RunResult], cfg: Config, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return False
    fig, (ax, ax_s) = plt.subplots(
        2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    steps = np.arange(1, cfg.steps + 1)
    width = min(10, cfg.steps)
    kernel = np.ones(width) / width
    style = {"float32": ("-", 3.0), "float16+scaling": ("--", 1.5), "float16": ("-", 1.5)}
    for mode, r in results.items():
        smooth = np.convolve(r.loss, kernel, mode="valid")
        ls, lw = style.get(mode, (":", 2.0))  # overlapping curves stay visible
        ax.plot(steps[width - 1 :], smooth, ls, lw=lw, label=f"{mode} (eval {r.eval_loss:.3f})")
    ax.set_ylabel("training loss (10-step mean)")
    ax.set_title(
        f"byte-level transformer on the stdlib's sources "
        f"({cfg.layers} layers, d={cfg.d_model}, context {cfg.context})"
    )
    ax.legend()
    ax.grid(alpha=0.3)
    ax_s.semilogy(steps, results["float16+scaling"].scale, color="C1")
    ax_s.set_ylabel("loss scale")
    ax_s.set_xlabel("step")
    ax_s.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    d = Config()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    for field in Config._fields:
        p.add_argument(
            f"--{field.replace('_', '-')}", type=type(getattr(d, field)), default=getattr(d, field)
        )
    p.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES)
    )
    p.add_argument("--out-dir", type=Path, default=Path("examples/out"))
    p.add_argument("--check", action="store_true", help="exit 1 unless the claim holds")
    p.add_argument(
        "--track-tol", type=float, default=0.05, help="|eval(fp16+scaling) - eval(fp32)| at most"
    )
    p.add_argument("--behind-min", type=float, default=0.1, help="eval(fp16) - eval(fp32) at least")
    p.add_argument("--json", type=Path, help="also write the table's figures to this JSON file")
    args = p.parse_args(argv)
    cfg = Config(**{f: getattr(args, f) for f in Config._fields})
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        p.error(f"unknown modes {sorted(unknown)}")
    args.out_dir.mkdir(parents=True, exist_ok=True)

    data, held_out = load_corpus()
    print(
        f"corpus: {len(data):,} training bytes, {len(held_out):,} held-out bytes "
        f"from {len(corpus_files())} files of {sysconfig.get_paths()['stdlib']}"
    )
    zeros = underflow_report(cfg, data, modes)
    results = {}
    for mode in modes:
        results[mode] = r = train(cfg, mode, data, held_out)
        print(
            f"{mode:>16}: final train loss {smoothed(r.loss, cfg.steps):.4f}, "
            f"eval loss {r.eval_loss:.4f}, {r.seconds:.1f} s ({r.step_ms:.1f} ms/step)",
            flush=True,
        )
    print(text := table(results, zeros), end="")
    (args.out_dir / "transformer_lm.md").write_text(text)
    if args.json:
        args.json.write_text(json.dumps(figures_of(results, zeros, cfg), indent=1) + "\n")
    if "float16+scaling" in results and plot(results, cfg, args.out_dir / "transformer_lm.png"):
        print(f"wrote {args.out_dir / 'transformer_lm.png'}")

    if {"float32", "float16+scaling", "float16"} <= set(results):
        ref = results["float32"].eval_loss
        gap_scaled = results["float16+scaling"].eval_loss - ref
        gap_plain = results["float16"].eval_loss - ref
        tracks = abs(gap_scaled) <= args.track_tol
        behind = gap_plain >= args.behind_min
        print(
            f"float16 with loss scaling {'tracks' if tracks else 'does NOT track'} float32: "
            f"eval loss {gap_scaled:+.4f} (tolerance {args.track_tol})"
        )
        print(
            f"float16 without scaling {'falls behind' if behind else 'does NOT fall behind'}: "
            f"eval loss {gap_plain:+.4f} (at least {args.behind_min} expected)"
        )
        if args.check and not (tracks and behind):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
