"""The transformer of ``transformer_lm.py`` in torch, next to the JAX runs, step by step.

    python examples/transformer_lm_torch.py [--steps 100]

The torch model is the same network written with ``torch.nn`` and started
from the same weights: the flax NNX model's initial parameters are copied
into it (kernels transposed).  Both train on the same batches in the same
order with adam, in two modes:

- float32 in both;
- float16: JAX computes the matrix products in float16 (``dtype=float16``)
  with ``jax_amp_scale.optax.loss_scaled`` and a dynamic scaler; torch runs
  under ``torch.autocast("cpu", dtype=torch.float16)`` (supported on CPU by
  torch 2.x) with ``torch.amp.GradScaler("cpu")`` and the same initial scale
  and growth interval.  In both the parameters, the LayerNorms, the softmax
  and the loss stay float32, and the residual stream is float32.

The per-step training losses are compared, and the loss scale of every step:

- float32: ``|loss_jax - loss_torch| <= --tol32`` (default 5e-4) at every step;
- float16: ``|loss_jax - loss_torch| <= --tol16`` (default 5e-3) at every
  step, and the same scale at every step (same growths, same overflow skips).

The two frameworks round differently (summation order in the matrix
products, fused bias adds, the float16 GELU), so the losses are not equal
bit for bit.  ``--json PATH`` writes the largest and mean
differences, the tolerances and the scales (``tools/figures.py record
transformer_lm_torch`` keeps them in ``results/transformer_lm_torch.json``,
which examples/README.md shows).  Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import transformer_lm as lm


class Block(nn.Module):
    def __init__(self, cfg: lm.Config):
        super().__init__()
        d = cfg.d_model
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        hd = d // self.heads
        qkv = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, hd)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * (1 / math.sqrt(hd))
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        s = s.float().masked_fill(~causal, -1e9)  # softmax in float32
        p = torch.softmax(s, dim=-1).to(q.dtype)
        a = torch.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, t, d)
        x = x + self.proj(a)  # float32 residual stream
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TransformerLM(nn.Module):
    def __init__(self, cfg: lm.Config):
        super().__init__()
        self.embed = nn.Embedding(lm.VOCAB, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(cfg.context, cfg.d_model))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=1e-5)
        self.head = nn.Linear(cfg.d_model, lm.VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)).float()


def torch_from_flax(cfg: lm.Config) -> TransformerLM:
    """The torch model holding the flax model's initial weights (kernels transposed)."""
    jm = lm.make_model(cfg)
    tm = TransformerLM(cfg)
    t = lambda a, transpose=False: torch.from_numpy(np.array(a.T if transpose else a))  # noqa: E731

    def linear(dst: nn.Linear, src: Any) -> None:
        dst.weight.data = t(src.kernel[...], transpose=True)
        if dst.bias is not None:
            dst.bias.data = t(src.bias[...])

    def norm(dst: nn.LayerNorm, src: Any) -> None:
        dst.weight.data, dst.bias.data = t(src.scale[...]), t(src.bias[...])

    tm.embed.weight.data = t(jm.embed.embedding[...])
    tm.pos.data = t(jm.pos[...])
    for tb, jb in zip(tm.blocks, jm.blocks, strict=False):
        norm(tb.ln1, jb.ln1)
        norm(tb.ln2, jb.ln2)
        for name in ("qkv", "proj", "fc", "out"):
            linear(getattr(tb, name), getattr(jb, name))
    norm(tm.ln_f, jm.ln_f)
    linear(tm.head, jm.head)
    return tm


def train_torch(cfg: lm.Config, float16: bool, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-step (loss, scale) of the torch run; the same batches as the JAX runs."""
    torch.manual_seed(cfg.seed)
    model = torch_from_flax(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=cfg.init_scale, growth_interval=cfg.growth_interval, enabled=float16
    )
    factor = cfg.batch * cfg.context / cfg.global_batch_tokens  # as in transformer_lm.py
    starts = lm.batch_starts(len(data), cfg)
    losses, scales = [], []
    for i in range(cfg.steps):
        win = torch.from_numpy(lm.windows(data, starts[i], cfg.context)).long()
        with torch.autocast("cpu", dtype=torch.float16, enabled=float16):
            logits = model(win[:, :-1])
        mean = F.cross_entropy(logits.reshape(-1, lm.VOCAB), win[:, 1:].reshape(-1))
        scales.append(scaler.get_scale() if float16 else 1.0)
        opt.zero_grad(set_to_none=True)
        scaler.scale(mean * factor).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(mean.item())
    return np.asarray(losses, np.float32), np.asarray(scales, np.float32)


def power(x: float) -> str:
    return f"`2**{math.log2(x):.0f}`" if math.log2(x).is_integer() else f"{x:g}"


def shown(record: dict[str, Any]) -> dict[str, str]:
    """What the docs show of the comparison."""
    out = {"steps": str(record["steps"]), "torch": record["torch"].split("+")[0]}
    for mode, short in (("float32", "f32"), ("float16+scaling", "f16")):
        out[f"{short}.max_diff"] = f"{record['modes'][mode]['max_diff']:.1e}"
        out[f"{short}.tolerance"] = f"{record['modes'][mode]['tolerance']:g}"
    m = record["modes"]["float16+scaling"]
    changes = ", ".join(f"to {power(v)} at step {s}" for s, v in m["scale_changes"])
    same = "the same at every step" if m["scales_equal"] else "different"
    changing = f", changing {changes})" if changes else ", never changing)"
    return out | {"scales": f"{same} ({power(m['first_scale'])}{changing}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--tol32", type=float, default=5e-4)
    p.add_argument("--tol16", type=float, default=5e-3)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--json", type=Path, default=None, help="where the figures go")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = lm.Config(steps=args.steps)
    data, held_out = lm.load_corpus()
    ok = True
    record: dict[str, Any] = {"steps": cfg.steps, "torch": torch.__version__, "modes": {}}
    for jax_mode, float16, tol in (
        ("float32", False, args.tol32),
        ("float16+scaling", True, args.tol16),
    ):
        t0 = time.perf_counter()
        j = lm.train(cfg, jax_mode, data, held_out)
        t1 = time.perf_counter()
        t_loss, t_scale = train_torch(cfg, float16, data)
        t2 = time.perf_counter()
        diff = np.abs(j.loss - t_loss)
        worst = int(np.argmax(diff))
        scales_equal = bool(np.array_equal(j.scale, t_scale))
        passed = bool(diff.max() <= tol) and scales_equal
        ok &= passed
        grew = np.flatnonzero(np.diff(t_scale) != 0) + 2  # 1-based steps where it changed
        record["modes"][jax_mode] = {
            "max_diff": float(diff.max()), "at_step": worst + 1, "mean_diff": float(diff.mean()),
            "tolerance": tol, "scales_equal": scales_equal, "first_scale": float(t_scale[0]),
            "scale_changes": [[int(s), float(t_scale[s - 1])] for s in grew], "passed": passed,
        }  # fmt: skip
        print(
            f"{jax_mode} (JAX {t1 - t0:.1f} s, torch {t2 - t1:.1f} s): "
            f"max |loss_jax - loss_torch| = {diff.max():.2e} at step {worst + 1} "
            f"(tolerance {tol:g}); mean {diff.mean():.2e}; "
            f"final loss JAX {j.loss[-1]:.4f} torch {t_loss[-1]:.4f}; "
            f"scales {'equal at every step' if scales_equal else 'DIFFER'}"
            + (
                f" (JAX {sorted(set(j.scale.tolist()))}, torch {sorted(set(t_scale.tolist()))})"
                if float16
                else ""
            )
            + f": {'ok' if passed else 'FAILED'}",
            flush=True,
        )
        for s in lm.table_steps(cfg.steps):
            print(
                f"    step {s:>4}: JAX {j.loss[s - 1]:.4f}  torch {t_loss[s - 1]:.4f}  "
                f"diff {diff[s - 1]:.2e}"
            )
    print("all checks passed" if ok else "a check FAILED")
    record["figures"] = shown(record)  # tools/figures.py: transformer_lm_torch.NAME
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
